"""The tables a report can build, by name (`--table`): each paper's and Spec-Bench's (specbench.analysis's
adasd_tables, gammatune_tables, sd2_tables, sd2_fig5 and spec_bench_table), the keys a table compares across, and
each table's default baseline."""

from __future__ import annotations

from typing import Callable

import pandas as pd

from specbench.analysis import sd2_fig5
from specbench.analysis.adasd_tables import adasd_tables, adasd_tables_3_5
from specbench.analysis.gammatune_tables import gammatune_table2
from specbench.analysis.sd2_tables import sd2_table, sd2_welch
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
