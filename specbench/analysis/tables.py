"""The report's `Table` (rendered as Markdown, LaTeX and CSV) and the parts the papers' table builders share.

Every builder (`adasd_tables`, `gammatune_tables`, `sd2_tables`, `spec_bench_table`, `sd2_fig5`) returns a list of
`Table`s (empty when none of the table's methods has a run), with the papers' row labels and column names. A cell
that more than one run fits (e.g. greedy and sampled runs of one method) is refused with the runs' names.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from specbench.analysis.baselines import MethodSpec
from specbench.analysis.selection import Group, ReportError, differing_keys, slug, where_args, where_exprs
from specbench.common.configs import differences

DATASET_LABELS = {"gsm8k": "GSM8K", "humaneval": "HumanEval", "mmlu": "MMLU", "ultrachat": "UltraChat",
                  "xsum": "XSum", "alpaca": "Alpaca", "alpaca_eval": "AlpacaEval", "spec_bench": "Spec-Bench",
                  "mt_bench": "MT-Bench"}
BASELINES = {"adasd": "vanilla:gamma=5", "gammatune": "vanilla", "sd2": "vanilla:gamma=8", "spec_bench": "ar"}
WIDTH = 100  # a caption's or note's lines are wrapped at this width (Markdown, stdout)
TEX = {"τ": r"$\tau$", "α": r"$\alpha$", "γ": r"$\gamma$", "±": r"$\pm$", "×": r"$\times$", "–": "--", "²": r"$^2$"}


@dataclass
class Table:
    """One rendered table: values (numbers, NaN = no data) and cells (the printed strings, "" = no data), with
    values' index and its columns or fewer, where one cell prints several numbers (SD²'s τ ± std)."""

    name: str  # file stem, e.g. adasd_table1
    title: str
    values: pd.DataFrame  # index (group, row label); columns (group, column name)
    cells: pd.DataFrame
    bold: pd.DataFrame | None = None  # True where a cell is printed bold (SD² Table 3: p <= 0.05)
    index_names: tuple[str, str] = ("pair", "method")
    # printed under the table: how many examples it compared where runs held others, and its flags
    # (specbench.analysis.shared); in LaTeX appended to the caption
    notes: tuple[str, ...] = ()

    @staticmethod
    def _flat(columns: pd.Index) -> list[str]:
        return [" ".join(str(c) for c in col if c) for col in columns]

    def heading(self) -> str:
        """The line that labels the table on stdout: '== overview__greedy ==' (its file name's stem)."""
        return f"== {self.name} =="

    def markdown(self) -> str:
        """GitHub Markdown: the title (bold, wrapped at WIDTH), a bold group line (the pair) above each block of
        rows and the notes under the table (by hand: DataFrame.to_markdown needs the optional tabulate package)."""
        out = [textwrap.fill(f"**{self.title}**", WIDTH, break_long_words=False, break_on_hyphens=False), ""]
        head = [self.index_names[1], *self._flat(self.cells.columns)]
        for group, block in self.cells.groupby(level=0, sort=False):
            if group:
                out += [f"*{group}*", ""]
            out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for (g, row), cells in block.iterrows():
                marks = self.bold.loc[(g, row)] if self.bold is not None else [False] * len(cells)
                shown = (f"**{c}**" if b and c else c for c, b in zip(cells, marks))
                out.append("| " + " | ".join([row, *shown]) + " |")
            out.append("")
        out += [textwrap.fill(f"note: {n}", WIDTH, subsequent_indent="  ", break_long_words=False,
                              break_on_hyphens=False) for n in self.notes]
        return "\n".join(out + ([""] if self.notes else []))

    def latex(self) -> str:
        """A LaTeX tabular (booktabs rules, multicolumn dataset headers, multirow pair groups)."""
        def tex(s: str) -> str:
            s = str(s).replace("\\", r"\textbackslash{}")
            for a in "&%$#_{}":
                s = s.replace(a, "\\" + a)
            for a, b in TEX.items():
                s = s.replace(a, b)
            return s

        cells = self.cells.map(tex)
        if self.bold is not None:
            cells = cells.where(~self.bold | (cells == ""), "\\textbf{" + cells + "}")
        cells.index = pd.MultiIndex.from_tuples([(tex(a), tex(b)) for a, b in cells.index], names=self.index_names)
        cells.columns = pd.MultiIndex.from_tuples([tuple(tex(c) for c in col) for col in cells.columns])
        if not any(cells.index.get_level_values(0)):  # one group (GammaTune): no pair column
            cells = cells.droplevel(0)
        if not any(cells.columns.get_level_values(1)):  # one header row
            cells = cells.droplevel(1, axis=1)
        return cells.to_latex(escape=False, multicolumn=True, multicolumn_format="c", multirow=True,
                              caption=tex(" ".join([self.title, *(f"Note: {n}" for n in self.notes)])),
                              label=f"tab:{self.name}", na_rep="")

    def csv(self) -> str:
        """The numbers (full precision, empty = no data), one column per flattened header."""
        v = self.values.copy()
        v.columns = self._flat(v.columns)
        v.index.names = list(self.index_names)
        if not any(v.index.get_level_values(0)):  # one group (GammaTune): no pair column
            v = v.droplevel(0)
        return v.to_csv()


def in_group(t: Table, group: Group, many: bool) -> Table:
    """The table named and titled for its group where the runs form several groups."""
    return t if not many else replace(t, name=f"{t.name}__{slug(group.title)}", title=f"{t.title} [{group.title}]")


def dataset_label(dataset: str) -> str:
    """The papers' name of a dataset (DATASET_LABELS), else its config name."""
    return DATASET_LABELS.get(dataset, dataset)


def fmt_cells(values: pd.DataFrame, spec: str) -> pd.DataFrame:
    return values.map(lambda x: "" if pd.isna(x) else format(x, spec))


def ordered(names: set[str], order: list[str]) -> list[str]:
    """names in `order` first, then the others sorted."""
    return [n for n in order if n in names] + sorted(names - set(order))


def method_specs(rows: list[tuple[str, str | None]], baseline: MethodSpec) -> list[tuple[str, MethodSpec]]:
    """(label, spec) per row; the None row is the baseline (Vanilla / SpecDecode / Pretrained)."""
    return [(label, baseline if m is None else MethodSpec(m)) for label, m in rows]


def pair_labels(runs: pd.DataFrame) -> dict[str, str]:
    """Pair config name -> the label shown (the hub model names, or the name when labels collide)."""
    labels = dict(zip(runs["pair"], runs["pair_label"]))
    dup = {v for v in labels.values() if list(labels.values()).count(v) > 1}
    return {p: (p if lab in dup else lab) for p, lab in labels.items()}


def runs_on(runs: pd.DataFrame, spec: MethodSpec, pair: str, dataset: str) -> pd.DataFrame:
    """The runs of spec on pair and dataset."""
    return spec.runs_in(runs[(runs["pair"] == pair) & (runs["dataset"] == dataset)])


def ambiguous(table: str, what: str, cands: pd.DataFrame) -> ReportError:
    """The refusal of a cell several runs fit: the keys they differ in and the `--where` that selects each."""
    keys = differing_keys(cands["flat"])
    picks = [f"{d}: {where_args(where_exprs(f, keys) or [f'run_dir={d}'])}"
             for d, f in zip(cands["run_dir"], cands["flat"])]
    return ReportError(f"{table}: {len(cands)} runs fit {what}; they differ in "
                       f"{', '.join(keys) or 'nothing but their folder'}; select one with " + "; ".join(picks))


def same_setting(cands: pd.DataFrame, table: str, what: str, ignore: tuple[str, ...] = ()) -> None:
    """Refuse runs that are averaged or compared together but differ in setting (besides `ignore` keys)."""
    first = json.loads(cands.iloc[0]["setting"])
    for _, r in cands.iloc[1:].iterrows():
        diffs = [d for d in differences(first, json.loads(r["setting"])) if d.split(" ")[0] not in ignore]
        if diffs:
            raise ReportError(f"{table}: refusing to combine {what}: {cands.iloc[0]['run_dir']} and {r['run_dir']} "
                              f"differ in {'; '.join(diffs)}; select runs with --where")


def skeleton(groups: list[str], rows: list[str], tops: list[str], cols: list[str]) -> pd.DataFrame:
    return pd.DataFrame(np.nan, index=pd.MultiIndex.from_product([groups, rows]),
                        columns=pd.MultiIndex.from_product([tops, cols]))


def throughput_by(examples: pd.DataFrame, by: str) -> pd.Series:
    """tokens/s per value of the rows' column `by`: Σ new_tokens / Σ decode_s of the rows with that value."""
    sums = examples.groupby(by)[["new_tokens", "decode_s"]].sum()
    return sums["new_tokens"] / sums["decode_s"]


def has_data(values: pd.DataFrame, baseline_label: str) -> bool:
    """True when a row other than the baseline's holds a number (else the table is not built)."""
    rows = values.index.get_level_values(1) != baseline_label
    return bool(values[rows].notna().any().any())
