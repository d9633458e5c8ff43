"""The overview table of a comparable group of runs (`selection.Group`), the first table of each group in a report."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.analysis import divergence, intervals, shared
from specbench.analysis.baselines import baseline_or_refusal, speedup_over
from specbench.analysis.conventions import CONVENTIONS, OVERVIEW_COLUMNS
from specbench.analysis.projection_costs import Projection, other_machine
from specbench.analysis.selection import Group, unique_labels
from specbench.analysis.tables import Table, in_group
from specbench.runs.projection import ProfileError, host_per_iteration, project, project_whole

OVERVIEW = ["tok/s", "speedup vs ar", "mean ratio", "predicted", "AccRate", "exact", "relaxed", "τ", "nodes/call",
            "score", "Δscore vs ar", "diverged from ar", "truncated"]
DIFFERS = " ≠0"  # marks a Δscore whose 95% interval leaves out 0
VS_MEASURED = "projected / measured - 1"  # with a profile: the projection's relative difference from the measured
AFTER_FIRST = "measured after 1st block"  # the measured speedup of the generations after their first blocks
VS_AFTER_FIRST = "projected / after 1st block - 1"
WHOLE = "projected with 1st blocks"  # with a profile that has prefills: every generation's first block priced too
VS_WHOLE = "that / measured - 1"
# the columns with a 95% bootstrap interval over the run's prompts (the column is the statistic), and their format
OF_RUN = (("tok/s", ".1f"), ("AccRate", ".3f"), ("τ", ".2f"), ("score", ".3f"))
# the columns of summary fields newer than some runs ("missing" where a run's summary lacks the field), and format
NEWER = (("predicted", "predicted_speedup", ".2f"), ("exact", "acceptance_exact", ".3f"),
         ("relaxed", "acceptance_relaxed", ".3f"), ("nodes/call", "nodes_per_call", ".1f"))


def _cell(x: float, spec: str, missing: bool) -> str:
    return "missing" if missing else "" if pd.isna(x) else format(x, spec)


def _columns(runs: pd.DataFrame, diverged: bool, projection: Projection | None,
             accept: list[tuple[str, str, str]]) -> list[str]:
    """The overview's columns: exact and relaxed only where a run has relaxed acceptance, Δscore where a run has a
    score, divergences where a run was compared with ar; the projection's after predicted; the convention's
    acceptance (`accept`) in place of AccRate and τ."""
    cols = [c for c in OVERVIEW if (c not in ("exact", "relaxed") or (runs["acceptance_relaxed"] > 0).any())
            and (c != "Δscore vs ar" or runs["score"].notna().any()) and (c != "diverged from ar" or diverged)]
    if projection is not None:
        at = cols.index("predicted") + 1
        cols[at:at] = [projection.column, VS_MEASURED, AFTER_FIRST, VS_AFTER_FIRST] + (
            [WHOLE, VS_WHOLE] if any(e.get("target_prefill_s") for e in projection.profile["entries"]) else [])
    if accept:
        at = cols.index("AccRate")
        cols = [c for c in cols if c not in ("AccRate", "τ")]
        cols[at:at] = [c for c, _, _ in accept]
    return cols


def _run_cells(r: pd.Series, base: pd.Series | None, found: list[divergence.Divergence] | None,
               accept: list[tuple[str, str, str]]) -> tuple[dict[str, float], dict[str, str]]:
    """The numbers and printed cells of run r's row but the projection's, against its `ar` run `base`; found: its
    rows that diverged from ar's (divergence.divergences)."""
    _, sp_lo, sp_hi = intervals.of_pair(r, base, "speedup")
    ratio, ratio_lo, ratio_hi = intervals.of_pair(r, base, "mean ratio")
    dscore, dscore_lo, dscore_hi = intervals.of_pair(r, base, "Δscore")
    nums = {"tok/s": r["tokens_per_s_median"], "speedup vs ar": speedup_over(r, base), "mean ratio": ratio,
            "AccRate": r["acceptance_rate"], "τ": r["block_efficiency"], "score": r["score"], "Δscore vs ar": dscore,
            "truncated": r["truncated_frac"], **{c: r[field] for c, field, _ in NEWER}}
    nums["diverged from ar"], diverged = divergence.summary_cell(found, len(shared.held(r)))  # prompts
    text = {c: intervals.text(nums[c], *intervals.of_run(r, c), spec) for c, spec in OF_RUN}
    text |= {c: _cell(nums[c], spec, field in r["missing"]) for c, field, spec in NEWER}
    if text["predicted"] and not pd.isna(r.get("predicted_low", np.nan)):  # the calibration passes' range
        text["predicted"] += f" ({r['predicted_low']:.2f}–{r['predicted_high']:.2f})"
    text |= {"speedup vs ar": intervals.text(nums["speedup vs ar"], sp_lo, sp_hi, ".2f"),
             "mean ratio": intervals.text(ratio, ratio_lo, ratio_hi, ".2f"),
             "Δscore vs ar": intervals.text(dscore, dscore_lo, dscore_hi, "+.3f")
             + (DIFFERS if intervals.excludes_zero(dscore_lo, dscore_hi) else ""), "diverged from ar": diverged,
             "truncated": "missing" if "truncated_frac" in r["missing"] else "" if pd.isna(r["truncated_frac"])
             else f"{r['n_truncated']:.0f} ({r['truncated_frac']:.0%})"}
    for c, stat, spec in accept:  # the convention's acceptance, from the same pooled counts (NaN: ar, draft_only)
        nums[c] = intervals.value(r["prompts"], stat, r["time"]) if r["drafted_total"] else np.nan
        text[c] = intervals.text(nums[c], *intervals.of_run(r, stat), spec) if r["drafted_total"] else ""
    return nums, text


def _projection_cells(r: pd.Series, base: pd.Series | None, sp: float, projection: Projection,
                      whole_shown: bool) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """The numbers and printed cells of run r's projection columns (sp: its measured speedup over its `ar` run
    `base`) and the notes on projections left out. ProfileError when the profile has no entry for a drafting run's
    pair."""
    notes = []
    drafting = r["call_stats"] is not None and r["drafted_total"] > 0  # ar, draft_only: nothing to project
    try:
        host = None if base is None else host_per_iteration(base["call_stats"])  # ar's, per token
        value, why = project(r, projection.profile, projection.pair, host) if drafting else (None, "")
    except ProfileError as e:
        raise ProfileError(f"{e} [run {r['run_dir']}]") from None
    if value is None and drafting:
        notes.append(f"projection of {r['run_dir']} at {projection.profile['name']!r} left out: {why}")
    nums = {projection.column: np.nan if value is None else value}
    nums[VS_MEASURED] = nums[projection.column] / sp - 1
    nums[AFTER_FIRST] = np.nan if base is None else r["after_first_block_tps"] / base["after_first_block_tps"]
    nums[VS_AFTER_FIRST] = nums[projection.column] / nums[AFTER_FIRST] - 1
    whole, why = (None, "") if not drafting or base is None else project_whole(
        r, base, projection.profile, projection.pair, host)
    if whole is None and why and whole_shown:
        notes.append(f"projection of {r['run_dir']} with its first blocks left out: {why}")
    nums[WHOLE] = np.nan if whole is None else whole
    nums[VS_WHOLE] = nums[WHOLE] / sp - 1
    shown = ((projection.column, ".2f"), (VS_MEASURED, "+.1%"), (AFTER_FIRST, ".2f"), (VS_AFTER_FIRST, "+.1%"),
             (WHOLE, ".2f"), (VS_WHOLE, "+.1%"))
    cells = {c: _cell(nums[c], spec, False) for c, spec in shown}
    other = other_machine(r, projection.profile) if value is not None else None
    if other:  # beside the figure, and why in the notes
        cells[projection.column] += " (other machine)"
        notes.append(f"projection of {r['run_dir']} at {projection.profile['name']!r}: {other}")
    return nums, cells, notes


def _title(projection: Projection | None, convention: str, accept: list[tuple[str, str, str]], time: str) -> str:
    """The overview's title: what each column is, the intervals and the time the throughputs divide by."""
    return ("Runs: median tok/s, measured speedup over ar (Σ tokens / Σ time of the run over the same of ar's) and "
            "the mean of the per-prompt speedups beside the predicted one (from call costs; in parentheses its "
            "range over the target_1 calibration's passes), "
            + (f"the projection of its iterations onto the cost profile {projection.profile['name']!r}"
               + (f" (pair {projection.pair})" if projection.pair else "")
               + " and its difference from the measured speedup and from the measured speedup after each "
               "generation's first block (prompt and first iteration left out, as in the predictions), and where "
               "the profile has prefill costs the projection with every first block priced too (the prompt's "
               "forwards and the first drafts: the measured speedup's own scope) and its difference from it, "
               if projection is not None else "")
            + ("acceptance (exact / JS-relaxed), τ, " if not accept else
               f"acceptance in {CONVENTIONS[convention][0]} convention ({'; '.join(c for c, _, _ in accept)}; "
               "A accepted drafts, steps the verify steps, num_drafts the steps that drafted), ")
            + "score and its difference from ar's (≠0: the interval leaves out "
            "0), the rows of a lossless greedy run that differ from ar's (near-tie or suspect: the divergences table), "
            "rows truncated at max_new_tokens; [95% bootstrap interval over prompts and repeats, paired by "
            f"prompt against ar; seed {intervals.SEED}]; time: {intervals.TIMES[time]}")


def without_ar(runs: pd.DataFrame, every: pd.DataFrame) -> list[str]:
    """A note for each pair and dataset of the group `runs` with no `ar` run among `every` run loaded: its speedups
    are empty, and the command that adds one (its first run's decode setting and folder overrides)."""
    notes = []
    for (pair, dataset), runs_here in runs.groupby(["pair", "dataset"], sort=True):
        if ((every["pair"] == pair) & (every["dataset"] == dataset) & (every["method"] == "ar")).any():
            continue
        notes.append(f"{pair} · {dataset} has no ar run, so its 'speedup vs ar' is empty; add one with: "
                     f"{shared.command(runs_here.iloc[0], 'ar')}")
    return notes


def overview(group: Group, many: bool = False, projection: Projection | None = None,
             convention: str = "specbench") -> tuple[Table, list[str]]:
    """One row per run of the group (a block per batch size where there are several): median tok/s, measured
    speedup over the same setting's `ar` run beside predicted_speedup and, with a `projection`, the speedup of the
    run's own iterations at the profile's costs (specbench.runs.projection); acceptance, τ, score, truncated rows;
    and the notes on speedups and projections left empty. The runs of one pair, dataset and batch size are compared
    on the examples they all hold (shared.on_shared: the table's notes say so, and flag loads, CPUs and calibrations
    apart). ProfileError when the profile has no entry for a drafting run's pair."""
    runs, notes = group.runs.copy(), []
    flags: list[str] = []  # the table's notes: examples compared, loads and CPUs apart
    found = {r["run_dir"]: divergence.divergences(r, group.runs) for _, r in group.runs.iterrows()}
    by_batch = runs["batch_size"].nunique() > 1  # then each batch size is a block of rows, named in its heading
    if by_batch:
        runs = runs.sort_values(["pair", "dataset", "batch_size"], kind="stable")
    runs["label"] = unique_labels(runs, ("batch_size",) if by_batch else ())  # one row per run
    where = runs["pair"] + " · " + runs["dataset"]
    if by_batch:
        where += " · batch_size=" + runs["batch_size"].astype(str)
    index = pd.MultiIndex.from_arrays([where, runs["label"]])
    accept = [] if convention == "specbench" else OVERVIEW_COLUMNS[convention]  # in place of AccRate and τ
    cols = _columns(runs, any(found[d] is not None for d in runs["run_dir"]), projection, accept)
    v = pd.DataFrame(np.nan, index=index, columns=pd.MultiIndex.from_product([[""], cols]))
    cells = pd.DataFrame("", index=index, columns=v.columns)
    for at, (_, r) in zip(index, runs.iterrows()):
        base, why = baseline_or_refusal(r, runs, "ar")
        if base is not None:  # the run's row and its speedups over the example ids it and ar both hold
            them = shared.compared([r, base], at[0])
            (r, base), flags = them.runs, flags + list(them.notes)
        nums, text = _run_cells(r, base, found[r["run_dir"]], accept)
        notes += [f"speedup vs ar of {r['run_dir']} left out: {why}"] if why else []
        if projection is not None:
            more, more_text, more_notes = _projection_cells(r, base, nums["speedup vs ar"], projection, WHOLE in cols)
            nums, text, notes = nums | more, text | more_text, notes + more_notes
        for c in cols:
            v.loc[at, ("", c)], cells.loc[at, ("", c)] = nums[c], text[c]
    t = Table("overview", _title(projection, convention, accept, runs["time"].iloc[0]), v, cells,
              index_names=("pair · dataset · batch_size" if by_batch else "pair · dataset", "run"),
              notes=tuple(dict.fromkeys(flags + [f for w, block in runs.groupby(where.values, sort=False)
                                                 for f in shared.calibration_flags(block, w)])))
    return in_group(t, group, many), notes
