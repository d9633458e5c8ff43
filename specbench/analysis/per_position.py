"""Acceptance per draft position (the plot vLLM's and SPEED-Bench's reports show), from each run's merged call_stats
(specbench.decoding.speedup: each generation's first iteration left out). For position i = 1.., with reached_i the
iterations that verified position i and acc_i those that accepted it, and K the iterations that drafted:

    alpha_i   = acc_i / reached_i     P(position i accepted | positions 1..i-1 accepted)  (conditional)
    P(>= i)   = acc_i / K             P(an iteration accepts i or more drafts)            (vLLM's per-position rate)
    h(n)      = (acc_n - acc_{n+1}) / K, acc_0 = K     the accepted-length histogram, n = 0..

A tree's positions are its depths. Every verified position is listed, zeros included (speedup.alphas). The figure
is specbench.analysis.figures.plot_positions."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.analysis.selection import Group
from specbench.common.aggregate import positions
from specbench.analysis.tables import Table

MAX_POSITIONS = 16  # positions shown in the tables (every one is in the figure)


def position_tables(group: Group) -> list[Table]:
    """Two tables of the group's drafting runs: alpha_i with P(>= i) per position, and the accepted-length histogram."""
    per = drafting(group.runs)
    if not per:
        return []
    depth = min(MAX_POSITIONS, max(len(p["alpha"]) for p in per.values()))
    cols = [f"α_{i}" for i in range(1, depth + 1)] + [f"P(≥{i})" for i in range(1, depth + 1)]
    a = _table("per_position", "Acceptance per draft position: conditional α_i = P(i accepted | 1..i-1 accepted) and "
               "P(≥ i) = P(an iteration accepts i or more drafts) (vLLM's per-position rate); each generation's first "
               "iteration left out", per, cols,
               lambda p: [*pad(p["alpha"], depth), *pad(p["at_least"], depth)])
    bins = min(MAX_POSITIONS + 1, max(len(p["hist"]) for p in per.values()))
    h = _table("accepted_length", "Accepted-length histogram: the fraction of drafting iterations that accepted n "
               "drafts", per, [f"n={n}" for n in range(bins)], lambda p: pad(p["hist"], bins))
    return [a, h]


def pad(values: list[float], n: int) -> list[float]:
    """values cut or padded with NaN (never verified) to n."""
    return [*values[:n], *[np.nan] * (n - len(values[:n]))]


def drafting(runs: pd.DataFrame) -> dict[tuple[str, str], dict[str, list[float]]]:
    """{(pair · dataset, run label): positions} of the runs that drafted (runs without call_stats left out); the
    labels must tell every run apart (selection.unique_labels, as the report and plot_positions give them)."""
    runs = runs[runs["call_stats"].notna()]
    keys = zip(runs["pair"] + " · " + runs["dataset"], runs["label"])
    return {k: p for k, p in ((k, positions(s, a)) for k, s, a in zip(keys, runs["call_stats"], runs["alphas"])) if p}


def _table(name: str, title: str, per: dict, cols: list[str], row) -> Table:
    index = pd.MultiIndex.from_tuples(list(per))
    v = pd.DataFrame([row(p) for p in per.values()], index=index, columns=pd.MultiIndex.from_product([[""], cols]))
    cells = v.map(lambda x: "" if pd.isna(x) else f"{x:.3f}")
    return Table(name, title, v, cells, index_names=("pair · dataset", "run"))
