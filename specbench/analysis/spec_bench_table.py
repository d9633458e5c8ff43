"""Spec-Bench's leaderboard (its README's columns), rebuilt from a runs DataFrame.

Per run on dataset spec_bench, the speedup over `ar` on each task group = Σ new tokens / Σ decode s of the group's
rows over the same of `ar`'s rows (the rows' `task`); #Mean Accepted Tokens = (A + I) / I, Spec-Bench's own
(aggregate.accept_length); Overall = the run's speedup. Spec-Bench's own speed.py averages per-question tok/s instead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.analysis import intervals, shared
from specbench.analysis.baselines import MethodSpec, find_baseline, speedup_over
from specbench.analysis.conventions import nan
from specbench.analysis.load import load_examples
from specbench.analysis.selection import ReportError, labels
from specbench.analysis.tables import BASELINES, Table, ambiguous, fmt_cells, pair_labels, throughput_by
from specbench.common.aggregate import accept_length

# Spec-Bench's leaderboard columns (its README) and the rows' `task` (evaluators/spec_bench.py) behind each
SPEC_BENCH_TASKS = {"Multi-turn Conversation": "mt_bench", "Translation": "translation", "Summarization": "summarization",
                    "Question Answering": "qa", "Mathematical Reasoning": "math_reasoning",
                    "Retrieval-aug. Generation": "rag"}
SPEC_BENCH_COLUMNS = [*SPEC_BENCH_TASKS, "#Mean Accepted Tokens", "Overall"]
# the leaderboard's names of the head methods (a row's label starts with them; other methods keep their names)
SPEC_BENCH_LABELS = {"eagle3": "EAGLE-3", "eagle3_tree": "EAGLE-3 (tree)", "medusa": "Medusa", "lookahead": "Lookahead",
                     "suffix": "SuffixDecoding"}


def _spec_bench_row(run: pd.Series, base: pd.Series, examples: pd.DataFrame
                    ) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """One leaderboard row: per task throughput_by of the run's rows over the baseline's (NaN where the run has no
    row of the task), τ and Overall = speedup_over the baseline run; and their 95% bootstrap intervals (the speedups
    paired by prompt with the baseline, a task's on the task's prompts only; none for the baseline itself)."""
    values = {col: np.nan for col in SPEC_BENCH_TASKS}
    values |= {"#Mean Accepted Tokens": nan(accept_length(run["counts"])), "Overall": speedup_over(run, base)}
    own = run["run_dir"] == base["run_dir"]
    spans = {} if own else {"#Mean Accepted Tokens": intervals.of_run(run, "accept length"),
                            "Overall": intervals.of_pair(run, base, "speedup")[1:]}
    if "task" in examples:  # rows without Spec-Bench's task field: no task columns
        mine, theirs = (examples[examples["run_dir"] == r["run_dir"]] for r in (run, base))
        per_task = throughput_by(mine, "task") / throughput_by(theirs, "task")
        for col, task in SPEC_BENCH_TASKS.items():
            values[col] = per_task.get(task, np.nan)
            ids = set(mine.loc[mine["task"] == task, "id"].astype(str))
            if ids and not own:
                spans[col] = intervals.paired_interval(intervals.subset(run["prompts"], ids),
                                                       intervals.subset(base["prompts"], ids), "speedup", run["time"])
    return values, spans


def spec_bench_table(runs: pd.DataFrame, baseline: str | None = None) -> list[Table]:
    """Spec-Bench's leaderboard: a row per run on spec_bench (its label led by SPEC_BENCH_LABELS' name), a block per
    pair; the baseline's rows first, then by Overall, highest first. No table when no pair has a baseline run (a sweep
    that never ran ar); an error when only some pairs lack it."""
    base = MethodSpec.parse(baseline or BASELINES["spec_bench"])
    mine = runs[runs["dataset"] == "spec_bench"].copy()
    if mine.empty:
        return []
    lacking = sorted(set(mine["pair"]) - set(base.runs_in(mine)["pair"]))
    if len(lacking) == mine["pair"].nunique():  # no baseline at all (a sweep without ar, as gammatune_table2's)
        return []
    if lacking:
        raise ReportError(f"spec_bench: no {base} run on {', '.join(p + '/spec_bench' for p in lacking)}: the "
                          f"speedups are over {base}; run method={base.name} with the other runs' settings")
    mine["row"] = [SPEC_BENCH_LABELS.get(m, m) + row[len(m):] for m, row in zip(mine["method"], labels(mine))]
    examples, pairs = load_examples(mine), pair_labels(mine)
    recs, spans, first = {}, {}, set()
    notes: list[str] = []
    for (pair, row), c in mine.groupby(["pair", "row"], sort=False):
        if len(c) > 1:
            raise ambiguous("spec_bench", f"{row} on {pair}/spec_bench", c)
        run, at = c.iloc[0], (pairs[pair], row)
        b = find_baseline(run, runs, base)
        assert b is not None, "every pair left has a baseline run (lacking ones are refused above)"
        them = shared.compared([run, b], f"{pairs[pair]} · {row}")  # the run and its baseline on the ids both hold
        (run, b), notes = them.runs, notes + list(them.notes)
        ours = examples[examples["id"].astype(str).isin(them.ids)] if len(examples) else examples
        recs[at], spans[at] = _spec_bench_row(run, b, ours)
        first |= {at} if base.matches(run) else set()
    if len(recs) == len(first):  # the baseline alone
        return []
    group = {p: i for i, p in enumerate(dict.fromkeys(a for a, _ in recs))}
    rank = {at: -np.nan_to_num(r["Overall"], nan=-np.inf) for at, r in recs.items()}  # no Overall: last
    order = sorted(recs, key=lambda at: (group[at[0]], at not in first, rank[at]))
    v = pd.DataFrame([recs[at] for at in order], index=pd.MultiIndex.from_tuples(order), columns=SPEC_BENCH_COLUMNS)
    cells = fmt_cells(v, ".2f")
    speedups = [c for c in SPEC_BENCH_COLUMNS if c != "#Mean Accepted Tokens"]
    cells[speedups] = cells[speedups].map(lambda c: c and c + "x")
    for at in order:
        for col, (lo, hi) in spans[at].items():
            if cells.loc[at, col] and not (np.isnan(lo) or np.isnan(hi)):
                cells.loc[at, col] += f" [{lo:.2f}–{hi:.2f}]"
    v.columns = cells.columns = pd.MultiIndex.from_tuples([(c, "") for c in SPEC_BENCH_COLUMNS])
    return [Table("spec_bench", f"Spec-Bench: speedup over {base} per task (Σ new tokens / Σ decode s of its rows), "
                  "#Mean Accepted Tokens = (accepted + steps) / steps (Spec-Bench's), Overall = the run's speedup; "
                  f"[95% bootstrap interval over prompts, paired by prompt with {base}; seed {intervals.SEED}]",
                  v, cells, notes=tuple(dict.fromkeys(notes)))]
