"""Acceptance in each engine's convention (`python -m specbench.report DIR --convention NAME`): the same recorded
counts, pooled over a run's rows, in the names and formulas of specbench, vLLM, SGLang, EAGLE and Spec-Bench
(CONVENTIONS; docs/design.md, "Acceptance conventions", gives each with the source it was read from).

Counts, summed over the rows: N new tokens (cut at the stop), C target calls, I iterations (verify steps), A accepted
drafts, D drafted nodes, k drafting iterations (w > 0). A chain's iteration commits accepted + 1 tokens, so
N = A + I - cut (the last block's tokens after a stop). The conventions part where iterations draft nothing (vLLM's
1 + A / k against (A + I) / I), where the last block is cut at a stop (specbench's N / C against (A + I) / I) and at
the +1 bonus token (#match against every "acceptance length").
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from specbench.analysis.selection import Group
from specbench.analysis.tables import Table
from specbench.common.aggregate import accept_length, ratio


def nan(x: float | None) -> float:
    """None (aggregate.ratio's 'no data') as NaN, a table's empty cell."""
    return float("nan") if x is None else x


def per(a: float, b: float) -> float:
    """a / b, NaN for b = 0."""
    return nan(ratio(a, b))


Formula = Callable[[dict[str, float]], float]
# name -> (whose convention, in words; [(column, formula, format)])
CONVENTIONS: dict[str, tuple[str, list[tuple[str, Formula, str]]]] = {
    "specbench": ("specbench's", [("τ = N / C", lambda c: per(c["N"], c["C"]), ".2f"),
                                  ("#match = A / k", lambda c: per(c["A"], c["k"]), ".2f"),
                                  ("AccRate = A / D", lambda c: per(c["A"], c["D"]), ".3f")]),
    "vllm": ("vLLM's", [("mean acceptance length = 1 + A / num_drafts", lambda c: 1 + per(c["A"], c["k"]), ".2f"),
                        ("draft acceptance rate = A / num_draft_tokens", lambda c: per(c["A"], c["D"]), ".3f"),
                        ("num_drafts", lambda c: c["k"], ".0f")]),
    "sglang": ("SGLang's", [("accept len = (A + verify steps) / verify steps", lambda c: nan(accept_length(c)), ".2f"),
                            ("verify steps", lambda c: c["I"], ".0f")]),
    "eagle": ("EAGLE's", [("τ (average acceptance length) = (A + steps) / steps",
                           lambda c: nan(accept_length(c)), ".2f")]),
    "spec_bench": ("Spec-Bench's", [("#Mean Accepted Tokens = (A + steps) / steps",
                                     lambda c: nan(accept_length(c)), ".2f")]),
}


# name -> the overview's acceptance columns in that convention: (column, intervals' statistic, format), in place of
# specbench's AccRate and τ (`report --convention NAME`)
OVERVIEW_COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "specbench": [("AccRate", "AccRate", ".3f"), ("τ", "τ", ".2f")],
    "vllm": [("draft acceptance rate (vLLM)", "AccRate", ".3f"),
             ("mean acceptance length (vLLM) = 1 + A / num_drafts", "vllm length", ".2f")],
    "sglang": [("accept len (SGLang) = (A + steps) / steps", "accept length", ".2f")],
    "eagle": [("τ (EAGLE) = (A + steps) / steps", "accept length", ".2f")],
    "spec_bench": [("#Mean Accepted Tokens (Spec-Bench) = (A + steps) / steps", "accept length", ".2f")],
}


def convention_table(group: Group, name: str) -> Table:
    """One row per run of the group: its acceptance in convention `name` (a key of CONVENTIONS), computed from the
    run's pooled counts (load_run's `counts`)."""
    whose, columns = CONVENTIONS[name]
    runs = group.runs
    index = pd.MultiIndex.from_arrays([runs["pair"] + " · " + runs["dataset"], runs["label"]])
    cols = pd.MultiIndex.from_product([[""], [c for c, _, _ in columns]])
    v = pd.DataFrame(np.nan, index=index, columns=cols)
    cells = pd.DataFrame("", index=index, columns=cols)
    for at, (_, r) in zip(index, runs.iterrows()):
        for column, formula, spec in columns:
            x = formula(r["counts"]) if r["drafted_total"] else float("nan")  # ar, draft_only: nothing drafted
            v.loc[at, ("", column)] = x
            cells.loc[at, ("", column)] = "" if np.isnan(x) else format(x, spec)
    title = (f"Acceptance in {whose} convention (from the runs' pooled counts: N new tokens, C target calls, A "
             "accepted, D drafted, k drafting iterations, steps = iterations; docs/design.md, Acceptance conventions)")
    return Table(f"acceptance_{name}", title, v, cells, index_names=("pair · dataset", "run"))
