"""SD² Figure 5 as a table (`--table sd2_fig5`): τ (block efficiency) of EAGLE-3* (the method `eagle3`), Pretrained
(the SD² tables' baseline), Distilled and SD² per verifier/drafter pair at T = 0 and T = 1, a cell the mean over the
pair's datasets of τ's mean over seeds (the SD² tables' Mean column), empty where the method lacks a run at that
temperature on one of them (logged). The report groups the table's runs with decode.temperature as a table axis
(`catalog.SPANS`); `figures.plot_sd2_fig5` draws it as the paper's grouped bars.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from specbench.analysis import tables
from specbench.analysis.baselines import MethodSpec
from specbench.analysis.sd2_tables import SD2_ROWS, sd2_seed_runs

log = logging.getLogger(__name__)

FIG5_ROWS = [("EAGLE-3*", "eagle3"), *SD2_ROWS]  # the paper's order, left to right
TEMPERATURES = [("T = 0", 0.0), ("T = 1", 1.0)]  # column name, decode.temperature


def sd2_fig5_numbers(runs: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """One row per (pair, dataset, method row, temperature, seed) at T = 0 and T = 1: τ (block efficiency), a run's
    own (the figure divides by no baseline run)."""
    base = MethodSpec.parse(baseline or tables.BASELINES["sd2"])
    rows = tables.method_specs(FIG5_ROWS, base)
    recs = [{"pair": r["pair"], "pair_label": r["pair_label"], "dataset": r["dataset"], "row": label,
             "temperature": t, "seed": r["seed"], "tau": r["block_efficiency"]}
            for _, t in TEMPERATURES
            for label, r in sd2_seed_runs(runs[runs["temperature"] == t], rows, "sd2_fig5")]
    return pd.DataFrame(recs, columns=["pair", "pair_label", "dataset", "row", "temperature", "seed", "tau"])


def _mean_tau(long: pd.DataFrame, pair: str, row: str, temperature: float) -> float:
    """The mean over the pair's datasets of row's τ mean over seeds at temperature; NaN if a dataset lacks a run."""
    mine = long[(long["pair"] == pair) & (long["row"] == row) & (long["temperature"] == temperature)]
    lacking = sorted(set(long.loc[long["pair"] == pair, "dataset"]) - set(mine["dataset"]))
    if mine.empty or lacking:
        if len(mine):
            log.warning("sd2_fig5: %s on %s at T=%g has no run on %s: cell left empty (the other cells average "
                        "over those datasets too)", row, pair, temperature, ", ".join(lacking))
        return np.nan
    return float(mine.groupby("dataset")["tau"].mean().mean())


def sd2_fig5_table(runs: pd.DataFrame, baseline: str | None = None) -> list[tables.Table]:
    """SD² Figure 5's numbers: τ per pair, method and temperature, mean over datasets of the mean over seeds."""
    long = sd2_fig5_numbers(runs, baseline)
    if long.empty or (long["row"] == "Pretrained").all():
        return []
    labels = tables.pair_labels(long)
    pairs = list(dict.fromkeys(long["pair"]))
    v = tables.skeleton([""], [labels[p] for p in pairs], [r for r, _ in FIG5_ROWS], [c for c, _ in TEMPERATURES])
    for pair in pairs:
        for row, _ in FIG5_ROWS:
            for col, t in TEMPERATURES:
                v.loc[("", labels[pair]), (row, col)] = _mean_tau(long, pair, row, t)
    base = MethodSpec.parse(baseline or tables.BASELINES["sd2"])
    return [tables.Table("sd2_fig5", "SD² Figure 5: τ (mean accepted tokens per block), mean over datasets of the "
                         f"mean over seeds; T = 0 greedy, T = 1 sampling; Pretrained = {base}",
                         v, tables.fmt_cells(v, ".2f"), index_names=("", "pair"))]
