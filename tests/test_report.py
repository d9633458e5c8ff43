"""specbench.analysis.report and its tables (specbench.analysis.*_tables): numbers recomputed by hand from small fixed run folders,
refusals of mismatched or ambiguous comparisons, rendering, and the CLI on real tiny_random runs."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from specbench.analysis import baselines, catalog, load, report, selection
from specbench.analysis.adasd_tables import ADASD_COLUMNS, adasd_tables, adasd_tables_3_5
from specbench.analysis.gammatune_tables import gammatune_speedups, gammatune_table2
from specbench.analysis.sd2_tables import sd2_table, sd2_welch
from helpers import add_fields, at_batch_size, small, write_run
from specbench.bench import methods as bench
from specbench.analysis.selection import ReportError
from specbench.common.aggregate import run_metrics
from specbench.decoding.engine import Generation
from specbench.decoding.records import IterationRecord
from specbench.decoding.metrics import example_metrics, summarize


def tps(n: float) -> list[dict]:
    """One example decoding n tokens in 1 s (throughput n tok/s)."""
    return [{"new": n, "s": 1.0}]


@pytest.fixture
def adasd_runs(tmp_path: Path) -> Path:
    # vanilla: 60 tokens / 2 s = 30 tok/s; #cand 75/15 = 5; #match 45/15 = 3; AccRate 45/75 = 0.6; acc 0.5
    write_run(tmp_path, "vanilla", "vanilla", [
        {"new": 40, "s": 1.0, "calls": 10, "drafted": 50, "accepted": 30, "k": 10, "score": 1.0},
        {"new": 20, "s": 1.0, "calls": 5, "drafted": 25, "accepted": 15, "k": 5, "score": 0.0}], gamma=5)
    # adasd: 90 / 2 = 45 tok/s (speedup 1.5); #cand 120/20 = 6; #match 70/20 = 3.5; AccRate 70/120;
    # JSDist iteration-weighted (0.3*10 + 0.5*30) / 40 = 0.45; acc 1
    write_run(tmp_path, "adasd", "adasd", [
        {"new": 60, "s": 1.0, "calls": 10, "drafted": 80, "accepted": 50, "k": 10, "t_v": 0.3, "iterations": 10, "score": 1.0},
        {"new": 30, "s": 1.0, "calls": 30, "drafted": 40, "accepted": 20, "k": 10, "t_v": 0.5, "iterations": 30, "score": 1.0}])
    # ar: 60 / 6 = 10 tok/s (speedup 1/3); no drafts
    write_run(tmp_path, "ar", "ar", [{"new": 40, "s": 4.0, "score": 1.0}, {"new": 20, "s": 2.0, "score": 1.0}])
    return tmp_path


def test_run_numbers_by_hand(adasd_runs):
    runs = load.load_runs(adasd_runs).set_index("method")
    assert runs.loc["vanilla", "tokens_per_s"] == pytest.approx(30.0)
    assert runs.loc["vanilla", "mean_drafted"] == pytest.approx(5.0)
    assert runs.loc["vanilla", "mean_accepted"] == pytest.approx(3.0)
    assert runs.loc["vanilla", "acceptance_rate"] == pytest.approx(0.6)
    assert runs.loc["vanilla", "block_efficiency"] == pytest.approx(60 / 15)
    assert runs.loc["adasd", "mean_t_v"] == pytest.approx(0.45)
    assert math.isnan(runs.loc["ar", "mean_drafted"]) and runs.loc["ar", "block_efficiency"] == pytest.approx(1.0)
    assert bool(runs.loc["vanilla", "finished"]) and not bool(runs.loc["adasd", "lossless"])
    ex = load.load_examples(runs.reset_index())
    assert len(ex) == 6 and set(ex["method"]) == {"vanilla", "adasd", "ar"}
    by_path = load.load_examples(str(adasd_runs))  # a results folder gives the same examples
    assert sorted(map(tuple, by_path[["method", "id"]].values)) == sorted(map(tuple, ex[["method", "id"]].values))


def hand_rows() -> list[dict]:
    """Two rows whose per-example means differ from the pooled numbers (#cand: (5 + 2) / 2 vs 56 / 13)."""
    return [{"id": "a", "new_tokens": 40, "decode_s": 1.0, "target_calls": 10, "drafted": 50, "accepted": 30,
             "draft_iterations": 10, "mean_drafted": 5.0, "mean_accepted": 3.0, "iterations": 12, "mean_t_v": 0.3,
             "mean_t_g": None, "score": 1.0, "model_s": 0.5},
            {"id": "b", "new_tokens": 20, "decode_s": 3.0, "target_calls": 5, "drafted": 6, "accepted": 3,
             "draft_iterations": 3, "mean_drafted": 2.0, "mean_accepted": 1.0, "iterations": 4, "mean_t_v": 0.7,
             "mean_t_g": None, "score": 0.0, "model_s": 1.5}]


def test_one_aggregation_by_hand():
    m = run_metrics(hand_rows())
    assert m["total_new_tokens"] == 60 and m["total_decode_s"] == 4.0
    assert m["tokens_per_s"] == pytest.approx(60 / 4)
    assert m["mean_drafted"] == pytest.approx(56 / 13) and m["mean_accepted"] == pytest.approx(33 / 13)
    assert m["acceptance_rate"] == pytest.approx(33 / 56) == pytest.approx(m["mean_accepted"] / m["mean_drafted"])
    assert m["block_efficiency"] == pytest.approx(60 / 15)
    assert m["mean_t_v"] == pytest.approx((0.3 * 12 + 0.7 * 4) / 16) and m["mean_t_g"] is None
    assert m["score"] == pytest.approx(0.5) and m["engine_overhead"] == pytest.approx(1 - 2.0 / 4.0)
    s = summarize(hand_rows())
    assert {k: s[k] for k in m} == m and s["n_examples"] == 2
    assert s["example_means"]["mean_drafted"] == pytest.approx(3.5)  # the plain mean over examples stays there


def test_rows_without_the_drafting_iteration_count_leave_the_means_empty(caplog):
    old = [{k: v for k, v in r.items() if k != "draft_iterations"} for r in hand_rows()]
    m = run_metrics(old, "old/rows.jsonl")
    assert m["mean_drafted"] is None and m["mean_accepted"] is None and m["acceptance_rate"] == pytest.approx(33 / 56)
    assert "old/rows.jsonl: 2 of 2 rows that drafted have no 'draft_iterations'" in caplog.text
    assert run_metrics([{"new_tokens": 5, "decode_s": 1.0, "drafted": 0}])["mean_drafted"] is None  # ar: no drafts


def test_example_metrics_count_the_drafting_iterations():
    recs = [IterationRecord(3, 2, "policy", 0.0, 0.0), IterationRecord(0, 0, "none", 0.0, 0.0),
            IterationRecord(4, 4, "window", 0.0, 0.0)]
    gen = Generation([1] * 9, "length", recs, 1.0, 0.1, 0.5, 0.2, 3, 7)
    row = example_metrics(gen)
    assert row["draft_iterations"] == 2 and row["iterations"] == 3
    assert row["mean_drafted"] == pytest.approx(7 / 2) and row["mean_accepted"] == pytest.approx(6 / 2)


def report_summary_bench(run_dir: Path, runs: pd.DataFrame) -> tuple[dict, dict, dict]:
    """One run's TABLE numbers as the report loads them (NaN -> None), as summary.json holds them, and as
    `bench methods` puts them in its table."""
    summary = {"lossless": True, **json.loads((run_dir / "summary.json").read_text())}
    run = runs.set_index("run_dir").loc[str(run_dir)]
    shown = {k: None if pd.isna(run[k]) else run[k] for k in bench.TABLE}
    return shown, {k: summary[k] for k in bench.TABLE}, {k: bench.table_row("m", summary)[k] for k in bench.TABLE}


def test_report_summary_and_bench_print_the_same_numbers(tmp_path):
    write_run(tmp_path, "r", "vanilla", [{"new": 40, "s": 1.0, "calls": 10, "drafted": 50, "accepted": 30, "k": 10,
                                          "t_v": 0.3, "iterations": 12, "score": 1.0},
                                         {"new": 20, "s": 3.0, "calls": 5, "drafted": 6, "accepted": 3, "k": 3,
                                          "t_v": 0.7, "iterations": 4, "score": 0.0}])
    write_run(tmp_path, "ar", "ar", [{"new": 40, "s": 4.0}])
    runs = load.load_runs(tmp_path)
    for folder in ("r", "ar"):
        shown, saved, table = report_summary_bench(tmp_path / folder, runs)
        assert shown == saved == table
    shown, _, _ = report_summary_bench(tmp_path / "r", runs)
    assert shown == {k: run_metrics(hand_rows())[k] for k in bench.TABLE}
    assert shown["mean_drafted"] == pytest.approx(56 / 13)


def test_adasd_tables_by_hand(adasd_runs):
    runs = load.load_runs(adasd_runs)
    t1, t2 = adasd_tables(runs)
    v = t1.values
    assert v.loc[("p", "AdaSD"), ("GSM8K", "tk/sec")] == pytest.approx(45.0)
    assert v.loc[("p", "AdaSD"), ("GSM8K", "JSDist")] == pytest.approx(0.45)
    assert v.loc[("p", "AdaSD"), ("GSM8K", "acc")] == pytest.approx(1.0)
    assert v.loc[("p", "AdaSD"), ("GSM8K", "speedup")] == pytest.approx(1.5)
    assert v.loc[("p", "Target"), ("GSM8K", "speedup")] == pytest.approx(1 / 3)
    assert v.loc[("p", "Vanilla"), ("GSM8K", "speedup")] == pytest.approx(1.0)
    assert v.loc[("p", "Vanilla"), ("GSM8K", "acc")] == pytest.approx(0.5)
    # no data -> empty cell, never a number: Target has no JS threshold, no AssistedGen run exists
    assert math.isnan(v.loc[("p", "Target"), ("GSM8K", "JSDist")])
    assert v.loc[("p", "AssistedGen")].isna().all() and (t1.cells.loc[("p", "AssistedGen")] == "").all()
    w = t2.values
    assert list(w.index.get_level_values(1)) == ["Vanilla", "AssistedGen", "Gen-Only", "Verify-Only", "AdaSD"]
    assert w.loc[("p", "AdaSD"), ("GSM8K", "#cand")] == pytest.approx(6.0)
    assert w.loc[("p", "AdaSD"), ("GSM8K", "#match")] == pytest.approx(3.5)
    assert w.loc[("p", "AdaSD"), ("GSM8K", "AccRate")] == pytest.approx(70 / 120)
    # intervals over the 2 prompts (60 and 30 tok/s, each at 1.5x vanilla's): a draw of both prompts the same, each
    # with probability 1/4 > 2.5%, gives the ends 30 and 60; every draw's speedup and acc are 1.5 and 1
    assert "| AdaSD | 45.000 [30.000–60.000] | 0.450 | 1.000 [1.000–1.000] | 1.500 [1.500–1.500] |" in t1.markdown()
    assert r"\#cand" in t2.latex() and r"\multicolumn{4}{c}{GSM8K}" in t2.latex()
    back = pd.read_csv(io.StringIO(t2.csv())).set_index(["pair", "method"])
    assert back.loc[("p", "AdaSD"), "GSM8K AccRate"] == pytest.approx(70 / 120)
    assert math.isnan(back.loc[("p", "Gen-Only"), "GSM8K #cand"])
    (t3,) = adasd_tables_3_5(runs)
    assert t3.name == "adasd_table3" and list(t3.values.columns.get_level_values(1)) == list(ADASD_COLUMNS)
    assert t3.values.loc[("p", "Variant A")].isna().all()


def speedups(runs, baseline="vanilla"):
    """Every run's speedup over its baseline run (NaN where the pair and dataset have none)."""
    return [baselines.speedup_over(r, baselines.find_baseline(r, runs, baseline)) for _, r in runs.iterrows()]


def test_refuses_mismatched_baseline(adasd_runs, tmp_path):
    hot = write_run(tmp_path / "t1", "adasd", "adasd", tps(50), temperature=1.0)
    write_run(tmp_path / "t1", "vanilla", "vanilla", tps(25), gamma=5)  # greedy: differs in temperature
    runs = load.load_runs(tmp_path / "t1")
    run = runs[runs["run_dir"] == str(hot)].iloc[0]
    with pytest.raises(ReportError, match=r"differ in decode\.temperature \(1\.0 vs 0\.0\)"):
        baselines.find_baseline(run, runs, "vanilla")
    with pytest.raises(ReportError, match="decode.temperature"):
        adasd_tables(runs)
    # another device, other examples
    write_run(tmp_path / "dev", "adasd", "adasd", tps(50))
    write_run(tmp_path / "dev", "vanilla", "vanilla", tps(25), device="cuda:0", gamma=5)
    with pytest.raises(ReportError, match=r"device_info\.device \('cpu' vs 'cuda:0'\)"):
        speedups(load.load_runs(tmp_path / "dev"))
    write_run(tmp_path / "ids", "adasd", "adasd", [{"new": 5, "s": 1.0, "id": "a"}])
    write_run(tmp_path / "ids", "vanilla", "vanilla", [{"new": 5, "s": 1.0, "id": "b"}], gamma=5)
    with pytest.raises(ReportError, match="they share no example id .*run the baseline over the run's examples: "
                                          "python run.py method=vanilla pair=p dataset=gsm8k"):
        speedups(load.load_runs(tmp_path / "ids"))
    # the CLI reports the refusal in a note and exits 0 when the report was built; --strict makes it fail; 1 when
    # the one table asked for was refused
    assert report.main([str(tmp_path / "ids")]) == 0
    assert report.main([str(tmp_path / "ids"), "--strict"]) == 1
    assert report.main([str(tmp_path / "ids"), "--table", "adasd_table1_2"]) == 1
    # no baseline run at all for the pair/dataset: empty speedup, not a number
    write_run(tmp_path / "none", "adasd", "adasd", tps(50))
    assert math.isnan(speedups(load.load_runs(tmp_path / "none"))[0])


def test_refuses_ambiguous_and_bad_input(adasd_runs, tmp_path):
    write_run(adasd_runs, "adasd_t1", "adasd", tps(50), temperature=1.0)
    runs = load.load_runs(adasd_runs)
    with pytest.raises(ReportError, match="2 runs fit AdaSD"):
        adasd_tables(runs)
    greedy = load.where(runs, ["decode.temperature=0"])
    assert len(greedy) == 3 and len(adasd_tables(greedy)) == 2
    with pytest.raises(ReportError, match="no run has 'decode.temprature'; valid keys:.*decode.temperature"):
        load.where(runs, ["decode.temprature=0"])
    with pytest.raises(ReportError, match="unknown table 'adasd'; valid tables: adasd_table1_2"):
        catalog.build("adasd", runs)
    with pytest.raises(ReportError, match="key=value"):
        baselines.MethodSpec.parse("vanilla:gamma")
    assert baselines.MethodSpec.parse("vanilla:gamma=8").options == (("gamma", 8),)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load.load_runs(tmp_path / "missing")
    write_run(tmp_path / "twice", "a", "vanilla", tps(5), gamma=5)
    write_run(tmp_path / "twice", "b", "vanilla", tps(6), gamma=8)  # one setting, two runs: which is `vanilla`?
    write_run(tmp_path / "twice", "c", "ar", tps(6))
    twice = load.load_runs(tmp_path / "twice")
    with pytest.raises(ReportError, match=r"ambiguous .*give its options"):
        speedups(twice)


def test_gammatune_table_by_hand(tmp_path):
    for g, (v_p, t_p, v_q, t_q) in {1: (10, 22, 10, 11), 2: (20, 24, 10, 12), 4: (30, 26, 10, 13)}.items():
        write_run(tmp_path, f"p/vanilla{g}", "vanilla", tps(v_p), gamma=g)
        write_run(tmp_path, f"p/gammatune{g}", "gammatune", tps(t_p), gamma=g)
        write_run(tmp_path, f"q/vanilla{g}", "vanilla", tps(v_q), pair="q", gamma=g)
        write_run(tmp_path, f"q/gammatune{g}", "gammatune", tps(t_q), pair="q", gamma=g)
    runs = load.load_runs(tmp_path)
    (t,) = gammatune_table2(runs)
    v = t.values
    # pair p: vanilla mean over the grid = 20; gammatune 22/20, 24/20, 26/20 = 1.1, 1.2, 1.3
    assert v.loc[("", "GammaTune"), ("p", "mean")] == pytest.approx(1.2)
    assert v.loc[("", "GammaTune"), ("p", "std")] == pytest.approx(math.sqrt(0.02 / 3))
    assert v.loc[("", "SpecDecode"), ("p", "mean")] == pytest.approx(1.0)
    assert v.loc[("", "SpecDecode"), ("p", "std")] == pytest.approx(math.sqrt(0.5 / 3))
    # pair q: vanilla 10 at every γ -> SpecDecode 1.00 ± 0.00; Average = mean of means ± mean of stds
    assert v.loc[("", "SpecDecode"), ("Average", "std")] == pytest.approx(math.sqrt(0.5 / 3) / 2)
    assert v.loc[("", "GammaTune"), ("Average", "mean")] == pytest.approx(1.2)
    assert t.cells.loc[("", "GammaTune"), ("p", "")] == "1.20 ± 0.08×"
    assert t.cells.loc[("", "HFHeuristic"), ("Average", "")] == ""
    paired = gammatune_speedups(runs, normalize="paired")
    p = paired[(paired["pair"] == "p") & (paired["row"] == "GammaTune")]
    assert p["speedup"].mean() == pytest.approx((22 / 10 + 24 / 20 + 26 / 30) / 3)
    write_run(tmp_path, "p/heuristic1", "heuristic", tps(15), gamma=1)  # only γ0 = 1 of the grid 1, 2, 4
    with pytest.raises(ReportError, match=r"ran initial γ \[1\.0\], the baseline vanilla γ \[1\.0, 2\.0, 4\.0\]"):
        gammatune_table2(load.load_runs(tmp_path))


def test_sd2_tables_by_hand(tmp_path):
    for s, (pre, sd2) in enumerate([(20, 30), (22, 31), (24, 35)]):
        # 1 s and 10 target calls per run: tok/s = new tokens, τ = new / 10
        write_run(tmp_path, f"pre{s}", "vanilla", [{"new": pre, "s": 1.0, "calls": 10}], temperature=1.0, seed=s, gamma=8)
        write_run(tmp_path, f"sd2_{s}", "sd2", [{"new": sd2, "s": 1.0, "calls": 10}], temperature=1.0, seed=s, gamma=8)
        write_run(tmp_path, f"he{s}", "vanilla", [{"new": 40, "s": 1.0, "calls": 10}], dataset="humaneval",
                  temperature=1.0, seed=s, gamma=8)
    write_run(tmp_path, "v5", "vanilla", [{"new": 99, "s": 1.0, "calls": 10}], temperature=1.0, gamma=5)  # not γ=8
    runs = load.load_runs(tmp_path)
    (t,) = sd2_table(runs, temperature=1.0)
    v = t.values
    assert v.loc[("p", "SD²"), ("GSM8K", "τ")] == pytest.approx(3.2)
    assert v.loc[("p", "SD²"), ("GSM8K", "τ std")] == pytest.approx(math.sqrt(0.07))  # sample std over 3 seeds
    assert v.loc[("p", "SD²"), ("GSM8K", "α")] == pytest.approx((30 / 20 + 31 / 22 + 35 / 24) / 3)
    assert v.loc[("p", "Pretrained"), ("GSM8K", "α")] == pytest.approx(1.0)
    assert v.loc[("p", "Pretrained"), ("Mean", "τ")] == pytest.approx((2.2 + 4.0) / 2)
    assert v.loc[("p", "Pretrained"), ("Mean", "τ std")] == pytest.approx((0.2 + 0.0) / 2)
    assert math.isnan(v.loc[("p", "SD²"), ("Mean", "τ")])  # no SD² run on HumanEval: no mean
    assert t.cells.loc[("p", "SD²"), ("GSM8K", "τ")] == "3.20 ± 0.26"
    assert t.cells.loc[("p", "Distilled"), ("GSM8K", "τ")] == ""
    assert sd2_table(runs, temperature=0.0) == []  # no T=0 runs: no Table 5
    (w,) = sd2_welch(runs)
    # Welch: (3.2 - 2.2) / sqrt(0.07/3 + 0.04/3)
    assert w.values.loc[("p", "SD²"), ("GSM8K", "t")] == pytest.approx(1 / math.sqrt(0.11 / 3))
    want = stats.ttest_ind([3.0, 3.1, 3.5], [2.0, 2.2, 2.4], equal_var=False)
    assert w.values.loc[("p", "SD²"), ("GSM8K", "p")] == pytest.approx(want.pvalue)
    assert bool(w.bold.loc[("p", "SD²"), ("GSM8K", "p")]) == (want.pvalue <= 0.05)


def test_short_entry_point_runs_the_report(tmp_path):
    """`python -m specbench.report DIR` is the report CLI: the same tables as report.main."""
    import subprocess
    import sys

    write_run(tmp_path, "ar", "ar", [{"new": 20, "s": 1.0, "calls": 20}])
    write_run(tmp_path, "v", "vanilla", [{"new": 20, "s": 0.5, "calls": 8}])
    p = subprocess.run([sys.executable, "-m", "specbench.report", str(tmp_path), "--no-figures"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == report.main([str(tmp_path), "--no-figures"]), p.stderr
    assert "vanilla" in p.stdout and "usage: python -m specbench.report" in subprocess.run(
        [sys.executable, "-m", "specbench.report", "--help"], capture_output=True, text=True).stdout


def test_exit_status_is_0_with_notes_for_what_was_left_out_and_non_zero_for_errors_or_strict(tmp_path, capsys):
    """As the tools researchers script: 0 when the report was built (what it left out is named in notes, the last
    note counts them); 1 only with --strict when something was left out; 2 when nothing can be read."""
    write_run(tmp_path / "res", "v", "vanilla", tps(30), gamma=5, rule="rejection")
    write_run(tmp_path / "res", "w", "vanilla", tps(31), gamma=5, rule="sample_match")  # an ambiguous cell
    write_run(tmp_path / "res", "a", "adasd", tps(45))
    unfinished = write_run(tmp_path / "res", "cut", "vanilla", tps(20), gamma=8)
    (unfinished / "summary.json").unlink()  # a run still going: left out
    out = tmp_path / "out"
    assert report.main([str(tmp_path / "res"), "--out", str(out), "--no-figures"]) == 0
    err = capsys.readouterr().err
    assert f"note: left out {unfinished}: unfinished" in err and err.count("2 runs fit") == 3  # each named
    assert err.rstrip().splitlines()[-1] == ("note: 4 table(s), cell(s), speedup(s) or run(s) left out, each named "
                                             "above; every table the data allow was built")
    assert sorted(p.name for p in out.iterdir() if p.name != report.MANIFEST) == ["overview.csv", "overview.md",
                                                                                  "overview.tex"]  # still written
    assert report.main([str(tmp_path / "res"), "--no-figures", "--strict"]) == 1
    assert "(--strict: exit status 1)" in capsys.readouterr().err
    # nothing left out: 0, also with --strict
    write_run(tmp_path / "ok", "ar", "ar", tps(10))
    assert report.main([str(tmp_path / "ok"), "--no-figures", "--strict"]) == 0
    assert "left out" not in capsys.readouterr().err
    # errors: no run folder, a path that does not exist, unreadable input, a bad --where
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 2
    assert report.main([str(tmp_path / "absent")]) == 2
    assert report.main([str(tmp_path / "ok"), "--where", "nokey=1"]) == 2
    assert report.main([str(tmp_path / "ok"), "--baseline", "vanilla:gamma"]) == 2
    assert report.main([str(tmp_path / "ok"), "--table", "nosuchtable"]) == 2
    with open(tmp_path / "ok" / "ar" / "rows.jsonl", "a") as f:
        f.write("{not json\n")
    assert report.main([str(tmp_path / "ok")]) == 2
    assert "error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--strict" in shown and "exit status: 0 when the report was built" in shown and "2 on an error" in shown


def test_cli_on_real_runs(tmp_path):
    from specbench.runs.runner import run

    for m in ("ar", "vanilla", "adasd"):
        run(small(f"method={m}", "limit=2", "decode.max_new_tokens=16", "threads=1"), tmp_path / "res" / m)
    runs = load.load_runs(tmp_path / "res")
    for _, r in runs.iterrows():  # run numbers recomputed with plain Python from rows.jsonl
        rows = [json.loads(line) for line in open(Path(r["run_dir"]) / "rows.jsonl")]
        assert r["tokens_per_s"] == pytest.approx(sum(x["new_tokens"] for x in rows) / sum(x["decode_s"] for x in rows))
        assert r["block_efficiency"] == pytest.approx(sum(x["new_tokens"] for x in rows) / sum(x["target_calls"] for x in rows))
        shown, saved, table = report_summary_bench(Path(r["run_dir"]), runs)
        assert shown == saved == table  # the report, summary.json and `bench methods` agree
        drafting = sum(x["draft_iterations"] for x in rows)
        if drafting:
            assert r["mean_drafted"] == pytest.approx(sum(x["drafted"] for x in rows) / drafting)
    out = tmp_path / "report"
    assert report.main([str(tmp_path / "res"), "--out", str(out), "--format", "all", "--no-figures"]) == 0
    names = sorted(p.name for p in out.iterdir() if p.name != report.MANIFEST)
    assert names == sorted(f"{n}.{e}" for n in ("adasd_table1", "adasd_table2", "adasd_appendix_smoke", "overview",
                                                "per_position", "accepted_length") for e in ("md", "tex", "csv"))
    # a second report into the same folder replaces the first's files: none of the first's tables survives it
    (out / "my_notes.txt").write_text("mine")  # a file the report did not write stays
    assert report.main([str(tmp_path / "res"), "--out", str(out), "--format", "md", "--no-figures"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.name != report.MANIFEST) == sorted(
        [n.replace(".csv", ".md") for n in names if n.endswith(".csv")] + ["my_notes.txt"])
    assert (out / report.MANIFEST).read_text().split() == sorted(n for n in names if n.endswith(".md"))
    (t1, _) = adasd_tables(runs)
    assert (out / "adasd_table1.md").read_text() == t1.markdown()
    speed = t1.values.loc[("tiny_random", "AdaSD"), ("smoke", "speedup")]
    by = runs.set_index("method")["tokens_per_s"]
    assert speed == pytest.approx(by["adasd"] / by["vanilla"])


def test_setting_ignores_the_runner_resumable_keys():
    record = {"config": {"method": {"name": "m"}, "dataset": {"name": "d"}, "limit": 5, "threads": 1, "decode": {"seed": 0}},
              "device_info": {"device": "cpu"}}
    assert load.setting_of(record) == {"dataset": {"name": "d"}, "decode": {"seed": 0}, "device_info": {"device": "cpu"}}
    # the CPU is no part of it (a speedup across CPUs is flagged instead): a run whose device_info held only the
    # architecture is compared with a newer one that names the model
    old = {**record, "device_info": {"device": "cpu", "cpu": "x86_64"}}
    assert load.setting_of(old) == load.setting_of({**record, "device_info": {"device": "cpu", "cpu": "AMD EPYC"}})


def mixed_folder(root: Path) -> Path:
    """Greedy ar/vanilla/adasd, sampled vanilla/adasd, a vanilla with another max_new_tokens, an unfinished run
    (no summary.json) and a stale one (rows appended after its summary)."""
    for m, n in (("ar", 10), ("vanilla", 30), ("adasd", 45)):
        write_run(root, f"greedy/{m}", m, tps(n), **({"gamma": 5} if m == "vanilla" else {}))
    for m, n in (("vanilla", 20), ("adasd", 40)):
        write_run(root, f"t1/{m}", m, tps(n), temperature=1.0, **({"gamma": 5} if m == "vanilla" else {}))
    short = write_run(root, "short/vanilla", "vanilla", tps(25), gamma=5)
    record = json.loads((short / "config.json").read_text())
    record["config"]["decode"]["max_new_tokens"] = 32
    (short / "config.json").write_text(json.dumps(record))
    (write_run(root, "crashed", "adasd", tps(5), temperature=0.5) / "summary.json").unlink()
    stale = write_run(root, "stale", "adasd", tps(5), temperature=0.25)
    with open(stale / "rows.jsonl", "a") as f:
        f.write(json.dumps({"id": "late", "new_tokens": 5, "decode_s": 1.0}) + "\n")
    return root


def test_a_mixed_folder_is_reported_group_by_group(tmp_path, caplog):
    root = mixed_folder(tmp_path)
    runs = load.load_runs(root)
    assert "left out" in caplog.text and "crashed: unfinished: no summary.json" in caplog.text
    assert "stale: unfinished: summary.json counts 1 rows, rows.jsonl holds 2" in caplog.text
    assert len(runs) == 6
    groups = selection.groups(runs)
    assert [g.title for g in groups] == ["greedy, max_new_tokens=128", "t1, max_new_tokens=128",
                                         "greedy, max_new_tokens=32"]
    for g in groups:  # each group's --where selects exactly its runs
        assert g.keys == ["decode.max_new_tokens", "decode.temperature"]
        assert sorted(load.where(runs, g.where)["run_dir"]) == sorted(g.runs["run_dir"])
    assert groups[1].where == ["decode.max_new_tokens=128", "decode.temperature=1.0"]
    rep = report.build_report(runs)
    names = [t.name for t in rep.tables]
    assert "adasd_table1__greedy_max_new_tokens=128" in names and "adasd_table1__t1_max_new_tokens=128" in names
    assert "overview__greedy_max_new_tokens=32" in names
    t1 = next(t for t in rep.tables if t.name == "adasd_table1__t1_max_new_tokens=128")
    assert t1.values.loc[("p", "AdaSD"), ("GSM8K", "speedup")] == pytest.approx(2.0)  # 40 / 20, both sampled
    assert "[t1, max_new_tokens=128]" in t1.title
    notes = "\n".join(rep.notes)
    assert ("group [t1, max_new_tokens=128]: 2 runs (adasd, vanilla); they differ from the other groups in "
            "decode.max_new_tokens, decode.temperature; alone: --where decode.max_new_tokens=128 "
            "--where decode.temperature=1.0") in notes
    # the sampled runs have no ar run: their speedup over ar is empty and the note says where ar runs are
    assert ("[t1, max_new_tokens=128] p/gsm8k: speedups over ar left empty: no ar run with this setting; ar runs "
            "are in other groups ([greedy, max_new_tokens=128] --where decode.max_new_tokens=128 "
            "--where decode.temperature=0.0)") in notes
    assert rep.left_out == 2  # the t1 and the max_new_tokens=32 groups have no ar run
    out = tmp_path / "out"
    assert report.main([str(root), "--out", str(out), "--no-figures"]) == 0  # built; the left-out speedups are notes
    assert report.main([str(root), "--out", str(out), "--no-figures", "--strict"]) == 1
    assert (out / "adasd_table1__t1_max_new_tokens=128.md").read_text() == t1.markdown()


def test_an_ambiguous_cell_names_the_keys_and_the_where_of_each_run(tmp_path):
    write_run(tmp_path, "a", "vanilla", tps(30), gamma=5, parts={"rule": "rejection"})
    write_run(tmp_path, "b", "vanilla", tps(31), gamma=5, parts={"rule": "sample_match"})
    write_run(tmp_path, "c", "adasd", tps(45))
    runs = load.load_runs(tmp_path)
    rep = report.build_report(runs, ["adasd_table1_2"])
    (note,) = [n for n in rep.notes if n.startswith("adasd_table1_2")]
    assert "2 runs fit Vanilla (vanilla:gamma=5) on p/gsm8k; they differ in method.parts.rule" in note
    assert f"{tmp_path / 'a'}: --where method.parts.rule=rejection" in note and "--where method.parts.rule=sample_match" in note
    assert list(load.where(runs, ["method.parts.rule=rejection"]).sort_values("run_dir")["run_dir"]) == [
        str(tmp_path / "a"), str(tmp_path / "c")]  # adasd has no rule option: it stays
    assert rep.left_out == 1 and [t.name for t in rep.tables] == ["overview"]
    assert report.main([str(tmp_path), "--table", "adasd_table1_2", "--where", "method.parts.rule=rejection"]) == 0


def test_repeats_acceptance_truncation_and_predicted_speedup(tmp_path):
    ar = add_fields(write_run(tmp_path, "ar", "ar", tps(10)),
                    {"repeats": 3, "tokens_per_s_median": 10.0, "tokens_per_s_spread": {"min": 9.0, "max": 12.0},
                     "n_truncated": 0, "truncated_frac": 0.0, "predicted_speedup": None})
    add_fields(write_run(tmp_path, "vanilla", "vanilla", tps(28), gamma=5),
               {"repeats": 3, "tokens_per_s_median": 30.0, "tokens_per_s_spread": {"min": 27.0, "max": 36.0},
                "acceptance_exact": 0.6, "acceptance_relaxed": 0.0, "n_truncated": 1, "truncated_frac": 0.5,
                "predicted_speedup": 3.5})
    add_fields(write_run(tmp_path, "adasd", "adasd", [{"new": 45, "s": 1.0, "drafted": 10, "accepted": 8, "k": 2}]),
               {"repeats": 3, "tokens_per_s_median": 45.0, "tokens_per_s_spread": {"min": 40.0, "max": 48.0},
                "acceptance_exact": 0.5, "acceptance_relaxed": 0.3, "predicted_speedup": 4.0},
               [{"accepted_exact": 5, "accepted_relaxed": 3}])
    summary = tmp_path / "adasd" / "summary.json"  # an older summary: no truncation counts
    summary.write_text(json.dumps({k: v for k, v in json.loads(summary.read_text()).items()
                                   if k not in ("n_truncated", "truncated_frac")}))
    runs = load.load_runs(tmp_path)
    by = runs.set_index("method")
    assert by.loc["adasd", "missing"] == ("n_truncated", "truncated_frac", "decoded", "resumed")
    (t1, _) = adasd_tables(runs)
    # median throughputs: tk/sec 45, speedup 45 / 30; the intervals are over prompts: one prompt of 45 tok/s in
    # 1 s (the rows hold one repeat), so the interval of tk/sec is [45–45] and the paired speedup's [45/28–45/28]
    assert t1.values.loc[("p", "AdaSD"), ("GSM8K", "speedup")] == pytest.approx(1.5)
    assert t1.cells.loc[("p", "AdaSD"), ("GSM8K", "tk/sec")] == "45.000 [45.000–45.000]"
    assert t1.cells.loc[("p", "AdaSD"), ("GSM8K", "speedup")] == f"1.500 [{45 / 28:.3f}–{45 / 28:.3f}]"
    assert "median over repeats" in t1.title and "95% bootstrap interval" in t1.title
    rep = report.build_report(runs)
    ov = next(t for t in rep.tables if t.name == "overview")
    row = ov.cells.loc[("p · gsm8k", "adasd")]
    assert row[("", "tok/s")] == "45.0 [45.0–45.0]" and row[("", "speedup vs ar")] == "4.50 [4.50–4.50]"
    assert row[("", "predicted")] == "4.00" and row[("", "exact")] == "0.500" and row[("", "relaxed")] == "0.300"
    assert row[("", "truncated")] == "missing"  # an older summary: shown as missing, not as 0
    assert ov.cells.loc[("p · gsm8k", "ar"), ("", "predicted")] == ""  # null: not applicable
    assert ov.cells.loc[("p · gsm8k", "vanilla"), ("", "truncated")] == "1 (50%)"
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "speedup vs ar")] == pytest.approx(3.0)
    assert any(n.startswith(f"warning: {tmp_path / 'vanilla'}: 1 rows (50%) stopped at max_new_tokens=128")
               for n in rep.notes)
    assert not any(str(ar) in n for n in rep.notes)
    # no JS relaxation anywhere: no exact / relaxed columns
    plain = report.build_report(runs[runs["method"] != "adasd"])
    assert ("", "relaxed") not in next(t for t in plain.tables if t.name == "overview").values.columns


def test_a_null_budget_is_the_datasets_in_the_setting():
    """decode.max_new_tokens null decodes with the dataset's budget: the same setting as that budget given."""
    def record(decode_budget, dataset_budget=128):
        return {"config": {"method": {"name": "m"}, "dataset": {"name": "d", "max_new_tokens": dataset_budget},
                           "decode": {"seed": 0, "max_new_tokens": decode_budget}}, "device_info": {}}

    assert load.setting_of(record(None)) == load.setting_of(record(128)) != load.setting_of(record(32))
    assert [load.budget(record(b)["config"]) for b in (None, 128, 32)] == [128, 128, 32]
    assert load.budget(record(None, None)["config"]) is None  # neither set: no budget (such a run cannot exist)


def test_speedups_over_ar_pair_runs_of_the_same_batch_size(tmp_path):
    """ar at B = 1, 2; vanilla at B = 1, 2, 4 (no ar at 4): each vanilla run is divided by the ar run of its own
    batch size only; a config without batch_size is batch_size 1; the overview has a block per batch size."""
    write_run(tmp_path, "ar1", "ar", tps(10))  # no batch_size key: batch_size 1
    at_batch_size(write_run(tmp_path, "ar2", "ar", tps(16)), 2)
    at_batch_size(write_run(tmp_path, "v1", "vanilla", tps(25)), 1)  # the key, at 1
    at_batch_size(write_run(tmp_path, "v2", "vanilla", tps(20)), 2)
    at_batch_size(write_run(tmp_path, "v4", "vanilla", tps(30)), 4)
    runs = load.load_runs(tmp_path)
    by = runs.set_index(runs["run_dir"].map(lambda d: Path(d).name))
    assert by["batch_size"].to_dict() == {"ar1": 1, "ar2": 2, "v1": 1, "v2": 2, "v4": 4}
    assert by.loc["ar1", "setting"] == by.loc["v1", "setting"] != by.loc["v2", "setting"]
    assert baselines.find_baseline(by.loc["v1"], runs, "ar")["run_dir"] == str(tmp_path / "ar1")
    assert baselines.find_baseline(by.loc["v2"], runs, "ar")["run_dir"] == str(tmp_path / "ar2")
    with pytest.raises(ReportError, match=r"differ in batch_size \(4 vs 1\)"):  # never ar of another batch size
        baselines.find_baseline(by.loc["v4"], runs, "ar")
    assert list(load.where(runs, ["batch_size=1"])["run_dir"]) == [str(tmp_path / "ar1"), str(tmp_path / "v1")]
    (g,) = selection.groups(runs)  # batch_size is a table axis, like the seed: one group
    assert selection.labels(runs) == ["ar batch_size=1", "ar batch_size=2", "vanilla batch_size=1",
                                 "vanilla batch_size=2", "vanilla batch_size=4"]
    ov, notes = report.overview(g)
    assert ov.index_names == ("pair · dataset · batch_size", "run")
    sp = ov.values[("", "speedup vs ar")]
    assert sp[("p · gsm8k · batch_size=1", "vanilla")] == pytest.approx(25 / 10)
    assert sp[("p · gsm8k · batch_size=2", "vanilla")] == pytest.approx(20 / 16)
    assert sp[("p · gsm8k · batch_size=2", "ar")] == pytest.approx(1.0)
    assert math.isnan(sp[("p · gsm8k · batch_size=4", "vanilla")])
    assert [n.split(":")[0] for n in notes] == [f"speedup vs ar of {tmp_path / 'v4'} left out"]
    assert "*p · gsm8k · batch_size=2*" in ov.markdown()
    # one batch size: the overview as before, no batch_size in the headings
    (one,) = selection.groups(load.where(runs, ["batch_size=2"]))
    assert report.overview(one)[0].values.index.get_level_values(0).tolist() == ["p · gsm8k", "p · gsm8k"]


def test_runs_in_another_dtype_are_another_group(tmp_path):
    """Runs that differ only in the pair's dtype compare with the ar of their own dtype, not with each other's."""
    import json

    from specbench.analysis import load

    for dtype, s in (("float32", 2.0), ("bfloat16", 1.0)):
        for method, speed in (("ar", 1.0), ("pld", 0.5)):
            d = write_run(tmp_path, f"{dtype}/{method}", method, [{"new": 10, "s": s * speed}])
            record = json.loads((d / "config.json").read_text())
            record["config"]["pair"]["target"] = {"dtype": dtype}
            (d / "config.json").write_text(json.dumps(record))
    groups = selection.groups(load.load_runs(tmp_path))
    assert len(groups) == 2 and all(sorted(g.runs["method"]) == ["ar", "pld"] for g in groups)
    for g in groups:
        ar, pld = (g.runs[g.runs["method"] == m].iloc[0] for m in ("ar", "pld"))
        assert baselines.speedup_over(pld, ar) == pytest.approx(2.0)


def test_eager_runs_from_before_engine_compile_compare_with_eager_runs(tmp_path):
    """A config without engine.compile is an eager run: it shares a group with engine.compile=false; a compiled
    run forms its own group, compared with the compiled ar only."""
    import json

    from specbench.analysis import load

    for folder, method, engine, seconds in (("old/ar", "ar", None, 2.0), ("eager/pld", "pld", False, 1.0),
                                            ("comp/ar", "ar", True, 1.0), ("comp/pld", "pld", True, 0.25)):
        d = write_run(tmp_path, folder, method, [{"new": 10, "s": seconds}])
        if engine is not None:
            record = json.loads((d / "config.json").read_text())
            record["config"]["engine"] = {"compile": engine}
            (d / "config.json").write_text(json.dumps(record))
    runs = load.load_runs(tmp_path)
    groups = selection.groups(runs)
    assert sorted(sorted(g.runs["run_dir"].map(lambda d: Path(d).parent.name)) for g in groups) == [
        ["comp", "comp"], ["eager", "old"]]
    for g in groups:
        ar, pld = (g.runs[g.runs["method"] == m].iloc[0] for m in ("ar", "pld"))
        assert baselines.speedup_over(pld, ar) == pytest.approx(2.0 if not ar["flat"]["engine.compile"] else 4.0)


def test_a_default_run_and_a_batch_size_sweep_report_each_setting_once(tmp_path):
    """`python run.py` for ar and vanilla, then docs/usage.md's sweep `-m method=ar,vanilla batch_size=1,2`, each job
    in the folder run.py gives it: the batch_size=1 jobs resume the default runs' folders, so the report has one
    run per setting: unique overview labels, every run in the overview, no ambiguous baseline, B = 1 in the
    batch figure."""
    from specbench.analysis import figures
    from specbench.runs.layout import job_dir
    from specbench.runs.runner import run

    for method in ("ar", "vanilla"):
        for extra in ((), ("batch_size=1",), ("batch_size=2",)):
            cfg = small(f"method={method}", *extra, "limit=2", "decode.max_new_tokens=8", f"paths.results={tmp_path}")
            run(cfg, job_dir(cfg))
    runs = load.load_runs(tmp_path)
    assert sorted(zip(runs["method"], runs["batch_size"])) == [("ar", 1), ("ar", 2), ("vanilla", 1), ("vanilla", 2)]
    (g,) = selection.groups(runs)
    ov, notes = report.overview(g)
    assert notes == [] and list(ov.values.index) == [(f"tiny_random · smoke · batch_size={b}", m)
                                                     for b in (1, 2) for m in ("ar", "vanilla")]
    assert ov.values[("", "speedup vs ar")].notna().all()
    built = report.build_report(runs)
    assert not [n for n in built.notes if "ambiguous" in n or "differ in batch_size" in n], built.notes
    # each paper table once per batch size, comparing runs of that batch size only
    names = {t.name for t in built.tables}
    assert {"adasd_table1__batch_size=1", "adasd_table1__batch_size=2"} <= names and "adasd_table1" not in names
    data = figures.batch_speedups(runs)
    assert sorted(data["batch_size"]) == [1, 2] and set(data["label"]) == {"vanilla"}


def test_folders_of_one_run_from_older_versions_are_reported_once(tmp_path, caplog, capsys):
    """Older versions named a folder by a key at its default value: `default` and a sweep's `batch_size=1` hold one
    setting. The report keeps the newer of the two (the other named in a log line): unique labels, every setting
    in the overview, the baseline not ambiguous, B = 1 in the batch figure."""
    from specbench.analysis import figures

    for method, speed in (("ar", 10), ("vanilla", 25)):
        old = write_run(tmp_path, f"{method}/default", method, tps(speed), **({"gamma": 5} if method == "vanilla" else {}))
        add_fields(old, {"finished": "2025-01-01T10:00:00+0000"})
        add_fields(at_batch_size(old, 1, to=tmp_path / method / "batch_size=1"), {"finished": "2025-02-01T10:00:00+0000"})
        at_batch_size(old, 2, to=tmp_path / method / "batch_size=2", speed=1.5)
    runs = load.load_runs(tmp_path)
    assert sorted(Path(d).relative_to(tmp_path).as_posix() for d in runs["run_dir"]) == [
        "ar/batch_size=1", "ar/batch_size=2", "vanilla/batch_size=1", "vanilla/batch_size=2"]
    assert f"left out {tmp_path / 'ar/default'}: the same run (method, setting and examples) as " \
           f"{tmp_path / 'ar/batch_size=1'}" in caplog.text
    (g,) = selection.groups(runs)
    ov, notes = report.overview(g)
    assert notes == [] and ov.values.index.is_unique and len(ov.values) == 4
    assert ov.values[("", "speedup vs ar")][("p · gsm8k · batch_size=1", "vanilla")] == pytest.approx(2.5)
    assert not [n for n in report.build_report(runs).notes if "ambiguous" in n]
    assert sorted(figures.batch_speedups(runs)["batch_size"]) == [1, 2]
    # the CLI names the folder it did not report; at B = 1 every paper table is built, nothing left out (--strict: 0)
    assert report.main([str(tmp_path), "--no-figures", "--strict", "--where", "batch_size=1"]) == 0
    assert f"note: {tmp_path / 'ar/default'}: the same run as {tmp_path / 'ar/batch_size=1'}" in capsys.readouterr().err


def test_runs_of_one_setting_over_other_examples_are_told_apart(tmp_path):
    """Two runs of one setting over other examples (limit) are two runs: each gets its folder in its label and
    is compared with the baseline run over its own examples."""
    both, first = [{"new": 10, "s": 1.0, "id": "a"}, {"new": 10, "s": 1.0, "id": "b"}], [{"new": 10, "s": 2.0, "id": "a"}]
    for folder, rows in (("all", both), ("few", first)):
        write_run(tmp_path, f"{folder}/ar", "ar", rows)
        write_run(tmp_path, f"{folder}/vanilla", "vanilla", [{**r, "new": 20} for r in rows], gamma=5)
    runs = load.load_runs(tmp_path)
    assert sorted(selection.unique_labels(runs)) == ["ar [all/ar]", "ar [few/ar]", "vanilla [all/vanilla]",
                                                "vanilla [few/vanilla]"]
    few = runs[runs["run_dir"] == str(tmp_path / "few/vanilla")].iloc[0]
    assert baselines.find_baseline(few, runs, "ar")["run_dir"] == str(tmp_path / "few/ar")
    (g,) = selection.groups(runs)
    ov, notes = report.overview(g)
    assert notes == [] and ov.values.index.get_level_values(1).tolist() == [
        "ar [all/ar]", "vanilla [all/vanilla]", "ar [few/ar]", "vanilla [few/vanilla]"]
    assert ov.values[("", "speedup vs ar")].tolist() == [1.0, 2.0, 1.0, 2.0]


def test_a_paper_table_takes_only_its_own_methods(tmp_path):
    """GammaTune's Table 2 over gammatune and vanilla runs and a gammatune composed with another drafter: the composed
    run keeps its own name (its summary's method) and is not one of the table's GammaTune rows."""
    for g in (1, 2):
        write_run(tmp_path, f"v{g}", "vanilla", [{"new": 10, "s": 1.0, "drafted": 4, "accepted": 2, "k": 2}], gamma=g)
        write_run(tmp_path, f"g{g}", "gammatune", [{"new": 10, "s": 0.5, "drafted": 4, "accepted": 3, "k": 2}], gamma=g)
        composed = write_run(tmp_path, f"c{g}", "gammatune", [{"new": 10, "s": 0.1, "drafted": 4, "accepted": 4, "k": 2}],
                             gamma=g, parts={"policy": "gammatune", "drafter": "suffix"})
        add_fields(composed, {"method": "gammatune+drafter=suffix"})
    runs = load.load_runs(tmp_path)
    assert sorted(runs["method"].unique()) == ["gammatune", "gammatune+drafter=suffix", "vanilla"]
    speedups = gammatune_speedups(runs)
    gt = speedups[speedups["row"] == "GammaTune"]
    assert sorted(gt["gamma"]) == [1, 2] and list(gt["speedup"]) == pytest.approx([2.0, 2.0])


def test_a_pair_without_ar_is_named_with_the_command_that_adds_it():
    """The note carries the run's decode choice and its folder's overrides; a pair with ar anywhere gets none."""
    import pandas as pd
    from specbench.analysis.overview import without_ar

    runs = pd.DataFrame([
        {"pair": "toy", "dataset": "gsm8k", "method": "vanilla", "decode": "t1",
         "run_dir": "results/toy/gsm8k/vanilla/t1/batch_size=4,decode.max_new_tokens=48"},
        {"pair": "toy", "dataset": "smoke", "method": "vanilla", "decode": "greedy",
         "run_dir": "results/toy/smoke/vanilla/greedy/default"}])
    every = pd.concat([runs, pd.DataFrame([{"pair": "toy", "dataset": "smoke", "method": "ar", "decode": "greedy",
                                            "run_dir": "results/toy/smoke/ar/greedy/default"}])])
    assert without_ar(runs, every) == [
        "toy · gsm8k has no ar run, so its 'speedup vs ar' is empty; add one with: python run.py method=ar pair=toy "
        "dataset=gsm8k decode=t1 batch_size=4 decode.max_new_tokens=48"]
