"""The papers' figures as PNG files, from traces (`trace=true` runs) and rows.

Figures are drawn on `matplotlib.figure.Figure` objects with an Agg canvas, not through pyplot, so importing this
module changes no global backend (a notebook keeps its own). `make_figures` draws per comparable group of runs
(`selection.groups`) and per pair and dataset, titled "pair · dataset · decode"; a legend names each run only by the
keys that differ between the runs drawn together (`selection.labels`) and sits outside the axes.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from specbench.analysis import baselines, gammatune_tables, load, selection, tables
from specbench.analysis.selection import ReportError, labels, slug, unique_labels
from specbench.analysis.per_position import drafting
from specbench.common.files import atomic_path

log = logging.getLogger(__name__)

MAX_LINES = 10  # examples drawn in per-example line plots
NO_TRACES = "no run has traces: no trace figures (rerun with trace=true to draw them)"


def _figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (7.0, 4.0)) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=size, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()


def _save(fig: Figure, path: str | Path, title: str | None = None, legend: Any = None, fontsize: float = 7) -> Path:
    """fig as a PNG file at path, titled, with the legend of the axes `legend` outside every axes at the figure's
    right (constrained layout makes room): never over data."""
    if legend is not None:
        fig.legend(*legend.get_legend_handles_labels(), loc="outside right upper", fontsize=fontsize)
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def token_stats(traces: pd.DataFrame) -> pd.DataFrame:
    """One row per judged draft: label, id, iteration, position i (1-based), entropy, js, accepted (i <= n). A draft
    is accepted if it lies before the iteration's first rejection, rejected if it is that first rejection; drafts
    after it were never judged and are left out (AdaSD Algorithm 1's lists L_D^A, L_D^R)."""
    recs = []
    for r in traces.itertuples(index=False):
        if r.js is None or r.drafted == 0:
            continue
        for i in range(min(r.accepted + 1, r.drafted)):  # accepted drafts and the first rejected one
            recs.append({"run_dir": r.run_dir, "label": r.label, "id": r.id, "iteration": r.iteration,
                         "position": i + 1, "entropy": float(r.entropy[i]), "js": float(r.js[i]),
                         "accepted": i < r.accepted})
    return pd.DataFrame(recs, columns=["run_dir", "label", "id", "iteration", "position", "entropy", "js", "accepted"])


def accepted_by_position(traces: pd.DataFrame, half_width: int = 8) -> pd.DataFrame:
    """Mean accepted drafts per block by the position of the block's last committed token (0-based): an iteration
    commits accepted + 1 tokens, so that position is the running sum of (accepted + 1) over the example's iterations
    (turns one after another) minus 1; bins of 2·half_width, x = bin centre (SD²'s x ± 8)."""
    t = traces.sort_values(["run_dir", "id", "iteration"])
    pos = (t["accepted"] + 1).groupby([t["run_dir"], t["id"]]).cumsum() - 1
    width = 2 * half_width
    t = t.assign(x=(pos // width) * width + half_width)[t["drafted"] > 0]
    return (t.groupby(["label", "x"])["accepted"].agg(mean_accepted="mean", blocks="count").reset_index())


def plot_thresholds(traces: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """T_G and T_V after each iteration, one line per example (the first MAX_LINES)."""
    keys = [k for k in ("t_g", "t_v") if k in traces and traces[k].notna().any()]
    if not keys:
        raise ReportError("plot_thresholds: the traces have no t_g / t_v (AdaSD-family runs with trace=true)")
    fig, axes = _figure(1, len(keys), (5.0 * len(keys), 3.6))
    for ax, k in zip(axes, keys):
        for (label, ex), t in list(traces.groupby(["label", "id"], sort=False))[:MAX_LINES]:
            ax.plot(t["iteration"], t[k], lw=1, label=f"{label} {ex}")
        ax.set(xlabel="iteration", ylabel={"t_g": "$T_G$ (bits)", "t_v": "$T_V$ (JS distance)"}[k],
               title={"t_g": "generation threshold", "t_v": "verification threshold"}[k])
    return _save(fig, path, title, axes[-1], 6)


def plot_gamma(traces: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """γ after each iteration and accepted drafts per iteration, one line per example (GammaTune App. A)."""
    if "gamma" not in traces or traces["gamma"].isna().all():
        raise ReportError("plot_gamma: the traces have no gamma (vanilla, heuristic, gammatune runs with trace=true)")
    fig, axes = _figure(1, 2, (10.0, 3.6))
    for (label, ex), t in list(traces.groupby(["label", "id"], sort=False))[:MAX_LINES]:
        axes[0].step(t["iteration"], t["gamma"], where="post", lw=1, label=f"{label} {ex}")
        axes[1].plot(t["iteration"], t["accepted"], lw=1, marker=".", ms=3)
    axes[0].set(xlabel="iteration", ylabel="γ", title="speculation length")
    axes[1].set(xlabel="iteration", ylabel="accepted drafts", title="accepted per iteration")
    return _save(fig, path, title, axes[0], 6)


def plot_token_means(traces: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """AdaSD Figure 2: per example, mean entropy and mean JS distance of accepted and rejected drafts."""
    s = token_stats(traces)
    if s.empty:
        raise ReportError("plot_token_means: the traces have no per-draft entropy / JS (runs with trace=true)")
    m = s.groupby(["label", "id", "accepted"], sort=False)[["entropy", "js"]].mean().reset_index()
    x = {ex: i for i, ex in enumerate(dict.fromkeys(zip(s["label"], s["id"])))}  # example number, in trace order
    fig, axes = _figure(1, 2, (10.0, 3.6))
    for ax, k, unit in zip(axes, ("entropy", "js"), ("mean entropy H(q) (bits)", "mean JS distance")):
        for (label, acc), g in m.groupby(["label", "accepted"]):
            ax.plot([x[e] for e in zip(g["label"], g["id"])], g[k], marker="o" if acc else "x", ls="",
                    label=f"{label} {'accepted' if acc else 'rejected'}")
        ax.set(xlabel="example", ylabel=unit)
        ax.xaxis.get_major_locator().set_params(integer=True)
    return _save(fig, path, title, axes[1])


def plot_js_hist(traces: pd.DataFrame, path: str | Path, title: str | None = None, bins: int = 20) -> Path:
    """AdaSD Figure 3: distribution of d_JS(p_i, q_i) over accepted and rejected drafts, on [0, 1]."""
    s = token_stats(traces)
    if s.empty:
        raise ReportError("plot_js_hist: the traces have no per-draft JS distances (runs with trace=true)")
    fig, (ax,) = _figure()
    for acc, g in s.groupby("accepted"):
        ax.hist(g["js"], bins=bins, range=(0, 1), alpha=0.6, label=f"{'accepted' if acc else 'rejected'} ({len(g)})")
    ax.set(xlabel="JS distance", ylabel="drafts", title=", ".join(dict.fromkeys(s["label"])))
    ax.legend(loc="best")
    return _save(fig, path, title)


def plot_accept_hist(traces: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """Histogram of accepted drafts per drafting iteration, one series per run (fractions of its iterations)."""
    t = traces[traces["drafted"] > 0]
    if t.empty:
        raise ReportError("plot_accept_hist: no drafting iterations in the traces")
    fig, (ax,) = _figure()
    edges = np.arange(t["accepted"].max() + 2) - 0.5
    for label, g in t.groupby("label", sort=False):
        ax.hist(g["accepted"], bins=edges, histtype="step", lw=1.5, weights=np.full(len(g), 1 / len(g)), label=label)
    ax.set(xlabel="accepted drafts per iteration", ylabel="fraction of iterations")
    return _save(fig, path, title, ax)


def plot_position(traces: pd.DataFrame, path: str | Path, title: str | None = None, half_width: int = 8) -> Path:
    """SD² Figure 4: mean accepted drafts per block against the block's position, one line per run."""
    d = accepted_by_position(traces, half_width)
    if d.empty:
        raise ReportError("plot_position: no drafting iterations in the traces")
    fig, (ax,) = _figure()
    for label, g in d.groupby("label", sort=False):
        ax.plot(g["x"], g["mean_accepted"], marker="o", ms=3, label=label)
    ax.set(xlabel=f"position of the block's last token (± {half_width})", ylabel="accepted tokens per block")
    return _save(fig, path, title, ax)


def plot_task_throughput(data: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """GammaTune Figure 1: grouped bars of tokens/s per task and method, error bars = std over initial γ."""
    if data.empty:
        raise ReportError("plot_task_throughput: no per-task throughput (GammaTune-table runs on a dataset with tasks)")
    tasks, rows = list(dict.fromkeys(data["task"])), list(dict.fromkeys(data["row"]))
    fig, (ax,) = _figure(size=(max(6.0, 0.6 * len(tasks) * len(rows) / 2), 4.0))
    w = 0.8 / len(rows)
    for k, row in enumerate(rows):
        g = data[data["row"] == row].set_index("task").reindex(tasks)
        ax.bar(np.arange(len(tasks)) + k * w, g["mean"], w, yerr=g["std"], capsize=2, label=row)
    ax.set_xticks(np.arange(len(tasks)) + 0.4 - w / 2, tasks, rotation=45, ha="right")
    ax.set(ylabel="tokens/s (mean ± std over initial γ)")
    return _save(fig, path, title, ax)


def plot_positions(runs: pd.DataFrame, out: Path, title: str, stem: str) -> Path | None:
    """<out>/fig_per_position__<stem>.png: alpha_i (solid) and P(>= i) (dashed) against position i, a line per drafting
    run of `runs` (one pair and dataset; per_position.drafting); None when no run drafted."""
    per = {label: p for (_, label), p in drafting(runs.assign(label=unique_labels(runs))).items()}  # a line a run
    if not per:
        return None
    fig, (ax,) = _figure()
    for k, (label, p) in enumerate(per.items()):
        x = np.arange(1, len(p["alpha"]) + 1)
        color = f"C{k % 10}"
        ax.plot(x, p["alpha"], "o-", color=color, label=f"{label} α_i")
        ax.plot(x[:len(p["at_least"])], p["at_least"], "s--", color=color, alpha=0.6, label=f"{label} P(≥ i)")
    ax.set(xlabel="draft position i (a tree: depth)", ylabel="acceptance", ylim=(0, 1.02))
    return _save(fig, Path(out) / f"fig_per_position__{stem}.png", title, ax)


def batch_speedups(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run but `ar` of one comparable group: pair, dataset, label, batch_size and its speedup over the `ar`
    run with the same setting and batch size (a run without one left out; a refused one logged)."""
    runs = runs.assign(label=labels(runs, ("batch_size",)))
    recs = []
    for _, r in runs[runs["method"] != "ar"].iterrows():
        base, why = baselines.baseline_or_refusal(r, runs, "ar")
        if why:
            log.info("batch-size figure: %s at batch_size=%d left out: %s", r["label"], r["batch_size"], why)
        if base is not None:
            recs.append({"pair": r["pair"], "dataset": r["dataset"], "label": r["label"],
                         "batch_size": r["batch_size"], "speedup": baselines.speedup_over(r, base)})
    return pd.DataFrame(recs, columns=["pair", "dataset", "label", "batch_size", "speedup"])


def plot_batch_speedup(data: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """Speedup over `ar` at the same batch size against batch size (log2 axis), one line per run label; y = 1: ar."""
    if data.empty:
        raise ReportError("plot_batch_speedup: no speedups over ar (runs with an ar run at their batch size)")
    fig, (ax,) = _figure()
    ax.axhline(1.0, color="grey", ls="--", lw=1, label="ar")
    for label, g in data.sort_values("batch_size").groupby("label", sort=False):
        ax.plot(g["batch_size"], g["speedup"], marker="o", ms=4, label=label)
    sizes = sorted(set(data["batch_size"]))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set(xlabel="batch size", ylabel="speedup over ar (same batch size)")
    return _save(fig, path, title, ax)


FIG5_BARS = [("T = 1", "", "sampling"), ("T = 0", "//", "greedy")]  # the paper: T = 1 solid, T = 0 hatched


def sd2_fig5_bars(values: pd.DataFrame) -> pd.DataFrame:
    """The bars of SD² Figure 5 from an sd2_fig5 table's values: one row per pair, method and temperature with its
    x (pair i's group around i; per method T = 1 then T = 0, methods in the table's order), width, tau (NaN: no
    bar) and hatch."""
    methods = list(dict.fromkeys(values.columns.get_level_values(0)))
    w = 0.8 / (len(methods) * len(FIG5_BARS))
    recs = [{"pair": at[-1], "method": m, "temperature": t, "x": i - 0.4 + (len(FIG5_BARS) * j + k + 0.5) * w,
             "width": w, "tau": values.loc[at, (m, t)], "hatch": hatch}
            for i, at in enumerate(values.index) for j, m in enumerate(methods)
            for k, (t, hatch, _) in enumerate(FIG5_BARS)]
    return pd.DataFrame(recs, columns=["pair", "method", "temperature", "x", "width", "tau", "hatch"])


def draw_sd2_fig5(ax, values: pd.DataFrame) -> None:
    """SD² Figure 5's grouped bars on ax (a bar per method and temperature with a number), pairs on the x axis."""
    bars = sd2_fig5_bars(values).dropna(subset=["tau"])
    colors = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(values.columns.get_level_values(0)))}
    for (m, _), b in bars.groupby(["method", "temperature"], sort=False):
        ax.bar(b["x"], b["tau"], b["width"], color=colors[m], hatch=b["hatch"].iloc[0], edgecolor="black", lw=0.5)
    ax.set_xticks(range(len(values)), [at[-1] for at in values.index], rotation=15 if len(values) > 3 else 0)
    ax.set(ylabel="τ: mean accepted tokens per block", xlim=(-0.5, len(values) - 0.5))
    keys = [Patch(facecolor=c, edgecolor="black", lw=0.5, label=m) for m, c in colors.items()]
    keys += [Patch(facecolor="white", edgecolor="black", lw=0.5, hatch=h, label=f"{t} ({how})")
             for t, h, how in FIG5_BARS]
    ax.figure.legend(handles=keys, loc="outside right center", fontsize=7)  # centred: clear of the title


def plot_sd2_fig5(values: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """SD² Figure 5: τ per pair (a group of bars), method (colour) and temperature (T = 1 solid, T = 0 hatched)."""
    if values.isna().all().all():
        raise ReportError("plot_sd2_fig5: the sd2_fig5 table holds no number")
    width = max(6.0, 1.6 * len(values) + 2.0)
    fig, (ax,) = _figure(size=(width, 4.0))
    draw_sd2_fig5(ax, values)
    return _save(fig, path, title and textwrap.fill(title, int(9 * width)))  # about 9 title characters per inch


def _batch_figure(runs: pd.DataFrame, out: Path, title: str, tag: tuple[str, ...]) -> list[Path]:
    """fig_batch_speedup per pair and dataset of one comparable group whose `ar` runs span 2 or more batch sizes."""
    paths = []
    for (pair, d), g in runs.groupby(["pair", "dataset"], sort=False):
        with_ar = sorted(set(g.loc[g["method"] == "ar", "batch_size"]))
        if len(with_ar) < 2:
            level = logging.INFO if g["batch_size"].nunique() > 1 else logging.DEBUG
            log.log(level, "no batch-size figure for %s · %s · %s: ar ran at batch sizes %s (needs 2 or more)",
                    pair, d, title, with_ar)
            continue
        data = batch_speedups(g)
        if not data.empty:
            paths.append(plot_batch_speedup(data, out / f"fig_batch_speedup__{slug(pair, d, *tag)}.png",
                                            f"{pair} · {d} · {title}"))
    return paths


def _group_figures(runs: pd.DataFrame, out: Path, title: str, tag: tuple[str, ...], baseline: str | None) -> list[Path]:
    """The figures of one comparable group of runs, per pair and dataset, file names ending in `tag`."""
    paths = _batch_figure(runs, out, title, tag)
    runs = runs.assign(label=labels(runs))
    for (pair, d), g in runs.groupby(["pair", "dataset"], sort=False):
        drawn = plot_positions(g, out, f"{pair} · {d} · {title}", slug(pair, d, *tag))
        if drawn is not None:
            paths.append(drawn)
    traces = load.load_traces(runs)
    for (pair, d), t in (traces.groupby(["pair", "dataset"], sort=False) if len(traces) else []):
        where, stem = f"{pair} · {d} · {title}", slug(pair, d, *tag)
        paths += [plot_accept_hist(t, out / f"fig_accept_hist__{stem}.png", where),
                  plot_position(t, out / f"fig_position__{stem}.png", where)]
        for label, r in t.groupby("label", sort=False):
            one = slug(pair, d, *tag, label)
            if any(k in r and r[k].notna().any() for k in ("t_g", "t_v")):
                paths.append(plot_thresholds(r, out / f"fig_thresholds__{one}.png", f"{where} · {label}"))
            if "gamma" in r and r["gamma"].notna().any():
                paths.append(plot_gamma(r, out / f"fig_gamma__{one}.png", f"{where} · {label}"))
            if r["js"].notna().any() and not token_stats(r).empty:
                paths += [plot_token_means(r, out / f"fig_token_means__{one}.png", f"{where} · {label}"),
                          plot_js_hist(r, out / f"fig_js_hist__{one}.png", f"{where} · {label}")]
    examples = load.load_examples(runs)
    if "category" in examples:
        data = gammatune_tables.task_throughput(runs, examples, baseline)
        for (pair, d), g in data.groupby(["pair", "dataset"], sort=False):
            paths.append(plot_task_throughput(g, out / f"fig_task_throughput__{slug(pair, d, *tag)}.png",
                                              f"{pair} · {d} · {title}"))
    return paths


def make_figures(runs: pd.DataFrame, out: str | Path, baseline: str | None = None,
                 built: Iterable[tables.Table] = (), per_group: bool = True) -> list[Path]:
    """Every figure the runs have data for, per comparable group (per_group=False: none), as
    <out>/fig_<kind>__<pair>__<dataset>[__<group>][__<run>].png (the group only where a pair and dataset have runs in
    several groups); and SD² Figure 5 from each sd2_fig5 table in `built` (the report's tables), as
    <out>/fig_<table name>.png."""
    out = Path(out)
    paths = [plot_sd2_fig5(t.values, out / f"fig_{t.name}.png", t.title) for t in built
             if t.name.split("__")[0] == "sd2_fig5" and t.values.notna().any().any()]
    if not per_group:
        return paths
    groups = selection.groups(runs)
    spread = pd.Series([(r["pair"], r["dataset"]) for g in groups for _, r in g.runs.drop_duplicates(
        ["pair", "dataset"]).iterrows()]).value_counts()
    for g in groups:
        many = any(spread[(r["pair"], r["dataset"])] > 1 for _, r in g.runs.iterrows())
        paths += _group_figures(g.runs, out, g.title, (g.title,) if many else (), baseline)
    if not any(p.name.startswith(("fig_accept_hist", "fig_position")) for p in paths):
        log.warning(NO_TRACES)
    return paths
