"""Numbers per category of a benchmark's prompts (Spec-Bench's 13 categories, SPEED-Bench's 11 categories or its
3 entropy tiers of a throughput bucket): a row per run and category with its prompts, tok/s, speedup over the `ar`
run of the same setting on the same prompts, τ and α_1..α_3 (specbench.analysis.per_position), each with its 95%
bootstrap interval over the category's prompts (specbench.analysis.intervals; the speedup paired by prompt)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.analysis import intervals, shared
from specbench.analysis.baselines import baseline_or_refusal
from specbench.analysis.conventions import OVERVIEW_COLUMNS
from specbench.analysis.per_position import pad
from specbench.analysis.selection import Group
from specbench.analysis.tables import Table

ALPHAS = 3  # the positions shown
COLUMNS = ["prompts", "tok/s", "speedup vs ar", "τ"] + [f"α_{i}" for i in range(1, ALPHAS + 1)]


def category_table(group: Group, convention: str = "specbench") -> Table | None:
    """A row per (run, category) of the group's runs whose rows carry a category; None when none does. τ is the
    acceptance length of `convention` (conventions.OVERVIEW_COLUMNS' last column), named so."""
    recs, cells, index = [], [], []
    length, stat, _ = OVERVIEW_COLUMNS[convention][-1]
    columns = [length if c == "τ" else c for c in COLUMNS]
    notes: list[str] = []
    for _, run in group.runs.iterrows():
        if not run["categories"]:
            continue
        base, _ = baseline_or_refusal(run, group.runs, "ar")
        if base is not None:  # the run and ar over the example ids both hold (its categories' prompts among them)
            them = shared.compared([run, base], f"{run['pair']} · {run['dataset']}")
            (run, base), notes = them.runs, notes + list(them.notes)
        for cat, c in sorted(run["categories"].items()):
            mine = intervals.subset(run["prompts"], set(c["ids"]))
            tps, tau = intervals.value(mine, "tok/s", run["time"]), intervals.value(mine, stat, run["time"])
            sp, lo, hi = intervals.of_pair(run, base, "speedup", set(c["ids"]))  # ar's on the same prompts
            alpha = pad(list(c["alphas"] or []), ALPHAS)
            index.append((f"{run['pair']} · {run['dataset']}", f"{run['label']} · {cat}"))
            recs.append([len(c["ids"]), tps, sp, tau, *alpha])
            cells.append([str(len(c["ids"])), intervals.text(tps, *intervals.interval(mine, "tok/s", run["time"]), ".1f"),
                          intervals.text(sp, lo, hi, ".2f"), intervals.text(tau, *intervals.interval(mine, stat, run["time"]), ".2f"),
                          *("" if np.isnan(a) else f"{a:.3f}" for a in alpha)])
    if not recs:
        return None
    idx, cols = pd.MultiIndex.from_tuples(index), pd.MultiIndex.from_tuples([("", c) for c in columns])
    return Table("categories", f"Per category: prompts, tok/s, speedup over ar on the same prompts, {length} and the "
                 f"conditional acceptance α_1..α_{ALPHAS}; [95% bootstrap interval over the category's prompts, the "
                 f"speedup paired by prompt; seed {intervals.SEED}]", pd.DataFrame(recs, index=idx, columns=cols),
                 pd.DataFrame(cells, index=idx, columns=cols), index_names=("pair · dataset", "run · category"),
                 notes=tuple(dict.fromkeys(notes)))
