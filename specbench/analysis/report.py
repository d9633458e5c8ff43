"""Reports: the papers' tables and the figures of finished runs, printed and written to a folder.

    python -m specbench.analysis.report results/ --out report/ --format all

Runs are read by `specbench.analysis.load`; the tables are `specbench.analysis.tables`, the figures
`specbench.analysis.figures`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Iterable

import pandas as pd

from specbench.analysis import figures, tables
from specbench.analysis.load import SUMMARY_COLUMNS, ReportError, load_runs, where
from specbench.common.files import write_text_atomic

log = logging.getLogger(__name__)


def build_tables(runs: pd.DataFrame, names: Iterable[str] | None = None, baseline: str | None = None) -> list:
    """The tables `names` (default: every one in specbench.analysis.tables.TABLES) that the runs have data for."""
    return [t for name in (names or tables.TABLES) for t in tables.build(name, runs, baseline)]


FORMATS = {"md": "markdown", "tex": "latex", "csv": "csv"}


def write_tables(tables: list, out: str | Path, fmt: str = "all") -> list[Path]:
    """Each table as <out>/<name>.md / .tex / .csv (fmt: md, tex, csv or all)."""
    if fmt != "all" and fmt not in FORMATS:
        raise ReportError(f"format {fmt!r}: valid formats are {', '.join(FORMATS)}, all")
    exts = list(FORMATS) if fmt == "all" else [fmt]
    Path(out).mkdir(parents=True, exist_ok=True)
    return [write_text_atomic(Path(out) / f"{t.name}.{ext}", getattr(t, FORMATS[ext])()) for t in tables for ext in exts]


def main(argv: list[str] | None = None) -> int:
    """The report CLI: print the run list and tables; with --out also write table files and figures."""
    ap = argparse.ArgumentParser(prog="python -m specbench.analysis.report", description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="results folders (searched recursively for run folders)")
    ap.add_argument("--out", help="folder for table files and figures (printed only when absent)")
    ap.add_argument("--format", default="all", choices=[*FORMATS, "all"], help="table file format(s)")
    ap.add_argument("--baseline", help="speedup baseline METHOD[:key=value,...] for every table "
                    "(default per table: AdaSD vanilla:gamma=5, GammaTune vanilla, SD² vanilla:gamma=8)")
    ap.add_argument("--table", action="append", help=f"a table to build (repeatable; default all): {', '.join(tables.TABLES)}")
    ap.add_argument("--where", action="append", default=[], help="keep runs with KEY=VALUE (e.g. decode.temperature=1.0)")
    ap.add_argument("--no-figures", action="store_true", help="skip the figures")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        runs = where(load_runs(*args.results), args.where)
    except (ReportError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(runs[SUMMARY_COLUMNS].to_string(index=False, float_format=lambda x: f"{x:.3f}"), end="\n\n")
    failed = 0
    built = []
    for name in args.table or list(tables.TABLES):
        try:
            built += tables.build(name, runs, args.baseline)
        except ReportError as e:
            print(f"{name}: refused: {e}", file=sys.stderr)
            failed += 1
    for t in built:
        print(t.markdown())
    if args.out:
        for p in write_tables(built, args.out, args.format):
            print(f"wrote {p}")
        if not args.no_figures:
            for p in figures.make_figures(runs, args.out):
                print(f"wrote {p}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
