"""The Spec-Bench leaderboard table (`--table spec_bench`): speedups over `ar` per task group recomputed with pandas
from the run folders' rows, a task no row has, two pairs, ar matched on batch_size, refusals, the CLI."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from helpers import SYNTHETIC, at_batch_size, small, write_run
from specbench.analysis import catalog, load, report
from specbench.analysis.selection import ReportError
from specbench.analysis.spec_bench_table import spec_bench_table
from specbench.analysis.tables import Table

COLUMNS = ["Multi-turn Conversation", "Translation", "Summarization", "Question Answering", "Mathematical Reasoning",
           "Retrieval-aug. Generation", "#Mean Accepted Tokens", "Overall"]
TASK_OF = {"Multi-turn Conversation": "mt_bench", "Translation": "translation", "Summarization": "summarization",
           "Question Answering": "qa", "Mathematical Reasoning": "math_reasoning", "Retrieval-aug. Generation": "rag"}
# six examples, no rag one: that column stays empty
TASKS = ["mt_bench", "mt_bench", "translation", "qa", "math_reasoning", "summarization"]
NEW = [20, 30, 10, 40, 25, 15]


def spec_run(root: Path, folder: str, method: str, seconds: list[float], calls: list[int] | None = None,
             **kw) -> Path:
    """A spec_bench run folder: example i decodes NEW[i] tokens of task TASKS[i] in seconds[i] with calls[i] target calls."""
    calls = calls or NEW
    # a chain's iterations: one target call each, committing its accepted drafts + 1 (no stop cut)
    rows = [{"new": n, "s": s, "calls": c, "task": t, "accepted": n - c, "iterations": c, "k": c if n > c else 0,
             "drafted": 2 * (n - c)}
            for n, s, c, t in zip(NEW, seconds, calls, TASKS)]
    return write_run(root, folder, method, rows, dataset="spec_bench", **kw)


def truth(run_dir: Path, ar_dir: Path) -> dict[str, float]:
    """The row by hand from the two rows.jsonl files: per task and overall (Σ new / Σ s) / (Σ new / Σ s) of ar, τ."""
    def rows(d: Path) -> pd.DataFrame:
        return pd.read_json(d / "rows.jsonl", lines=True)

    mine, ar = rows(run_dir), rows(ar_dir)
    def per_task(r: pd.DataFrame) -> pd.Series:
        return r.groupby("task")["new_tokens"].sum() / r.groupby("task")["decode_s"].sum()

    sp = per_task(mine) / per_task(ar)
    out = {col: sp.get(task, math.nan) for col, task in TASK_OF.items()}
    out["#Mean Accepted Tokens"] = (mine["accepted"].sum() + mine["iterations"].sum()) / mine["iterations"].sum()
    out["Overall"] = (mine["new_tokens"].sum() / mine["decode_s"].sum()) / (ar["new_tokens"].sum() / ar["decode_s"].sum())
    return out


def assert_row(table: Table, at: tuple[str, str], want: dict[str, float]) -> None:
    got = table.values.loc[at]
    for col in COLUMNS:
        if math.isnan(want[col]):
            assert math.isnan(got[(col, "")]) and table.cells.loc[at, (col, "")] == "", col
        else:
            assert got[(col, "")] == pytest.approx(want[col]), col


@pytest.fixture
def board(tmp_path: Path) -> Path:
    """Pair p: ar, vanilla, pld at two max_ngram; pair q: ar and vanilla."""
    spec_run(tmp_path, "p/ar", "ar", [2.0, 3.0, 1.0, 4.0, 2.5, 1.5])
    spec_run(tmp_path, "p/vanilla", "vanilla", [1.0, 1.5, 0.4, 2.5, 1.0, 1.0], [8, 12, 5, 15, 10, 6], gamma=5)
    spec_run(tmp_path, "p/pld3", "pld", [1.5, 1.0, 0.8, 3.0, 2.0, 0.5], [10, 10, 6, 20, 12, 5], max_ngram=3)
    spec_run(tmp_path, "p/pld4", "pld", [1.2, 1.1, 0.9, 2.0, 2.5, 0.7], [9, 11, 7, 18, 11, 6], max_ngram=4)
    spec_run(tmp_path, "q/ar", "ar", [4.0, 6.0, 2.0, 8.0, 5.0, 3.0], pair="q")
    spec_run(tmp_path, "q/vanilla", "vanilla", [1.0, 2.0, 1.0, 2.0, 1.0, 1.0], [5, 6, 4, 10, 8, 5], pair="q", gamma=5)
    return tmp_path


def test_the_leaderboard_by_hand(board):
    (t,) = catalog.build("spec_bench", load.load_runs(board))
    assert t.name == "spec_bench" and list(t.values.columns.get_level_values(0)) == COLUMNS
    for pair, folder, label in [("p", "ar", "ar"), ("p", "vanilla", "vanilla"), ("p", "pld3", "pld max_ngram=3"),
                                ("p", "pld4", "pld max_ngram=4"), ("q", "ar", "ar"), ("q", "vanilla", "vanilla")]:
        assert_row(t, (pair, label), truth(board / pair / folder, board / pair / "ar"))
    # one number written out: p's vanilla on multi-turn: (50 / 2.5) / (50 / 5) = 2; its τ = 140 / 56
    assert t.values.loc[("p", "vanilla"), ("Multi-turn Conversation", "")] == pytest.approx(2.0)
    assert t.values.loc[("p", "vanilla"), ("#Mean Accepted Tokens", "")] == pytest.approx(140 / 56)
    # ar is 1.00x everywhere it has rows, τ 1.00; no example is rag: an empty cell
    ar = t.cells.loc[("p", "ar")]
    assert list(ar) == ["1.00x"] * 5 + ["", "1.00", "1.00x"]
    # a block per pair, ar first, then by Overall (the leaderboard's order)
    p = [r for g, r in t.values.index if g == "p"]
    overall = t.values.loc["p"][("Overall", "")]
    assert p[0] == "ar" and list(overall[p[1:]]) == sorted(overall[p[1:]], reverse=True)
    assert [g for g, _ in t.values.index] == ["p"] * 4 + ["q"] * 2
    assert t.cells.loc[("q", "vanilla"), ("Overall", "")].startswith(f"{(140 / 8) / (140 / 28):.2f}x [")
    md = t.markdown()
    assert "| method | " + " | ".join(COLUMNS) + " |" in md and "*q*" in md
    assert r"\#Mean Accepted Tokens" in t.latex()


def test_speedups_divide_by_the_ar_run_of_the_same_batch_size(tmp_path):
    spec_run(tmp_path, "ar1", "ar", [1.0] * 6)
    at_batch_size(spec_run(tmp_path, "ar2", "ar", [0.5, 0.5, 0.25, 1.0, 0.5, 0.5]), 2)
    at_batch_size(spec_run(tmp_path, "v2", "vanilla", [0.25] * 6, gamma=5), 2)
    (t,) = spec_bench_table(load.load_runs(tmp_path))
    assert [r for _, r in t.values.index] == ["ar batch_size=1", "ar batch_size=2", "vanilla"]
    assert_row(t, ("p", "vanilla"), truth(tmp_path / "v2", tmp_path / "ar2"))
    # translation: 10 tokens in 0.25 s against 0.25 s: 1.00x (against the batch-size-1 ar it would be 4.00x)
    assert t.cells.loc[("p", "vanilla"), ("Translation", "")] == "1.00x [1.00–1.00]"  # one translation prompt


def test_refusals_and_runs_without_a_table(tmp_path):
    # no ar run on a pair: an error naming the pair, a note, and through the CLI exit code 0 (1 with --strict)
    lone = tmp_path / "lone"
    spec_run(lone, "p/ar", "ar", [1.0] * 6)
    spec_run(lone, "p/vanilla", "vanilla", [0.5] * 6, gamma=5)
    spec_run(lone, "q/vanilla", "vanilla", [0.5] * 6, pair="q", gamma=5)
    with pytest.raises(ReportError, match=r"spec_bench: no ar run on q/spec_bench: the speedups are over ar"):
        spec_bench_table(load.load_runs(lone))
    rep = report.build_report(load.load_runs(lone), ["spec_bench"])
    assert rep.left_out == 1 and any("left out: spec_bench: no ar run on q/spec_bench" in n for n in rep.notes)
    assert report.main([str(lone), "--table", "spec_bench", "--no-figures"]) == 1  # the one table asked: not built
    # two runs with one label on one pair: refused with the --where of each
    twice = tmp_path / "twice"
    spec_run(twice, "ar", "ar", [1.0] * 6)
    spec_run(twice, "vanilla", "vanilla", [0.5] * 6, gamma=5)
    spec_run(twice, "vanilla_again", "vanilla", [0.4] * 6, gamma=5, device="cuda:0")  # not one run: another device
    with pytest.raises(ReportError, match=r"spec_bench: 2 runs fit vanilla on p/spec_bench"):
        spec_bench_table(load.load_runs(twice))
    # no spec_bench run, or ar alone: no table
    write_run(tmp_path / "gsm", "ar", "ar", [{"new": 5, "s": 1.0}])
    write_run(tmp_path / "gsm", "vanilla", "vanilla", [{"new": 5, "s": 0.5}], gamma=5)
    assert spec_bench_table(load.load_runs(tmp_path / "gsm")) == []
    spec_run(tmp_path / "alone", "ar", "ar", [1.0] * 6)
    assert spec_bench_table(load.load_runs(tmp_path / "alone")) == []
    # a sweep without any ar run (as gammatune_table2's): no leaderboard, and the full report is not failed by it
    spec_run(tmp_path / "sweep", "vanilla", "vanilla", [0.5] * 6, gamma=5)
    spec_run(tmp_path / "sweep", "heuristic", "heuristic", [0.4] * 6, gamma=5)
    assert spec_bench_table(load.load_runs(tmp_path / "sweep")) == []
    notes = report.build_report(load.load_runs(tmp_path / "sweep")).notes
    assert not any("left out: spec_bench" in n for n in notes)
    assert [n for n in notes if "no ar run" in n] == [  # said once, with the command that adds the run
        "p · spec_bench has no ar run, so its 'speedup vs ar' is empty; add one with: python run.py method=ar pair=p "
        "dataset=spec_bench decode=greedy"]


def test_the_cli_prints_the_leaderboard_columns(board):
    p = subprocess.run([sys.executable, "-m", "specbench.report", str(board), "--table", "spec_bench", "--no-figures"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "| method | " + " | ".join(COLUMNS) + " |" in p.stdout
    assert "| pld max_ngram=3 |" in p.stdout and "1.00x" in p.stdout


def test_real_spec_bench_runs(tmp_path, monkeypatch):
    """ar and vanilla on the first two Spec-Bench questions (both multi-turn, in the synthetic fixtures as in the
    real file): only that column has numbers."""
    from specbench.runs.runner import run

    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(SYNTHETIC))
    for m in ("ar", "vanilla"):
        run(small(f"method={m}", "dataset=spec_bench", "limit=2", "decode.max_new_tokens=8", "threads=1"),
            tmp_path / m)
    (t,) = spec_bench_table(load.load_runs(tmp_path))
    assert_row(t, ("tiny_random", "vanilla"), truth(tmp_path / "vanilla", tmp_path / "ar"))
    assert t.values.loc[("tiny_random", "vanilla"), ("Multi-turn Conversation", "")] > 0
    assert list(t.cells.loc[("tiny_random", "ar")]) == ["1.00x", "", "", "", "", "", "1.00", "1.00x"]
