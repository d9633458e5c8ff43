"""Why a lossless greedy run's row parts from `ar`'s: a float near-tie of the target, or a suspect.

Greedy decoding with any lossless method commits the target's top-1 token at every position, so in exact arithmetic
its rows equal `ar`'s; in floating point the target's logits depend a little on the verify's width (reductions run in
another order), so where the top-2 logits are within that noise both can pick different tokens and be right. At the
first position t where a lossless run at temperature 0 differs from the `ar` run of its setting:

    margin_t = min(ar's top-2 margin at t, the run's at t)   (the one recorded where the other is missing)
    near-tie  when margin_t < NEAR_TIE[dtype] and the run's token at t is the top-1 of its own verify
    suspect   otherwise: a clear margin, a committed token that is not its verify's top-1, or the same tokens with
              another length (a stop handled differently)

NEAR_TIE (logits, specbench.common.near_ties) is the float noise of one verify in the run's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pandas as pd

from specbench.analysis import load
from specbench.analysis.baselines import baseline_or_refusal
from specbench.analysis.selection import Group
from specbench.analysis.tables import Table
from specbench.common.near_ties import NEAR_TIE, first_difference, near_tie_limit

COLUMNS = ["position", "ar token", "run token", "ar margin", "run margin", "class"]


@dataclass(frozen=True)
class Divergence:
    """The first position where a run's row differs from ar's, the margins there and its class."""

    prompt: str
    position: int
    ar_token: int | None  # None: that row ended before the position
    run_token: int | None
    ar_margin: float
    run_margin: float
    kind: str  # near-tie / suspect


T = TypeVar("T")


def _at(xs: Sequence[T] | None, t: int) -> T | None:
    return xs[t] if xs is not None and t < len(xs) else None


def first_divergence(prompt: str, ar: dict, run: dict, limit: float) -> Divergence | None:
    """The Divergence of run's row from ar's (each a dict of token_ids, top2_margins, off_top1), None if equal."""
    a, r = ar["token_ids"], run["token_ids"]
    if a == r:
        return None
    t = first_difference(a, r)
    am, rm = _at(ar.get("top2_margins"), t), _at(run.get("top2_margins"), t)
    known = [m for m in (am, rm) if m is not None]
    margin = min(known) if known else float("nan")
    off = t in set(run.get("off_top1") or ()) and rm != 0  # a zero margin is a tie: either token is the top-1
    tie = t < min(len(a), len(r)) and margin < limit and not off
    return Divergence(prompt, t, _at(a, t), _at(r, t), np.nan if am is None else am, np.nan if rm is None else rm,
                      "near-tie" if tie else "suspect")


def divergences(run: pd.Series, runs: pd.DataFrame) -> list[Divergence] | None:
    """Every prompt's divergence of a lossless greedy run from the `ar` run of its setting; None where there is
    nothing to compare (a sampled or lossy run, ar itself, no ar run, or an ar run of another setting)."""
    if run["temperature"] != 0 or not run["lossless"] or run["method"] == "ar":
        return None
    base, _ = baseline_or_refusal(run, runs, "ar")
    if base is None:
        return None
    limit = near_tie_limit(run["dtype"])
    theirs = load.outputs_of(base)  # token ids: read from the folders where the runs table lacks them
    found = (first_divergence(k, theirs[k], out, limit) for k, out in sorted(load.outputs_of(run).items())
             if k in theirs)
    return [d for d in found if d is not None]


def summary_cell(found: list[Divergence] | None, n: int) -> tuple[float, str]:
    """(rows diverged, 'k of n: a near-tie, b suspect') for the overview; (NaN, '') where nothing was compared."""
    if found is None:
        return float("nan"), ""
    ties = sum(d.kind == "near-tie" for d in found)
    return float(len(found)), (f"{len(found)} of {n}" + (f": {ties} near-tie, {len(found) - ties} suspect"
                                                           if found else ""))


def divergence_table(group: Group) -> Table | None:
    """A row per diverging prompt of each lossless greedy run of the group (None when no row diverged)."""
    recs, index = [], []
    for _, run in group.runs.iterrows():
        for d in divergences(run, group.runs) or []:
            index.append((f"{run['pair']} · {run['dataset']}", f"{run['label']} · {d.prompt}"))
            recs.append([d.position, d.ar_token, d.run_token, d.ar_margin, d.run_margin, d.kind])
    if not recs:
        return None
    cols = pd.MultiIndex.from_tuples([("", c) for c in COLUMNS])
    v = pd.DataFrame(recs, index=pd.MultiIndex.from_tuples(index), columns=cols, dtype=object)  # ints stay ints
    cells = v.map(lambda x: "" if x is None or (isinstance(x, float) and np.isnan(x))
                  else f"{x:.4f}" if isinstance(x, float) else str(x))
    return Table("divergences", "Rows of lossless greedy runs that differ from ar's: the first differing position, "
                 "the tokens there, the target's top-2 logit margins (ar's verify, the run's), and the class: near-tie "
                 f"when the smaller margin is below {', '.join(f'{v} ({k})' for k, v in NEAR_TIE.items())} and the "
                 "run's token is its own verify's top-1, else suspect", v, cells,
                 index_names=("pair · dataset", "run · prompt"))
