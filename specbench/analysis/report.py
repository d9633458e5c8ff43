"""Reports: the papers' tables and the figures of finished runs, printed and written to a folder.

    python -m specbench.analysis.report results/ --out report/ --format all

A folder of mixed runs (greedy and sampled, other max_new_tokens, ...) is split into comparable groups
(`selection.groups`) and every table is built per group, beside the group's overview; the notes say what each group
is, the exact `--where` that selects it, and every table, cell, speedup or unfinished run left out and why. Runs a
table compares are compared on the example ids they all hold (specbench.analysis.shared), each table's notes say
on how many where a run holds more, and flag runs measured at other machine loads or on other CPUs.

stdout holds the tables, each under a '== <file name> ==' line, caption and notes wrapped; stderr the notes.
`--table NAME` builds only that table; a requested table that cannot be built is named with why and the runs that
would give it (and the exit status is 1 when none could be).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

import pandas as pd

from specbench.analysis import catalog, categories, divergence, figures, intervals, load, selection
from specbench.analysis.baselines import MethodSpec
from specbench.analysis.conventions import CONVENTIONS, convention_table
from specbench.analysis.load import load_runs, where
from specbench.analysis.overview import overview, without_ar
from specbench.analysis.per_position import position_tables
from specbench.analysis import projection_costs as costs
from specbench.analysis.projection_costs import Projection, costs_table
from specbench.analysis.selection import Group, ReportError, labels, unique_labels, where_args
from specbench.analysis.tables import Table, in_group, runs_on
from specbench.common.aggregate import TRUNCATED_WARN_FRAC
from specbench.common.files import write_text_atomic
from specbench.runs import roofline
from specbench.runs.identity import identity
from specbench.runs.projection import ProfileError

log = logging.getLogger(__name__)


def build_tables(runs: pd.DataFrame, names: Iterable[str] | None = None, baseline: str | None = None) -> list:
    """The tables `names` (default: every one in specbench.analysis.catalog.TABLES) that the runs have data for."""
    return [t for name in (names or catalog.TABLES) for t in catalog.build(name, runs, baseline)]


FORMATS = {"md": "markdown", "tex": "latex", "csv": "csv"}


@dataclass
class Report:
    """Every table the runs have data for, group by group, and notes on what was left out and why."""

    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    left_out: int = 0  # tables, cells, speedups or runs refused or missing because of mismatched or unfinished runs
    built: set[str] = field(default_factory=set)  # the names (catalog.TABLES, OVERVIEW) of the tables built
    refused: set[str] = field(default_factory=set)  # the names of the tables refused in a group (each a note)

    def leave_out(self, notes: Iterable[str]) -> None:
        """Add notes on what was left out, each counted in `left_out`."""
        new = list(notes)
        self.notes += new
        self.left_out += len(new)


OVERVIEW = "overview"  # `--table overview`: each group's overview alone


def _truncation_notes(runs: pd.DataFrame) -> list[str]:
    """A warning per run with more than TRUNCATED_WARN_FRAC of its rows truncated at max_new_tokens."""
    bad = runs[runs["truncated_frac"] > TRUNCATED_WARN_FRAC]
    return [f"warning: {r['run_dir']}: {r['n_truncated']:.0f} rows ({r['truncated_frac']:.0%}) stopped at "
            f"max_new_tokens={r['max_new_tokens']:.0f} before the answer: its score measures the cut, not the model; "
            "raise decode.max_new_tokens" for _, r in bad.iterrows()]


def _baseline_elsewhere(group: Group, groups: list[Group], spec: str) -> list[str]:
    """Notes for pairs/datasets of the group with no `spec` run in the group while other groups have one."""
    notes, base = [], MethodSpec.parse(spec)
    for (pair, d), mine in group.runs.groupby(["pair", "dataset"]):
        if not base.runs_in(mine).empty:
            continue
        picks = [f"[{g.title}] {where_args(g.where)}" for g in groups
                 if g is not group and not runs_on(g.runs, base, pair, d).empty]
        if picks:
            notes.append(f"[{group.title}] {pair}/{d}: speedups over {spec} left empty: no {spec} run with this "
                         f"setting; {spec} runs are in other groups ({'; '.join(picks)}), which differ in "
                         f"{', '.join(group.keys)}")
    return notes


def _build(g: Group, names: Iterable[str], baseline: str | None, out: Report) -> list[tuple[str, Table]]:
    """(name, table) of the tables `names` the group's runs have data for, per batch size (named and titled for it
    where the group has several), each name added to out.built; refusals become notes."""
    built = []
    one = g.runs["batch_size"].nunique() <= 1  # else a paper's table compares runs of one batch size
    for b, runs in [(None, g.runs)] if one else [(int(b), r) for b, r in g.runs.groupby("batch_size", sort=True)]:
        for name in names:
            try:
                built += [(name, t if b is None else replace(t, name=f"{t.name}__batch_size={b}",
                                                             title=f"{t.title} · batch_size={b}"))
                          for t in catalog.build(name, runs, baseline)]
            except ReportError as e:
                out.leave_out([f"{name} [{g.title}{'' if b is None else f', batch_size={b}'}]: left out: {e}"])
                out.refused.add(name)
    out.built |= {n for n, _ in built}
    return built


def spanning_groups(runs: pd.DataFrame, keys: Iterable[str]) -> list[Group]:
    """`selection.groups` with the setting keys `keys` table axes too: runs that differ only in them share a group."""
    drop = {tuple(k.split(".")) for k in keys}  # a setting is a run identity already: `identity` drops only these
    stripped = runs.assign(setting=[json.dumps(identity(json.loads(s), drop=drop), sort_keys=True)
                                    for s in runs["setting"]])
    return [replace(g, runs=runs.loc[g.runs.index]) for g in selection.groups(stripped)]


def _beside(g: Group, many: bool, projection: Projection | None, convention: str) -> list[Table]:
    """The tables beside a group's overview: the projection's costs, acceptance per position, per category, the
    divergences from ar and the acceptance in `convention`."""
    each = replace(g, runs=g.runs.assign(label=unique_labels(g.runs)))  # a row per run, as in the overview
    more = [costs_table(each, projection) if projection is not None else None, *position_tables(each),
            categories.category_table(each, convention), divergence.divergence_table(each),
            convention_table(each, convention) if convention != "specbench" else None]
    return [in_group(t, g, many) for t in more if t is not None]


def _table_notes(tables: list[Table]) -> list[str]:
    """The tables' notes (examples compared, loads, CPUs or calibrations apart) for the notes section, each once,
    with the tables it is under."""
    under: dict[str, list[str]] = {}
    for t in tables:
        for n in t.notes:
            under.setdefault(n, []).append(t.name)
    return [f"{n} [under {', '.join(names)}]" for n, names in under.items()]


GROUP_TABLES = ("all", "overview", "none")  # build_report's `group_tables`


def build_report(runs: pd.DataFrame, names: Iterable[str] | None = None, baseline: str | None = None,
                 projection: Projection | None = None, convention: str = "specbench",
                 group_tables: str = "all") -> Report:
    """The tables `names` of catalog.TABLES (default: every one) per comparable group of runs, and (group_tables
    "all") each group's overview, with the `projection` onto a cost profile when given and its acceptance in
    `convention`, and the tables beside it ("overview": the overview alone; "none": neither); a table of
    catalog.SPANS per group of runs that differ only in its keys (e.g. SD² Figure 5's two temperatures).
    Refusals, mismatches and named tables not built (why, and the runs to add: catalog.why_not) become notes, never
    an abort, but for a profile without a drafting run's pair (ProfileError)."""
    if group_tables not in GROUP_TABLES:
        raise ValueError(f"group_tables {group_tables!r}: valid values are {', '.join(GROUP_TABLES)}")
    out, groups = Report(), selection.groups(runs)
    papers = list(names) if names is not None else list(catalog.TABLES)
    wanted = papers + ([OVERVIEW] if group_tables != "none" else [])
    many = len(groups) > 1
    for g in groups:
        if many:
            out.notes.append(f"group [{g.title}]: {len(g.runs)} runs ({', '.join(labels(g.runs))}); they differ "
                             f"from the other groups in {', '.join(g.keys)}; alone: {where_args(g.where)}")
        built = _build(g, [n for n in papers if n not in catalog.SPANS], baseline, out)
        specs = {baseline or catalog.baseline_of(n) for n, _ in built} | ({"ar"} if OVERVIEW in wanted else set())
        out.leave_out(note for spec in sorted(specs) for note in _baseline_elsewhere(g, groups, spec))
        if OVERVIEW in wanted:  # first: the group's overview, then the tables beside it and the papers'
            table, notes = overview(g, many, projection, convention)
            out.tables += [table, *(_beside(g, many, projection, convention) if group_tables == "all" else [])]
            out.leave_out(notes)
            out.notes += without_ar(g.runs, runs)  # no ar run at all: nothing refused, so not counted
            out.built.add(OVERVIEW)
        out.tables += [in_group(t, g, many) for _, t in built]
    for name in (n for n in papers if n in catalog.SPANS):
        spans = spanning_groups(runs, catalog.SPANS[name])
        out.tables += [in_group(t, g, len(spans) > 1) for g in spans for _, t in _build(g, [name], baseline, out)]
    if names is not None:  # each table asked for but neither built nor refused in a group: why, and the runs to add
        out.leave_out(f"{n}: not built: {'no run loaded' if n == OVERVIEW else catalog.why_not(n, runs, baseline)}"
                      for n in wanted if n not in out.built | out.refused)
    if projection is not None and OVERVIEW in wanted:
        out.tables += projection.tables
        out.notes += projection.notes
    out.notes += _table_notes(out.tables) + _truncation_notes(runs)
    return out


def write_tables(tables: list, out: str | Path, fmt: str = "all") -> list[Path]:
    """Each table as <out>/<name>.md / .tex / .csv (fmt: md, tex, csv or all)."""
    if fmt != "all" and fmt not in FORMATS:
        raise ReportError(f"format {fmt!r}: valid formats are {', '.join(FORMATS)}, all")
    exts = list(FORMATS) if fmt == "all" else [fmt]
    Path(out).mkdir(parents=True, exist_ok=True)
    return [write_text_atomic(Path(out) / f"{t.name}.{ext}", getattr(t, FORMATS[ext])())
            for t in tables for ext in exts]


MANIFEST = ".report_files"  # in an --out folder: the files the last report wrote there, replaced by the next


def replace_earlier(out: Path, written: list[Path]) -> None:
    """Remove the files the last report wrote into `out` (its MANIFEST) that this one did not write again, and list
    this one's: no stale table or figure of an earlier report survives beside the new ones."""
    now = {str(p.relative_to(out)) for p in written}
    listed = out / MANIFEST
    for name in listed.read_text().split("\n") if listed.is_file() else []:
        if name and name not in now:
            (out / name).unlink(missing_ok=True)
    write_text_atomic(listed, "".join(f"{name}\n" for name in sorted(now)))


# The CLI's exit status, as researchers' scripts read it (`--help` shows EXIT_STATUS)
OK, LEFT_OUT, ERROR = 0, 1, 2
STRICT_LEFT_OUT = NOTHING_BUILT = LEFT_OUT
EXIT_STATUS = ("exit status: 0 when the report was built, every table the data allow, also when something was "
               "left out (a mismatched or ambiguous comparison, a missing baseline, an unfinished run folder): "
               "each is a 'note:' line on stderr, and the last note counts them; 1 when none of the --table "
               "tables could be built (a note says why and which runs to add), or with --strict when something "
               "was left out (the same tables are still printed and written); 2 on an error: no run folder found, "
               "unreadable input (a results path that does not exist, a corrupt config.json or rows.jsonl), a bad "
               "--table, --where, --baseline or --format, a --profile that is missing, invalid or has no entry for "
               "a drafting run's pair (unless --profile-pair names one)")


def parser() -> argparse.ArgumentParser:
    """The report CLI's arguments."""
    ap = argparse.ArgumentParser(prog="python -m specbench.report", description=__doc__.splitlines()[0],
                                 epilog=EXIT_STATUS)
    ap.add_argument("results", nargs="+", help="results folders (searched recursively for run folders)")
    ap.add_argument("--out", help="folder for table files and figures (printed only when absent); the files an "
                    "earlier report wrote there and this one does not are removed")
    ap.add_argument("--format", default="all", choices=[*FORMATS, "all"], help="table file format(s)")
    ap.add_argument("--baseline", help="speedup baseline METHOD[:key=value,...] for every table "
                    "(default per table: AdaSD vanilla:gamma=5, GammaTune vanilla, SD² vanilla:gamma=8, "
                    "Spec-Bench ar)")
    ap.add_argument("--table", action="append", help="build only this table (repeatable; default: every table the "
                    f"runs allow, each group's overview and the tables beside it): {', '.join(TABLE_NAMES)}")
    ap.add_argument("--where", action="append", default=[],
                    help="keep runs with KEY=VALUE (e.g. decode.temperature=1.0)")
    ap.add_argument("--no-figures", action="store_true", help="skip the figures")
    ap.add_argument("--strict", action="store_true", help="exit 1 when anything was left out (by default the "
                    "report exits 0 and names what it left out in its notes)")
    ap.add_argument("--profile", help="a cost profile (profile.json of `python -m specbench.bench verify --profile` or "
                    "`bench gpu`): the overview adds the speedup each run's own iterations would have at its costs, "
                    "from the entry of the run's pair (by the shapes it recorded, else by name), dtype, path and "
                    "batch size; a profile without the run's pair is an error. roofline:GPU (GPU one of "
                    f"{', '.join(roofline.GPUS)}) prices each forward at that GPU's roofline from the run's shapes, "
                    "times the ratios of the GPU's measured profiles shipped in profiles/, and prints those ratios")
    ap.add_argument("--convention", choices=list(CONVENTIONS), default="specbench",
                    help="acceptance in this engine's convention: the overview's AccRate and τ columns become its "
                         "numbers, named so in the header, with their intervals, and a table of its counts is added "
                         "(vllm: mean acceptance length 1 + accepted / drafting steps, draft acceptance rate; sglang, "
                         "eagle, spec_bench: (accepted + steps) / steps, the bonus token included; docs/design.md, "
                         "Acceptance conventions)")
    ap.add_argument("--time", choices=list(intervals.TIMES), default="decode",
                    help="the time every tok/s and speedup divides by: decode (decode_s, the prompt's prefill and "
                         "first iteration included; the default) or after_first_block (the tokens and seconds after "
                         "each generation's first block)")
    ap.add_argument("--profile-pair", metavar="NAME", help="with --profile: project onto this profile pair's entries "
                    "whatever the runs' pair and dtype (e.g. a toy run onto llama31_8b_1b_shaped on a GPU)")
    return ap


TABLE_NAMES = [*catalog.TABLES, OVERVIEW]  # what --table takes


def _inputs(args: argparse.Namespace) -> tuple[pd.DataFrame, Projection | None, list[str], dict[str, str]]:
    """The runs (every column: the report reads the token ids too), the projection, the unfinished folders and
    {folder: the folder reported for its run}, or ReportError / OSError / ValueError on bad input."""
    unknown = [t for t in args.table or () if t not in TABLE_NAMES]
    if unknown:
        raise ReportError(f"--table {', '.join(unknown)}: unknown; valid tables: {', '.join(TABLE_NAMES)}")
    if args.baseline:
        MethodSpec.parse(args.baseline)  # a malformed --baseline is an error, not a table left out
    found = load_runs(*args.results, full=True)  # logs why it leaves out each unfinished run folder
    same_run = found.attrs.get("same_run_as", {})  # folders of a run reported from another folder
    unfinished = sorted(set(map(str, load.find_run_dirs(args.results))) - set(found["run_dir"]) - set(same_run))
    runs = load.timed(where(found, args.where), args.time)
    projection = costs.projection(args.profile, runs, args.profile_pair) if args.profile else None
    return runs, projection, unfinished, same_run


def _write(rep: Report, runs: pd.DataFrame, args: argparse.Namespace) -> None:
    """The table files and figures (with --table only the figures of the tables built) into --out, replacing the
    files an earlier report wrote there; each file named on stderr."""
    written = write_tables(rep.tables, args.out, args.format)
    if not args.no_figures:
        written += figures.make_figures(runs, args.out, built=rep.tables, per_group=not args.table)
    print("".join(f"wrote {p}\n" for p in written), end="", file=sys.stderr)
    replace_earlier(Path(args.out), written)


def main(argv: list[str] | None = None) -> int:
    """The report CLI: print each table under a '== name ==' line; with --out also write table files and figures;
    the notes (what was left out and why, the tables' flags) on stderr."""
    ap = parser()
    args = ap.parse_args(argv)
    if args.profile_pair and not args.profile:
        ap.error("--profile-pair needs --profile")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        runs, projection, unfinished, same_run = _inputs(args)
    except (ReportError, OSError, ValueError) as e:  # nothing to report on, or input that cannot be read
        print(f"error: {e}", file=sys.stderr)
        return ERROR
    try:
        papers = [t for t in args.table if t != OVERVIEW] if args.table else None  # --table: only what it names
        group_tables = "all" if not args.table else "overview" if OVERVIEW in args.table else "none"
        rep = build_report(runs, papers, args.baseline, projection, args.convention, group_tables)
    except (ReportError, ProfileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return ERROR
    rep.leave_out(f"left out {d}: unfinished (no summary.json, or other rows than it counts)" for d in unfinished)
    rep.notes += [f"{d}: the same run as {kept}, which is reported (not counted as left out)"
                  for d, kept in sorted(same_run.items())]
    for t in rep.tables:
        print(t.heading(), t.markdown(), sep="\n")
    if args.out:
        _write(rep, runs, args)
    nothing = bool(args.table) and not rep.built
    if rep.left_out:
        rep.notes.append(f"{rep.left_out} table(s), cell(s), speedup(s) or run(s) left out, each named above; "
                         + ("none of the tables asked for was built (exit status 1)" if nothing else
                            "every table the data allow was built" + (" (--strict: exit status 1)" if args.strict
                                                                     else "")))
    for note in rep.notes:
        print(f"note: {note}", file=sys.stderr)
    return NOTHING_BUILT if nothing else STRICT_LEFT_OUT if args.strict and rep.left_out else OK


if __name__ == "__main__":
    sys.exit(main())
