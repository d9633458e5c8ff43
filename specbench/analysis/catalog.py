"""The tables a report can build, by name (`--table`): each paper's and Spec-Bench's (specbench.analysis's
adasd_tables, gammatune_tables, sd2_tables, sd2_fig5 and spec_bench_table), the keys a table compares across, and
each table's default baseline and what it needs (`why_not`: the runs to add when it cannot be built)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from specbench.analysis import sd2_fig5
from specbench.analysis.adasd_tables import ADASD_ROWS, VARIANT_ROWS, adasd_tables, adasd_tables_3_5
from specbench.analysis.baselines import MethodSpec
from specbench.analysis.gammatune_tables import GAMMATUNE_ROWS, gammatune_table2
from specbench.analysis.sd2_tables import SD2_ROWS, sd2_table, sd2_welch
from specbench.analysis.selection import ReportError
from specbench.analysis.spec_bench_table import spec_bench_table
from specbench.analysis.tables import BASELINES, Table


TABLES: dict[str, Callable[[pd.DataFrame, str | None], list[Table]]] = {
    "adasd_table1_2": adasd_tables,
    "adasd_tables3_5": adasd_tables_3_5,
    "gammatune_table2": gammatune_table2,
    "sd2_table1": lambda runs, b: sd2_table(runs, 1.0, b),
    "sd2_table5": lambda runs, b: sd2_table(runs, 0.0, b),
    "sd2_table3": lambda runs, b: sd2_welch(runs, 1.0, b),
    "sd2_fig5": lambda runs, b: sd2_fig5.sd2_fig5_table(runs, b),
    "spec_bench": spec_bench_table,
}
# tables that compare runs across setting keys besides the axes (pair, dataset, seed, batch_size): the report
# groups their runs with these keys as axes too (SD² Figure 5: T = 0 beside T = 1)
SPANS: dict[str, tuple[str, ...]] = {"sd2_fig5": ("decode.temperature",)}


def baseline_of(name: str) -> str:
    """The default speedup baseline of the table registered as `name` (its paper's, or its benchmark's)."""
    return BASELINES.get(name) or BASELINES[name.split("_")[0]]


def build(name: str, runs: pd.DataFrame, baseline: str | None = None) -> list[Table]:
    """The tables registered as `name` (see TABLES), built from runs."""
    if name not in TABLES:
        raise ReportError(f"unknown table {name!r}; valid tables: {', '.join(TABLES)}")
    return TABLES[name](runs, baseline)


@dataclass(frozen=True)
class Needs:
    """What a table is built from: the runs of its rows' methods beside its baseline's, at a temperature or on a
    dataset where it has one, and the experiment (conf/experiment/<name>.yaml) that runs the paper's whole sweep."""

    experiment: str
    methods: tuple[str, ...]  # its rows' methods but the baseline's; (): any method
    temperature: float | None = None
    dataset: str | None = None


def _methods(*rows: list[tuple[str, str | None]]) -> tuple[str, ...]:
    return tuple(m for table in rows for _, m in table if m is not None)


NEEDS = {"adasd_table1_2": Needs("adasd_table1", _methods(ADASD_ROWS)),
         "adasd_tables3_5": Needs("adasd_tables3_5", _methods(ADASD_ROWS, VARIANT_ROWS)),
         "gammatune_table2": Needs("gammatune_table2", _methods(GAMMATUNE_ROWS)),
         "sd2_table1": Needs("sd2_table1", _methods(SD2_ROWS), 1.0),
         "sd2_table5": Needs("sd2_table5", _methods(SD2_ROWS), 0.0),
         "sd2_table3": Needs("sd2_table1", _methods(SD2_ROWS), 1.0),
         "sd2_fig5": Needs("sd2_fig5", _methods(sd2_fig5.FIG5_ROWS)),
         "spec_bench": Needs("spec_bench_table", (), dataset="spec_bench")}


def _run_command(methods: list[str], options: tuple, runs: pd.DataFrame, need: Needs) -> str:
    """python run.py [-m] method=... [its options] pair=... dataset=... [decode=...] for the runs' pairs and datasets
    (PAIR where there are none)."""
    pairs = ",".join(sorted(set(runs["pair"]))) or "PAIR"
    datasets = need.dataset or ",".join(sorted(set(runs["dataset"]))) or "DATASET"
    decode = {None: [], 0.0: ["decode=greedy"], 1.0: ["decode=t1"]}.get(need.temperature, [])
    sweep = len(methods) > 1 or "," in pairs or "," in datasets
    return " ".join(["python run.py", *(["-m"] if sweep else []), f"method={','.join(methods)}",
                     *(f"method.{k}={v}" for k, v in options), f"pair={pairs}", f"dataset={datasets}", *decode])


def why_not(name: str, runs: pd.DataFrame, baseline: str | None = None) -> str:
    """Why the table `name` has no number for `runs` (no run at its temperature or on its dataset, none of its
    methods, no baseline run, none on one pair and dataset with a baseline run) and the commands that run what it
    lacks, with the paper's whole sweep."""
    need, base = NEEDS[name], MethodSpec.parse(baseline or baseline_of(name))
    at = runs if need.temperature is None else runs[runs["temperature"] == need.temperature]
    at = at if need.dataset is None else at[at["dataset"] == need.dataset]
    where = (f" at temperature {need.temperature:g}" if need.temperature is not None else "") + (
        f" on {need.dataset}" if need.dataset else "")
    have = set(at["method"]) & set(need.methods) if need.methods else set(at["method"]) - {base.name}
    no_base = base.runs_in(at).empty
    add = [_run_command(list(need.methods) or ["METHOD"], (), runs, need)] if not have else []
    add += [_run_command([base.name], base.options, runs, need)] if no_base else []
    if not have and no_base:
        why = f"no run of its methods ({', '.join(need.methods) or 'any'}) nor of its baseline {base}{where}"
    elif not have:
        why = f"no run of its methods ({', '.join(need.methods) or f'any but {base}'}){where}"
    elif add:
        why = f"no run of its baseline {base}{where}, which its speedups divide by"
    else:
        why = (f"no pair and dataset holds both a run of its methods ({', '.join(sorted(have))}) and a {base} "
               f"run{where}")
    return (f"{why}; add {'them' if len(add) > 1 else 'it'} with: {'; '.join(add)}" if add else why) + (
        f" (the whole sweep: python run.py -m experiment={need.experiment} "
        f"pair={','.join(sorted(set(runs['pair']))) or 'PAIR'})")
