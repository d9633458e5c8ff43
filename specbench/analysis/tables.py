"""The papers' tables, rebuilt from a runs DataFrame (`specbench.analysis.load.load_runs`).

Every builder returns a list of `Table`s (empty when none of the table's methods has a run): `values`
holds the numbers (NaN = no data, shown as an empty cell), `cells` the printed strings. Row labels and
column names are the papers'. A table cell that more than one run fits (e.g. greedy and sampled runs
of one method) is refused with the runs' names; select runs first (`load.where`, CLI `--where`).

- AdaSD Table 1 (tk/sec, JSDist, acc, speedup per dataset), Table 2 (#cand, #match, AccRate, speedup),
  Tables 3-5 (one per dataset, all columns, Variants A-C). Speedup over `vanilla` with γ=5.
- GammaTune Table 2: speedup over fixed-γ speculative decoding, mean ± std over the initial γ grid.
  The paper's own SpecDecode row reads 1.00 ± 0.28: each run's throughput is divided by the *mean*
  throughput of `vanilla` over the grid (normalize="grid", the default). normalize="paired" divides
  by `vanilla` at the same γ instead (SpecDecode is then 1.00 ± 0.00). The std is over the fixed grid
  (numpy's ddof=0). "Average" = mean over pairs of the means ± mean of the stds (how the paper's
  Average column adds up, e.g. HFHeuristic 1.11 = mean(1.14, 1.04, 1.12, 1.12)). Initial γ is every
  method's option `gamma` (the runs' column `gamma`).
- SD² Table 1 (T=1) / Table 5 (T=0): τ = block efficiency, mean ± sample std (ddof=1) over seeds;
  α = throughput over the pretrained drafter's run with the same seed (the paper: "the increase in
  tokens generated per second"), mean over seeds; "Mean" = mean over datasets (std: mean of the stds,
  as the paper's Mean column adds up). Table 3: Welch's t-test of the seeds' τ against Pretrained's.
- Spec-Bench's leaderboard (its README's columns): per run on dataset spec_bench, the speedup over `ar` on each
  task group = Σ new tokens / Σ decode s of the group's rows over the same of `ar`'s rows (the rows' `task`; the
  `ar` run of the same setting and examples, `load.find_baseline`); #Mean Accepted Tokens = (A + I) / I, Spec-Bench's own
  (accepted drafts plus one bonus token per verify step, over the steps: aggregate.accept_length);
  Overall = the run's speedup (`load.speedup_over`). Spec-Bench's own speed.py averages per-question tok/s instead.
- SD² Figure 5 (`sd2_fig5`, module specbench.analysis.sd2_fig5): τ of EAGLE-3*, Pretrained, Distilled, SD² per pair
  at T = 0 and T = 1, mean over datasets of the mean over seeds; its runs span temperatures (SPANS).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd
from scipy import stats

from specbench.analysis import intervals
from specbench.analysis.load import (MethodSpec, ReportError, differing_keys, find_baseline, labels, load_examples,
                                     select, selectors, speedup, speedup_over, where_args)
from specbench.common.aggregate import accept_length
from specbench.common.configs import differences

log = logging.getLogger(__name__)

DATASET_LABELS = {"gsm8k": "GSM8K", "humaneval": "HumanEval", "mmlu": "MMLU", "ultrachat": "UltraChat",
                  "xsum": "XSum", "alpaca": "Alpaca", "alpaca_eval": "AlpacaEval", "spec_bench": "Spec-Bench",
                  "mt_bench": "MT-Bench"}
ADASD_ROWS = [("Draft", "draft_only"), ("Target", "ar"), ("Vanilla", None), ("AssistedGen", "hf_assisted"),
              ("Gen-Only", "adasd_gen_only"), ("Verify-Only", "adasd_verify_only"), ("AdaSD", "adasd")]
VARIANT_ROWS = [("Variant A", "adasd_variant_a"), ("Variant B", "adasd_variant_b"), ("Variant C", "adasd_variant_c")]
ADASD_COLUMNS = {"tk/sec": "tokens_per_s_median", "JSDist": "mean_t_v", "#cand": "mean_drafted", "#match": "mean_accepted",
                 "AccRate": "acceptance_rate", "acc": "score", "speedup": "speedup"}
ADASD_TABLE_OF = {"gsm8k": "adasd_table3", "humaneval": "adasd_table4", "mmlu": "adasd_table5"}
GAMMATUNE_ROWS = [("SpecDecode", None), ("HFHeuristic", "heuristic"), ("AssistantThreshold", "confidence"),
                  ("GammaTune", "gammatune"), ("GammaTune+", "gammatune_plus")]
SD2_ROWS = [("Pretrained", None), ("Distilled", "distilled"), ("SD²", "sd2")]
BASELINES = {"adasd": "vanilla:gamma=5", "gammatune": "vanilla", "sd2": "vanilla:gamma=8", "spec_bench": "ar"}
# Spec-Bench's leaderboard columns (its README) and the rows' `task` (evaluators/spec_bench.py) behind each
SPEC_BENCH_TASKS = {"Multi-turn Conversation": "mt_bench", "Translation": "translation", "Summarization": "summarization",
                    "Question Answering": "qa", "Mathematical Reasoning": "math_reasoning",
                    "Retrieval-aug. Generation": "rag"}
SPEC_BENCH_COLUMNS = [*SPEC_BENCH_TASKS, "#Mean Accepted Tokens", "Overall"]
# the leaderboard's names of the head methods (a row's label starts with them; other methods keep their names)
SPEC_BENCH_LABELS = {"eagle3": "EAGLE-3", "eagle3_tree": "EAGLE-3 (tree)", "medusa": "Medusa", "lookahead": "Lookahead",
                     "suffix": "SuffixDecoding"}
TEX = {"τ": r"$\tau$", "α": r"$\alpha$", "γ": r"$\gamma$", "±": r"$\pm$", "×": r"$\times$", "–": "--", "²": r"$^2$"}


@dataclass
class Table:
    """One rendered table: values (numbers, NaN = no data) and cells (the printed strings, "" = no data).

    cells has values' index; its columns are values' columns, or fewer where one cell prints several
    numbers (GammaTune's mean ± std, SD²'s τ ± std).
    """

    name: str  # file stem, e.g. adasd_table1
    title: str
    values: pd.DataFrame  # index (group, row label); columns (group, column name)
    cells: pd.DataFrame
    bold: pd.DataFrame | None = None  # True where a cell is printed bold (SD² Table 3: p <= 0.05)
    index_names: tuple[str, str] = ("pair", "method")

    @staticmethod
    def _flat(columns: pd.Index) -> list[str]:
        return [" ".join(str(c) for c in col if c) for col in columns]

    def markdown(self) -> str:
        """GitHub Markdown: a bold group line (the pair) above each block of rows.

        Written by hand rather than with DataFrame.to_markdown, which needs the optional tabulate package.
        """
        out = [f"**{self.title}**", ""]
        head = [self.index_names[1], *self._flat(self.cells.columns)]
        for group, block in self.cells.groupby(level=0, sort=False):
            if group:
                out += [f"*{group}*", ""]
            out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for (g, row), cells in block.iterrows():
                marks = self.bold.loc[(g, row)] if self.bold is not None else [False] * len(cells)
                out.append("| " + " | ".join([row, *(f"**{c}**" if b and c else c for c, b in zip(cells, marks))]) + " |")
            out.append("")
        return "\n".join(out)

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
                              caption=tex(self.title), label=f"tab:{self.name}", na_rep="")

    def csv(self) -> str:
        """The numbers (full precision, empty = no data), one column per flattened header."""
        v = self.values.copy()
        v.columns = self._flat(v.columns)
        v.index.names = list(self.index_names)
        if not any(v.index.get_level_values(0)):  # one group (GammaTune): no pair column
            v = v.droplevel(0)
        return v.to_csv()


def fmt_cells(values: pd.DataFrame, spec: str) -> pd.DataFrame:
    return values.map(lambda x: "" if pd.isna(x) else format(x, spec))


def _ordered(names: set[str], order: list[str]) -> list[str]:
    return [n for n in order if n in names] + sorted(names - set(order))


def method_specs(rows: list[tuple[str, str | None]], baseline: MethodSpec) -> list[tuple[str, MethodSpec]]:
    """(label, spec) per row; the None row is the baseline (Vanilla / SpecDecode / Pretrained)."""
    return [(label, baseline if m is None else MethodSpec(m)) for label, m in rows]


def _of(runs: pd.DataFrame, spec: MethodSpec) -> pd.DataFrame:
    return select(runs, (spec.matches(r) for _, r in runs.iterrows()))


def pair_labels(runs: pd.DataFrame) -> dict[str, str]:
    """Pair config name -> the label shown (the hub model names, or the name when labels collide)."""
    labels = dict(zip(runs["pair"], runs["pair_label"]))
    dup = {v for v in labels.values() if list(labels.values()).count(v) > 1}
    return {p: (p if lab in dup else lab) for p, lab in labels.items()}


def _ambiguous(table: str, what: str, cands: pd.DataFrame) -> ReportError:
    """The refusal of a cell several runs fit: the keys they differ in and the `--where` that selects each."""
    keys = differing_keys(cands["flat"])
    picks = [f"{d}: {where_args(w or [f'run_dir={d}'])}"
             for d, w in zip(cands["run_dir"], selectors(cands, keys))]
    return ReportError(f"{table}: {len(cands)} runs fit {what}; they differ in "
                       f"{', '.join(keys) or 'nothing but their folder'}; select one with " + "; ".join(picks))


def _pick(runs: pd.DataFrame, table: str, pair: str, dataset: str, label: str, spec: MethodSpec) -> pd.Series | None:
    """The one run of spec on pair and dataset, None if there is none, ReportError if several."""
    c = _of(runs[(runs["pair"] == pair) & (runs["dataset"] == dataset)], spec)
    if len(c) > 1:
        raise _ambiguous(table, f"{label} ({spec}) on {pair}/{dataset}", c)
    return c.iloc[0] if len(c) else None


def skeleton(groups: list[str], rows: list[str], tops: list[str], cols: list[str]) -> pd.DataFrame:
    return pd.DataFrame(np.nan, index=pd.MultiIndex.from_product([groups, rows]),
                        columns=pd.MultiIndex.from_product([tops, cols]))


def throughput_by(examples: pd.DataFrame, by: str) -> pd.Series:
    """tokens/s per value of the rows' column `by`: Σ new_tokens / Σ decode_s of the rows with that value."""
    sums = examples.groupby(by)[["new_tokens", "decode_s"]].sum()
    return sums["new_tokens"] / sums["decode_s"]


def _repeats_note(runs: pd.DataFrame) -> str:
    """How the intervals of the AdaSD tables are made (and that tk/sec is a median where runs have repeats)."""
    return ("; [95% bootstrap interval over prompts" + (" and repeats" if (runs["repeats"] > 1).any() else "")
            + f", paired by prompt for speedup; seed {intervals.SEED}]"
            + ("; tk/sec: median over repeats" if (runs["repeats"] > 1).any() else ""))


def _has_data(values: pd.DataFrame, baseline_label: str) -> bool:
    """True when a row other than the baseline's holds a number (else the table is not built)."""
    rows = values.index.get_level_values(1) != baseline_label
    return bool(values[rows].notna().any().any())


# ---- AdaSD -------------------------------------------------------------------------------------

# the AdaSD columns that carry a 95% bootstrap interval over prompts (specbench.analysis.intervals), by statistic
_INTERVAL_OF = {"tokens_per_s_median": "tok/s", "acceptance_rate": "AccRate", "score": "score"}


def _interval(run: pd.Series, key: str, base: pd.Series | None) -> tuple[float, float]:
    """The 95% bootstrap interval of the cell `key` of run (speedup: paired by prompt with `base`); NaN, NaN for
    the columns without one (#cand, #match, JSDist)."""
    if key == "speedup":
        return intervals.of_pair(run, base, "speedup")[1:]
    if key in _INTERVAL_OF:
        return intervals.of_run(run, _INTERVAL_OF[key])
    return float("nan"), float("nan")


def _adasd_values(runs: pd.DataFrame, table: str, rows: list[tuple[str, MethodSpec]], columns: list[str],
                  datasets: list[str], base: MethodSpec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """values[(pair label, row), (dataset label, column)] from the one run per cell; speedup vs its baseline run;
    and the printed cells: values with their 95% bootstrap interval ' [lo–hi]' on tk/sec, acc, AccRate, speedup."""
    mine = pd.concat([_of(runs, s) for _, s in rows])
    pairs = pair_labels(mine)
    v = skeleton(list(pairs.values()), [r for r, _ in rows], [DATASET_LABELS.get(d, d) for d in datasets], columns)
    spread = {}
    for pair, plabel in pairs.items():
        for label, spec in rows:
            for d in datasets:
                run = _pick(runs, table, pair, d, label, spec)
                if run is None:
                    continue
                b = find_baseline(run, runs, base) if any(ADASD_COLUMNS[c] == "speedup" for c in columns) else None
                for col in columns:
                    key, at = ADASD_COLUMNS[col], ((plabel, label), (DATASET_LABELS.get(d, d), col))
                    v.loc[at] = speedup_over(run, b) if key == "speedup" else run[key]
                    spread[at] = _interval(run, key, b)
    cells = fmt_cells(v, ".3f")
    for (row, col), (lo, hi) in spread.items():
        if pd.notna(lo) and pd.notna(hi):
            cells.loc[row, col] += f" [{lo:.3f}–{hi:.3f}]"
    return v, cells


def adasd_tables(runs: pd.DataFrame, baseline: str | None = None) -> list[Table]:
    """AdaSD Table 1 and Table 2 over every dataset present (the paper's GSM8K, HumanEval, MMLU first)."""
    base = MethodSpec.parse(baseline or BASELINES["adasd"])
    rows = method_specs(ADASD_ROWS, base)
    mine = pd.concat([_of(runs, s) for _, s in rows])
    datasets = _ordered(set(mine["dataset"]), list(ADASD_TABLE_OF))
    out = []
    v1, c1 = _adasd_values(runs, "adasd_table1", rows, ["tk/sec", "JSDist", "acc", "speedup"], datasets, base)
    if _has_data(v1, "Vanilla"):
        out.append(Table("adasd_table1", f"AdaSD Table 1: speed, JS threshold, accuracy and speedup vs Vanilla ({base})"
                         f"{_repeats_note(runs)}", v1, c1))
    v2, c2 = _adasd_values(runs, "adasd_table2", rows[2:], ["#cand", "#match", "AccRate", "speedup"], datasets, base)
    if _has_data(v2, "Vanilla"):
        out.append(Table("adasd_table2", f"AdaSD Table 2: candidates, matches, acceptance rate and speedup vs Vanilla ({base})"
                         f"{_repeats_note(runs)}", v2, c2))
    return out


def adasd_tables_3_5(runs: pd.DataFrame, baseline: str | None = None) -> list[Table]:
    """AdaSD Tables 3-5: one table per dataset with every column and Variants A-C."""
    base = MethodSpec.parse(baseline or BASELINES["adasd"])
    rows = method_specs(ADASD_ROWS + VARIANT_ROWS, base)
    out = []
    for d in _ordered(set(pd.concat([_of(runs, s) for _, s in rows])["dataset"]), list(ADASD_TABLE_OF)):
        v, cells = _adasd_values(runs, f"adasd tables 3-5 ({d})", rows, list(ADASD_COLUMNS), [d], base)
        v.columns = pd.MultiIndex.from_tuples([("", c) for _, c in v.columns])
        cells.columns = v.columns
        if _has_data(v, "Vanilla"):
            name = ADASD_TABLE_OF.get(d, f"adasd_appendix_{d}")
            which = f"Table {name[-1]}" if d in ADASD_TABLE_OF else "Tables 3-5 layout"
            out.append(Table(name, f"AdaSD {which}: inference results on {DATASET_LABELS.get(d, d)} "
                                   f"(speedup vs {base}){_repeats_note(runs)}", v, cells))
    return out


# ---- GammaTune ---------------------------------------------------------------------------------

def _same_setting(cands: pd.DataFrame, table: str, what: str, ignore: tuple[str, ...] = ()) -> None:
    """Refuse runs that are averaged or compared together but differ in setting (besides `ignore` keys)."""
    import json

    first = json.loads(cands.iloc[0]["setting"])
    for _, r in cands.iloc[1:].iterrows():
        diffs = [d for d in differences(first, json.loads(r["setting"])) if d.split(" ")[0] not in ignore]
        if diffs:
            raise ReportError(f"{table}: refusing to combine {what}: {cands.iloc[0]['run_dir']} and {r['run_dir']} "
                              f"differ in {'; '.join(diffs)}; select runs with --where")


def _grid(runs: pd.DataFrame, table: str, pair: str, dataset: str, label: str, spec: MethodSpec) -> dict[float, pd.Series]:
    """gamma -> the one run of spec at that initial γ on pair and dataset."""
    c = _of(runs[(runs["pair"] == pair) & (runs["dataset"] == dataset)], spec)
    out: dict[float, pd.Series] = {}
    for g, block in c.groupby("gamma", dropna=False):
        if math.isnan(g):
            raise ReportError(f"{table}: {label} ({spec}) runs on {pair}/{dataset} have no initial γ option")
        if len(block) > 1:
            raise _ambiguous(table, f"{label} ({spec}) with initial γ={g:g} on {pair}/{dataset}", block)
        out[g] = block.iloc[0]
    return out


def gammatune_speedups(runs: pd.DataFrame, baseline: str | None = None, normalize: str = "grid") -> pd.DataFrame:
    """One row per (pair, dataset, method row, gamma): tokens_per_s and speedup over fixed-γ `vanilla`.

    normalize="grid": T(method, γ0) / mean over the grid of T(vanilla, γ) (the paper's table);
    normalize="paired": T(method, γ0) / T(vanilla, γ0). Every method must cover the baseline's γ grid.
    """
    if normalize not in ("grid", "paired"):
        raise ReportError(f"normalize {normalize!r}: valid values are grid, paired")
    base = MethodSpec.parse(baseline or BASELINES["gammatune"])
    table, rows = "gammatune_table2", method_specs(GAMMATUNE_ROWS, base)
    recs = []
    for (pair, d), _ in _of(runs, base).groupby(["pair", "dataset"]):
        grid = _grid(runs, table, pair, d, "SpecDecode", base)
        mine = {label: _grid(runs, table, pair, d, label, s) for label, s in rows}
        _same_setting(pd.DataFrame([r for g in mine.values() for r in g.values()]), table,
                      f"the runs on {pair}/{d}")
        norm = np.mean([r["tokens_per_s_median"] for r in grid.values()])
        for label, runs_by_g in mine.items():
            if runs_by_g and set(runs_by_g) != set(grid):
                raise ReportError(f"{table}: {label} on {pair}/{d} ran initial γ {sorted(runs_by_g)}, the baseline "
                                  f"{base} γ {sorted(grid)}: the mean over γ needs the same grid")
            for g, r in sorted(runs_by_g.items()):
                den = norm if normalize == "grid" else grid[g]["tokens_per_s_median"]
                recs.append({"pair": pair, "pair_label": r["pair_label"], "dataset": d, "row": label, "gamma": g,
                             "tokens_per_s": r["tokens_per_s_median"], "speedup": r["tokens_per_s_median"] / den})
    out = pd.DataFrame(recs, columns=["pair", "pair_label", "dataset", "row", "gamma", "tokens_per_s", "speedup"])
    for label, spec in rows[1:]:
        for (pair, d), _ in _of(runs, spec).groupby(["pair", "dataset"]):
            if not ((out["pair"] == pair) & (out["dataset"] == d)).any():
                log.warning("%s: %s runs on %s/%s have no %s baseline runs: left out", table, label, pair, d, base)
    return out


def gammatune_table2(runs: pd.DataFrame, baseline: str | None = None, normalize: str = "grid") -> list[Table]:
    """GammaTune Table 2: speedup over fixed-γ speculative decoding, mean ± std over the initial γ grid."""
    long = gammatune_speedups(runs, baseline, normalize)
    if long.empty or (long["row"] == "SpecDecode").all():
        return []
    multi = long["dataset"].nunique() > 1
    long["col"] = long["pair_label"] + (" (" + long["dataset"].map(lambda d: DATASET_LABELS.get(d, d)) + ")" if multi else "")
    agg = long.groupby(["row", "col"], sort=False)["speedup"].agg(mean="mean", std=lambda s: s.std(ddof=0))
    cols = list(dict.fromkeys(long["col"]))
    v = skeleton([""], [r for r, _ in GAMMATUNE_ROWS], cols + ["Average"], ["mean", "std"])
    for (row, col), m in agg.iterrows():
        v.loc[("", row), (col, "mean")], v.loc[("", row), (col, "std")] = m["mean"], m["std"]
    full = v[cols].notna().all(axis=1)  # the Average needs every pair's cell
    v.loc[full, ("Average", "mean")] = v.loc[full, [(c, "mean") for c in cols]].mean(axis=1)
    v.loc[full, ("Average", "std")] = v.loc[full, [(c, "std") for c in cols]].mean(axis=1)
    cells = pd.DataFrame("", index=v.index, columns=pd.MultiIndex.from_tuples([(c, "") for c in cols + ["Average"]]))
    for c in cols + ["Average"]:
        cells[(c, "")] = [f"{m:.2f} ± {s:.2f}×" if pd.notna(m) else "" for m, s in zip(v[(c, "mean")], v[(c, "std")])]
    how = "mean vanilla throughput over the grid" if normalize == "grid" else "vanilla at the same γ"
    return [Table("gammatune_table2", f"GammaTune Table 2: speedup over fixed-γ speculative decoding ({how}); "
                  "± = std over initial γ", v, cells, index_names=("", "method"))]


def task_throughput(runs: pd.DataFrame, examples: pd.DataFrame, baseline: str | None = None,
                    by: str = "category") -> pd.DataFrame:
    """GammaTune Figure 1 data: per (pair, dataset, method row, task) throughput Σ new / Σ decode_s of the
    task's examples, mean and std (ddof=0) over the method's initial-γ runs; n = number of runs."""
    base = MethodSpec.parse(baseline or BASELINES["gammatune"])
    if by not in examples:
        raise ReportError(f"task_throughput: the rows have no {by!r} column (Spec-Bench rows carry category and task)")
    recs = []
    for label, spec in method_specs(GAMMATUNE_ROWS, base):
        for (pair, d), _ in _of(runs, spec).groupby(["pair", "dataset"]):
            for g, run in _grid(runs, "gammatune_figure1", pair, d, label, spec).items():
                for task, tps in throughput_by(examples[examples["run_dir"] == run["run_dir"]], by).items():
                    recs.append({"pair": pair, "dataset": d, "row": label, "task": task, "gamma": g,
                                 "tokens_per_s": tps})
    long = pd.DataFrame(recs, columns=["pair", "dataset", "row", "task", "gamma", "tokens_per_s"])
    return (long.groupby(["pair", "dataset", "row", "task"], sort=False)["tokens_per_s"]
            .agg(mean="mean", std=lambda s: s.std(ddof=0), n="count").reset_index())


# ---- SD² ---------------------------------------------------------------------------------------

def sd2_seed_runs(runs: pd.DataFrame, rows: list[tuple[str, MethodSpec]],
                  table: str = "sd2") -> Iterator[tuple[str, pd.Series]]:
    """(row label, run) per run of each row's spec: one per pair, dataset and seed, the seeds in one setting."""
    for label, spec in rows:
        for (pair, d), c in _of(runs, spec).groupby(["pair", "dataset"]):
            if c["seed"].duplicated().any():
                dup = c[c["seed"].duplicated(keep=False)]
                raise _ambiguous(table, f"{label} ({spec}) with seed {dup.iloc[0]['seed']} on {pair}/{d}", dup)
            _same_setting(c, table, f"the seeds of {label} on {pair}/{d}", ignore=("decode.seed",))
            yield from ((label, r) for _, r in c.iterrows())


def sd2_numbers(runs: pd.DataFrame, temperature: float, baseline: str | None = None) -> pd.DataFrame:
    """One row per (pair, dataset, method row, seed): τ (block efficiency) and α over the same-seed baseline run."""
    base = MethodSpec.parse(baseline or BASELINES["sd2"])
    runs = runs[runs["temperature"] == temperature]
    recs = [{"pair": r["pair"], "pair_label": r["pair_label"], "dataset": r["dataset"], "row": label, "seed": r["seed"],
             "tau": r["block_efficiency"], "alpha": speedup(r, runs, base)}
            for label, r in sd2_seed_runs(runs, method_specs(SD2_ROWS, base))]
    return pd.DataFrame(recs, columns=["pair", "pair_label", "dataset", "row", "seed", "tau", "alpha"])


def _sd2_frame(long: pd.DataFrame, cols: list[str]) -> tuple[pd.DataFrame, list[str]]:
    labels = pair_labels(long)
    dsets = _ordered(set(long["dataset"]), ["ultrachat", "humaneval", "xsum", "alpaca", "gsm8k"])
    return skeleton(list(dict.fromkeys(labels[p] for p in long["pair"])), [r for r, _ in SD2_ROWS],
                     [DATASET_LABELS.get(d, d) for d in dsets], cols), dsets


def sd2_table(runs: pd.DataFrame, temperature: float = 1.0, baseline: str | None = None) -> list[Table]:
    """SD² Table 1 (temperature 1) or Table 5 (temperature 0): τ ± std over seeds and α per dataset, plus Mean."""
    long = sd2_numbers(runs, temperature, baseline)
    if long.empty or (long["row"] == "Pretrained").all():
        return []
    v, dsets = _sd2_frame(long, ["τ", "τ std", "α"])
    labels = pair_labels(long)
    for (pair, d, row), g in long.groupby(["pair", "dataset", "row"]):
        at = (labels[pair], row)
        dl = DATASET_LABELS.get(d, d)
        v.loc[at, (dl, "τ")], v.loc[at, (dl, "τ std")] = g["tau"].mean(), g["tau"].std(ddof=1)
        v.loc[at, (dl, "α")] = g["alpha"].mean()
    tops = list(dict.fromkeys(v.columns.get_level_values(0)))
    for col in ["τ", "τ std", "α"]:  # Mean over datasets, only for rows with every dataset's number
        sub = v[[(t, col) for t in tops]]
        v[("Mean", col)] = sub.mean(axis=1).where(sub.notna().all(axis=1))
    cells = pd.DataFrame("", index=v.index, columns=pd.MultiIndex.from_product([tops + ["Mean"], ["τ", "α"]]))
    for t in tops + ["Mean"]:
        cells[(t, "τ")] = ["" if pd.isna(m) else f"{m:.2f}" + ("" if pd.isna(s) else f" ± {s:.2f}")
                           for m, s in zip(v[(t, "τ")], v[(t, "τ std")])]
        cells[(t, "α")] = fmt_cells(v[[(t, "α")]], ".2f")[(t, "α")]
    num, kind = ("1", "sampling") if temperature == 1 else ("5", "greedy") if temperature == 0 else (f"_T{temperature:g}", "")
    return [Table(f"sd2_table{num}", f"SD² Table {num.lstrip('_')}: block efficiency τ (± std over seeds) and speedup α "
                  f"over the pretrained drafter, T={temperature:g} {kind}".rstrip(), v, cells)]


def sd2_welch(runs: pd.DataFrame, temperature: float = 1.0, baseline: str | None = None) -> list[Table]:
    """SD² Table 3: Welch's t-test (scipy, unequal variances) of each method's τ over seeds against Pretrained's."""
    long = sd2_numbers(runs, temperature, baseline)
    if long.empty or (long["row"] == "Pretrained").all():
        return []
    v, dsets = _sd2_frame(long, ["t", "p"])
    v = v.drop(index="Pretrained", level=1)
    labels = pair_labels(long)
    for (pair, d), g in long.groupby(["pair", "dataset"]):
        pre = g.loc[g["row"] == "Pretrained", "tau"]
        for row, m in g[g["row"] != "Pretrained"].groupby("row"):
            if len(pre) >= 2 and len(m["tau"]) >= 2:
                t, p = stats.ttest_ind(m["tau"], pre, equal_var=False)
                v.loc[(labels[pair], row), (DATASET_LABELS.get(d, d), "t")] = t
                v.loc[(labels[pair], row), (DATASET_LABELS.get(d, d), "p")] = p
    cells = fmt_cells(v, ".2f")
    bold = pd.DataFrame(False, index=v.index, columns=v.columns)
    bold.loc[:, [c for c in v.columns if c[1] == "p"]] = v[[c for c in v.columns if c[1] == "p"]] <= 0.05
    return [Table("sd2_table3", f"SD² Table 3: Welch's t-test of τ against Pretrained over seeds, T={temperature:g} "
                  "(t > 0: higher τ; bold: p <= 0.05)", v, cells, bold)]


# ---- Spec-Bench --------------------------------------------------------------------------------

def _nan(x: float | None) -> float:
    return float("nan") if x is None else x


def _spec_bench_row(run: pd.Series, base: pd.Series, examples: pd.DataFrame) -> dict[str, float]:
    """One leaderboard row: per task throughput_by of the run's rows over the baseline's (NaN where the run has
    no row of the task), τ and Overall = speedup_over the baseline run."""
    if "task" not in examples:  # rows without Spec-Bench's task field: no task columns
        per_task = pd.Series(dtype=float)
    else:
        mine, theirs = (examples[examples["run_dir"] == r["run_dir"]] for r in (run, base))
        per_task = throughput_by(mine, "task") / throughput_by(theirs, "task")
    return {**{col: per_task.get(task, np.nan) for col, task in SPEC_BENCH_TASKS.items()},
            "#Mean Accepted Tokens": _nan(accept_length(run["counts"])), "Overall": speedup_over(run, base)}


def _spec_bench_intervals(run: pd.Series, base: pd.Series, examples: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """The 95% bootstrap intervals of a leaderboard row: each task's speedup and Overall paired by prompt with the
    baseline (the task's prompts only), τ over the run's prompts; none for the baseline itself."""
    if run["run_dir"] == base["run_dir"]:
        return {}
    out = {"#Mean Accepted Tokens": intervals.of_run(run, "accept length"), "Overall": intervals.of_pair(run, base, "speedup")[1:]}
    if "task" in examples:
        mine = examples[examples["run_dir"] == run["run_dir"]]
        for col, task in SPEC_BENCH_TASKS.items():
            ids = set(mine.loc[mine["task"] == task, "id"].astype(str))
            if ids:
                out[col] = intervals.paired_interval(intervals.subset(run["prompts"], ids),
                                                     intervals.subset(base["prompts"], ids), "speedup", run["time"])
    return out


def spec_bench_table(runs: pd.DataFrame, baseline: str | None = None) -> list[Table]:
    """Spec-Bench's leaderboard: a row per run on spec_bench (its label, `load.labels`, led by SPEC_BENCH_LABELS'
    name for the head methods: EAGLE-3, EAGLE-3 (tree), Medusa), a block per pair; the baseline's rows first, then by
    Overall, highest first. No table when no pair has a baseline run (a sweep that never ran ar); an error when only
    some pairs lack it."""
    base = MethodSpec.parse(baseline or BASELINES["spec_bench"])
    mine = runs[runs["dataset"] == "spec_bench"].copy()
    if mine.empty:
        return []
    lacking = sorted(set(mine["pair"]) - set(_of(mine, base)["pair"]))
    if len(lacking) == mine["pair"].nunique():  # no baseline at all (a sweep without ar, as gammatune_table2's)
        return []
    if lacking:
        raise ReportError(f"spec_bench: no {base} run on {', '.join(p + '/spec_bench' for p in lacking)}: the "
                          f"speedups are over {base}; run method={base.name} with the other runs' settings")
    mine["row"] = [SPEC_BENCH_LABELS.get(m, m) + row[len(m):] for m, row in zip(mine["method"], labels(mine))]
    examples, pairs = load_examples(mine), pair_labels(mine)
    recs, spans, first = {}, {}, set()
    for (pair, row), c in mine.groupby(["pair", "row"], sort=False):
        if len(c) > 1:
            raise _ambiguous("spec_bench", f"{row} on {pair}/spec_bench", c)
        run, at = c.iloc[0], (pairs[pair], row)
        b = find_baseline(run, runs, base)
        recs[at], spans[at] = _spec_bench_row(run, b, examples), _spec_bench_intervals(run, b, examples)
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
                  "#Mean Accepted Tokens = (accepted + steps) / steps (Spec-Bench's), Overall = the run's speedup; [95% bootstrap interval "
                  f"over prompts, paired by prompt with {base}; seed {intervals.SEED}]", v, cells)]
