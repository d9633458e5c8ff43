"""GammaTune's Table 2 and Figure 1's data, rebuilt from a runs DataFrame (`specbench.analysis.load.load_runs`).

Table 2: speedup over fixed-γ speculative decoding, mean ± std (numpy's ddof=0) over the initial γ grid (every
method's option `gamma`). The paper's own SpecDecode row reads 1.00 ± 0.28: each run's throughput is divided by the
*mean* throughput of `vanilla` over the grid (normalize="grid"). "Average" = mean over pairs of the means ± mean of
the stds (how the paper's Average column adds up, e.g. HFHeuristic 1.11 = mean(1.14, 1.04, 1.12, 1.12)).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from specbench.analysis import shared
from specbench.analysis.baselines import MethodSpec
from specbench.analysis.selection import ReportError
from specbench.analysis.tables import (BASELINES, Table, ambiguous, dataset_label, method_specs, runs_on, same_setting,
                                       skeleton, throughput_by)

log = logging.getLogger(__name__)

GAMMATUNE_ROWS = [("SpecDecode", None), ("HFHeuristic", "heuristic"), ("AssistantThreshold", "confidence"),
                  ("GammaTune", "gammatune"), ("GammaTune+", "gammatune_plus")]


def _grid(runs: pd.DataFrame, table: str, pair: str, dataset: str, label: str, spec: MethodSpec) -> dict[float, pd.Series]:
    """gamma -> the one run of spec at that initial γ on pair and dataset."""
    out: dict[float, pd.Series] = {}
    for g, block in runs_on(runs, spec, pair, dataset).groupby("gamma", dropna=False):
        if math.isnan(g):
            raise ReportError(f"{table}: {label} ({spec}) runs on {pair}/{dataset} have no initial γ option")
        if len(block) > 1:
            raise ambiguous(table, f"{label} ({spec}) with initial γ={g:g} on {pair}/{dataset}", block)
        out[g] = block.iloc[0]
    return out


def gammatune_speedups(runs: pd.DataFrame, baseline: str | None = None, normalize: str = "grid") -> pd.DataFrame:
    """One row per (pair, dataset, method row, gamma): tokens_per_s and speedup over fixed-γ `vanilla`: normalize=
    "grid": T(method, γ0) / mean over the grid of T(vanilla, γ) (the paper's table); "paired": T(method, γ0) /
    T(vanilla, γ0) (SpecDecode 1.00 ± 0.00). Every method must cover the baseline's γ grid. A run and the baseline
    runs it is divided by are compared on the example ids all of them hold (shared.compared; attrs["notes"] says
    where a run holds more)."""
    if normalize not in ("grid", "paired"):
        raise ReportError(f"normalize {normalize!r}: valid values are grid, paired")
    base = MethodSpec.parse(baseline or BASELINES["gammatune"])
    table, rows = "gammatune_table2", method_specs(GAMMATUNE_ROWS, base)
    recs: list[dict] = []
    notes: list[str] = []
    for (pair, d), _ in base.runs_in(runs).groupby(["pair", "dataset"]):
        grid = _grid(runs, table, pair, d, "SpecDecode", base)
        mine = {label: _grid(runs, table, pair, d, label, s) for label, s in rows}
        same_setting(pd.DataFrame([r for g in mine.values() for r in g.values()]), table, f"the runs on {pair}/{d}")
        for label, runs_by_g in mine.items():
            if runs_by_g and set(runs_by_g) != set(grid):
                raise ReportError(f"{table}: {label} on {pair}/{d} ran initial γ {sorted(runs_by_g)}, the baseline "
                                  f"{base} γ {sorted(grid)}: the mean over γ needs the same grid")
            for g, r in sorted(runs_by_g.items()):
                # the run and the baseline's grid (normalize="paired": the baseline at g) on the ids all hold
                them = shared.compared([r, *(grid.values() if normalize == "grid" else [grid[g]])], f"{pair} · {d}")
                r, notes = them.runs[0], notes + list(them.notes)
                den = np.mean([b["tokens_per_s_median"] for b in them.runs[1:]])
                recs.append({"pair": pair, "pair_label": r["pair_label"], "dataset": d, "row": label, "gamma": g,
                             "tokens_per_s": r["tokens_per_s_median"], "speedup": r["tokens_per_s_median"] / den})
    out = pd.DataFrame(recs, columns=["pair", "pair_label", "dataset", "row", "gamma", "tokens_per_s", "speedup"])
    out.attrs["notes"] = list(dict.fromkeys(notes))  # the table's notes: examples compared, loads and CPUs apart
    for label, spec in rows[1:]:
        for (pair, d), _ in spec.runs_in(runs).groupby(["pair", "dataset"]):
            if not ((out["pair"] == pair) & (out["dataset"] == d)).any():
                log.warning("%s: %s runs on %s/%s have no %s baseline runs: left out", table, label, pair, d, base)
    return out


def gammatune_table2(runs: pd.DataFrame, baseline: str | None = None, normalize: str = "grid") -> list[Table]:
    """GammaTune Table 2: speedup over fixed-γ speculative decoding, mean ± std over the initial γ grid."""
    long = gammatune_speedups(runs, baseline, normalize)
    notes = tuple(long.attrs.get("notes", ()))
    if long.empty or (long["row"] == "SpecDecode").all():
        return []
    multi = long["dataset"].nunique() > 1
    long["col"] = long["pair_label"] + (" (" + long["dataset"].map(dataset_label) + ")" if multi else "")
    agg = long.groupby(["row", "col"], sort=False)["speedup"].agg(mean="mean", std=lambda s: s.std(ddof=0))
    cols = list(dict.fromkeys(long["col"]))
    v = skeleton([""], [r for r, _ in GAMMATUNE_ROWS], cols + ["Average"], ["mean", "std"])
    for (row, col), m in agg.iterrows():
        v.loc[("", row), (col, "mean")], v.loc[("", row), (col, "std")] = m["mean"], m["std"]
    full = v[cols].notna().all(axis=1)  # the Average needs every pair's cell
    v.loc[full, ("Average", "mean")] = v.loc[full, [(c, "mean") for c in cols]].mean(axis=1)
    v.loc[full, ("Average", "std")] = v.loc[full, [(c, "std") for c in cols]].mean(axis=1)
    cells = pd.DataFrame("", index=v.index, columns=pd.MultiIndex.from_tuples([(c, "") for c in cols + ["Average"]]))
    for c in cols + ["Average"]:
        cells[(c, "")] = [f"{m:.2f} ± {s:.2f}×" if pd.notna(m) else "" for m, s in zip(v[(c, "mean")], v[(c, "std")])]
    how = "mean vanilla throughput over the grid" if normalize == "grid" else "vanilla at the same γ"
    return [Table("gammatune_table2", f"GammaTune Table 2: speedup over fixed-γ speculative decoding ({how}); "
                  "± = std over initial γ", v, cells, index_names=("", "method"), notes=notes)]


def task_throughput(runs: pd.DataFrame, examples: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """GammaTune Figure 1 data: per (pair, dataset, method row, task: the rows' category) throughput Σ new / Σ
    decode_s of the task's examples, mean and std (ddof=0) over the method's initial-γ runs; n = number of runs."""
    base = MethodSpec.parse(baseline or BASELINES["gammatune"])
    if "category" not in examples:
        raise ReportError("task_throughput: the rows have no 'category' column (Spec-Bench rows carry category and "
                          "task)")
    recs = []
    for label, spec in method_specs(GAMMATUNE_ROWS, base):
        for (pair, d), _ in spec.runs_in(runs).groupby(["pair", "dataset"]):
            for g, run in _grid(runs, "gammatune_figure1", pair, d, label, spec).items():
                for task, tps in throughput_by(examples[examples["run_dir"] == run["run_dir"]], "category").items():
                    recs.append({"pair": pair, "dataset": d, "row": label, "task": task, "gamma": g,
                                 "tokens_per_s": tps})
    long = pd.DataFrame(recs, columns=["pair", "dataset", "row", "task", "gamma", "tokens_per_s"])
    return (long.groupby(["pair", "dataset", "row", "task"], sort=False)["tokens_per_s"]
            .agg(mean="mean", std=lambda s: s.std(ddof=0), n="count").reset_index())
