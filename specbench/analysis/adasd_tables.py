"""AdaSD's tables, rebuilt from a runs DataFrame (`specbench.analysis.load.load_runs`): Table 1 (tk/sec, JSDist,
acc, speedup per dataset), Table 2 (#cand, #match, AccRate, speedup), Tables 3-5 (one per dataset, all columns,
Variants A-C). Speedup over `vanilla` with γ=5; tk/sec, acc, AccRate and speedup carry their 95% bootstrap interval
over prompts (`specbench.analysis.intervals`).
"""

from __future__ import annotations

import pandas as pd

from specbench.analysis import intervals, shared
from specbench.analysis.baselines import MethodSpec, find_baseline, speedup_over
from specbench.analysis.tables import (BASELINES, Table, ambiguous, dataset_label, fmt_cells, has_data, method_specs,
                                       ordered, pair_labels, runs_on, skeleton)

ADASD_ROWS: list[tuple[str, str | None]] = [
    ("Draft", "draft_only"), ("Target", "ar"), ("Vanilla", None), ("AssistedGen", "hf_assisted"),
    ("Gen-Only", "adasd_gen_only"), ("Verify-Only", "adasd_verify_only"), ("AdaSD", "adasd")]
VARIANT_ROWS: list[tuple[str, str | None]] = [("Variant A", "adasd_variant_a"), ("Variant B", "adasd_variant_b"),
                                              ("Variant C", "adasd_variant_c")]
ADASD_COLUMNS = {"tk/sec": "tokens_per_s_median", "JSDist": "mean_t_v", "#cand": "mean_drafted", "#match": "mean_accepted",
                 "AccRate": "acceptance_rate", "acc": "score", "speedup": "speedup"}
ADASD_TABLE_OF = {"gsm8k": "adasd_table3", "humaneval": "adasd_table4", "mmlu": "adasd_table5"}
# Tables 1 and 2: name, the first of ADASD_ROWS shown, the columns and what they show
TABLES_1_2 = [("adasd_table1", 0, ["tk/sec", "JSDist", "acc", "speedup"], "speed, JS threshold, accuracy"),
              ("adasd_table2", 2, ["#cand", "#match", "AccRate", "speedup"], "candidates, matches, acceptance rate")]
# the AdaSD columns that carry a 95% bootstrap interval over prompts (specbench.analysis.intervals), by statistic
_INTERVAL_OF = {"tokens_per_s_median": "tok/s", "acceptance_rate": "AccRate", "score": "score"}


def _repeats_note(runs: pd.DataFrame) -> str:
    """How the intervals of the AdaSD tables are made (and that tk/sec is a median where runs have repeats)."""
    repeats = (runs["repeats"] > 1).any()
    return ("; [95% bootstrap interval over prompts" + (" and repeats" if repeats else "")
            + f", paired by prompt for speedup; seed {intervals.SEED}]"
            + ("; tk/sec: median over repeats" if repeats else ""))


def _interval(run: pd.Series, key: str, base: pd.Series | None) -> tuple[float, float]:
    """The 95% bootstrap interval of the cell `key` of run (speedup: paired by prompt with `base`); NaN, NaN for
    the columns without one (#cand, #match, JSDist)."""
    if key == "speedup":
        return intervals.of_pair(run, base, "speedup")[1:]
    if key in _INTERVAL_OF:
        return intervals.of_run(run, _INTERVAL_OF[key])
    return float("nan"), float("nan")


def _pick(runs: pd.DataFrame, table: str, pair: str, dataset: str, label: str, spec: MethodSpec) -> pd.Series | None:
    """The one run of spec on pair and dataset, None if there is none, ReportError if several."""
    c = runs_on(runs, spec, pair, dataset)
    if len(c) > 1:
        raise ambiguous(table, f"{label} ({spec}) on {pair}/{dataset}", c)
    return c.iloc[0] if len(c) else None


def _runs_of(runs: pd.DataFrame, rows: list[tuple[str, MethodSpec]]) -> pd.DataFrame:
    """The runs of every row's spec."""
    return pd.concat([s.runs_in(runs) for _, s in rows])


def _adasd_values(runs: pd.DataFrame, table: str, rows: list[tuple[str, MethodSpec]], columns: list[str],
                  datasets: list[str], base: MethodSpec) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """values[(pair label, row), (dataset label, column)] from the one run per cell; speedup vs its baseline run, the
    cell's run and its baseline on the example ids both hold (shared.compared: every column of the cell over them);
    the printed cells: values with their 95% bootstrap interval ' [lo–hi]' on tk/sec, acc, AccRate, speedup; and the
    notes (examples compared where a run holds more, loads or CPUs apart)."""
    pairs = pair_labels(_runs_of(runs, rows))
    v = skeleton(list(pairs.values()), [r for r, _ in rows], [dataset_label(d) for d in datasets], columns)
    spread: dict = {}
    notes: list[str] = []
    for pair, plabel in pairs.items():
        for label, spec in rows:
            for d in datasets:
                run = _pick(runs, table, pair, d, label, spec)
                if run is None:
                    continue
                b = find_baseline(run, runs, base) if any(ADASD_COLUMNS[c] == "speedup" for c in columns) else None
                if b is not None:
                    pairing = shared.compared([run, b], f"{plabel} · {dataset_label(d)}")
                    (run, b), notes = pairing.runs, notes + list(pairing.notes)
                for col in columns:
                    key, at = ADASD_COLUMNS[col], ((plabel, label), (dataset_label(d), col))
                    v.loc[at] = speedup_over(run, b) if key == "speedup" else run[key]
                    spread[at] = _interval(run, key, b)
    cells = fmt_cells(v, ".3f")
    for (row, column), (lo, hi) in spread.items():
        if pd.notna(lo) and pd.notna(hi):
            cells.loc[row, column] += f" [{lo:.3f}–{hi:.3f}]"
    return v, cells, list(dict.fromkeys(notes))


def adasd_tables(runs: pd.DataFrame, baseline: str | None = None) -> list[Table]:
    """AdaSD Table 1 and Table 2 over every dataset present (the paper's GSM8K, HumanEval, MMLU first)."""
    base = MethodSpec.parse(baseline or BASELINES["adasd"])
    rows = method_specs(ADASD_ROWS, base)
    datasets = ordered(set(_runs_of(runs, rows)["dataset"]), list(ADASD_TABLE_OF))
    out = []
    for name, first, columns, what in TABLES_1_2:
        v, cells, notes = _adasd_values(runs, name, rows[first:], columns, datasets, base)
        if has_data(v, "Vanilla"):
            out.append(Table(name, f"AdaSD Table {name[-1]}: {what} and speedup vs Vanilla ({base})"
                             f"{_repeats_note(runs)}", v, cells, notes=tuple(notes)))
    return out


def adasd_tables_3_5(runs: pd.DataFrame, baseline: str | None = None) -> list[Table]:
    """AdaSD Tables 3-5: one table per dataset with every column and Variants A-C."""
    base = MethodSpec.parse(baseline or BASELINES["adasd"])
    rows = method_specs(ADASD_ROWS + VARIANT_ROWS, base)
    out = []
    for d in ordered(set(_runs_of(runs, rows)["dataset"]), list(ADASD_TABLE_OF)):
        name = ADASD_TABLE_OF.get(d, f"adasd_appendix_{d}")
        v, cells, notes = _adasd_values(runs, f"adasd tables 3-5 ({d})", rows, list(ADASD_COLUMNS), [d], base)
        v.columns = pd.MultiIndex.from_tuples([("", c) for _, c in v.columns])
        cells.columns = v.columns
        if has_data(v, "Vanilla"):
            which = f"Table {name[-1]}" if d in ADASD_TABLE_OF else "Tables 3-5 layout"
            out.append(Table(name, f"AdaSD {which}: inference results on {dataset_label(d)} "
                                   f"(speedup vs {base}){_repeats_note(runs)}", v, cells, notes=tuple(notes)))
    return out
