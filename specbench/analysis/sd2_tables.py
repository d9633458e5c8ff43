"""SD²'s tables, rebuilt from a runs DataFrame (`specbench.analysis.load.load_runs`).

Table 1 (T=1) / Table 5 (T=0): τ = block efficiency, mean ± sample std (ddof=1) over seeds; α = throughput over the
pretrained drafter's run with the same seed, mean over seeds; "Mean" = mean over datasets (std: mean of the stds, as
the paper's Mean column adds up). Table 3: Welch's t-test of the seeds' τ against Pretrained's.
"""

from __future__ import annotations

from typing import Iterator

import pandas as pd
from scipy import stats

from specbench.analysis import shared
from specbench.analysis.baselines import MethodSpec, find_baseline, speedup_over
from specbench.analysis.tables import (BASELINES, Table, ambiguous, dataset_label, fmt_cells, method_specs, ordered,
                                       pair_labels, same_setting, skeleton)

SD2_ROWS = [("Pretrained", None), ("Distilled", "distilled"), ("SD²", "sd2")]


def sd2_seed_runs(runs: pd.DataFrame, rows: list[tuple[str, MethodSpec]],
                  table: str = "sd2") -> Iterator[tuple[str, pd.Series]]:
    """(row label, run) per run of each row's spec: one per pair, dataset and seed, the seeds in one setting."""
    for label, spec in rows:
        for (pair, d), c in spec.runs_in(runs).groupby(["pair", "dataset"]):
            if c["seed"].duplicated().any():
                dup = c[c["seed"].duplicated(keep=False)]
                raise ambiguous(table, f"{label} ({spec}) with seed {dup.iloc[0]['seed']} on {pair}/{d}", dup)
            same_setting(c, table, f"the seeds of {label} on {pair}/{d}", ignore=("decode.seed",))
            yield from ((label, r) for _, r in c.iterrows())


def sd2_numbers(runs: pd.DataFrame, temperature: float, baseline: str | None = None) -> pd.DataFrame:
    """One row per (pair, dataset, method row, seed): τ (block efficiency) and α over the same-seed baseline run, both
    over the example ids the run and its baseline hold (shared.compared; attrs["notes"] says where a run holds more)."""
    base = MethodSpec.parse(baseline or BASELINES["sd2"])
    runs = runs[runs["temperature"] == temperature]
    recs: list[dict] = []
    notes: list[str] = []
    for label, r in sd2_seed_runs(runs, method_specs(SD2_ROWS, base)):
        b = find_baseline(r, runs, base)
        if b is not None:  # the run and its same-seed baseline on the ids both hold: its τ and α over those
            them = shared.compared([r, b], f"{r['pair']} · {r['dataset']} · seed {r['seed']}")
            (r, b), notes = them.runs, notes + list(them.notes)
        recs.append({"pair": r["pair"], "pair_label": r["pair_label"], "dataset": r["dataset"], "row": label,
                     "seed": r["seed"], "tau": r["block_efficiency"], "alpha": speedup_over(r, b)})
    out = pd.DataFrame(recs, columns=["pair", "pair_label", "dataset", "row", "seed", "tau", "alpha"])
    out.attrs["notes"] = list(dict.fromkeys(notes))  # the table's notes: examples compared, loads and CPUs apart
    return out


def _sd2_frame(long: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """The empty values of an SD² table: a block of SD2_ROWS per pair, `cols` per dataset (the paper's first)."""
    labels = pair_labels(long)
    dsets = ordered(set(long["dataset"]), ["ultrachat", "humaneval", "xsum", "alpaca", "gsm8k"])
    return skeleton(list(dict.fromkeys(labels[p] for p in long["pair"])), [r for r, _ in SD2_ROWS],
                    [dataset_label(d) for d in dsets], cols)


def sd2_table(runs: pd.DataFrame, temperature: float = 1.0, baseline: str | None = None) -> list[Table]:
    """SD² Table 1 (temperature 1) or Table 5 (temperature 0): τ ± std over seeds and α per dataset, plus Mean."""
    long = sd2_numbers(runs, temperature, baseline)
    notes = tuple(long.attrs.get("notes", ()))
    if long.empty or (long["row"] == "Pretrained").all():
        return []
    v = _sd2_frame(long, ["τ", "τ std", "α"])
    labels = pair_labels(long)
    for (pair, d, row), g in long.groupby(["pair", "dataset", "row"]):
        at, dl = (labels[pair], row), dataset_label(d)
        v.loc[at, (dl, "τ")], v.loc[at, (dl, "τ std")] = g["tau"].mean(), g["tau"].std(ddof=1)
        v.loc[at, (dl, "α")] = g["alpha"].mean()
    tops = list(dict.fromkeys(v.columns.get_level_values(0)))
    for col in ["τ", "τ std", "α"]:  # Mean over datasets, only for rows with every dataset's number
        sub = v[[(t, col) for t in tops]]
        v[("Mean", col)] = sub.mean(axis=1).where(sub.notna().all(axis=1))
    cells = pd.DataFrame("", index=v.index, columns=pd.MultiIndex.from_product([tops + ["Mean"], ["τ", "α"]]))
    for t in tops + ["Mean"]:
        cells[(t, "τ")] = ["" if pd.isna(m) else f"{m:.2f}" + ("" if pd.isna(s) else f" ± {s:.2f}")
                           for m, s in zip(v[(t, "τ")], v[(t, "τ std")])]
        cells[(t, "α")] = fmt_cells(v[[(t, "α")]], ".2f")[(t, "α")]
    num, kind = ("1", "sampling") if temperature == 1 else ("5", "greedy") if temperature == 0 else (f"_T{temperature:g}", "")
    return [Table(f"sd2_table{num}", f"SD² Table {num.lstrip('_')}: block efficiency τ (± std over seeds) and speedup α "
                  f"over the pretrained drafter, T={temperature:g} {kind}".rstrip(), v, cells, notes=notes)]


def sd2_welch(runs: pd.DataFrame, temperature: float = 1.0, baseline: str | None = None) -> list[Table]:
    """SD² Table 3: Welch's t-test (scipy, unequal variances) of each method's τ over seeds against Pretrained's."""
    long = sd2_numbers(runs, temperature, baseline)
    notes = tuple(long.attrs.get("notes", ()))
    if long.empty or (long["row"] == "Pretrained").all():
        return []
    v = _sd2_frame(long, ["t", "p"]).drop(index="Pretrained", level=1)
    labels = pair_labels(long)
    for (pair, d), g in long.groupby(["pair", "dataset"]):
        pre = g.loc[g["row"] == "Pretrained", "tau"]
        for row, m in g[g["row"] != "Pretrained"].groupby("row"):
            if len(pre) >= 2 and len(m["tau"]) >= 2:
                t, p = stats.ttest_ind(m["tau"], pre, equal_var=False)
                v.loc[(labels[pair], row), (dataset_label(d), "t")] = t
                v.loc[(labels[pair], row), (dataset_label(d), "p")] = p
    cells = fmt_cells(v, ".2f")
    bold = pd.DataFrame(False, index=v.index, columns=v.columns)
    bold.loc[:, [c for c in v.columns if c[1] == "p"]] = v[[c for c in v.columns if c[1] == "p"]] <= 0.05
    return [Table("sd2_table3", f"SD² Table 3: Welch's t-test of τ against Pretrained over seeds, T={temperature:g} "
                  "(t > 0: higher τ; bold: p <= 0.05)", v, cells, bold, notes=notes)]
