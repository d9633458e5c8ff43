"""Runs compared on the example ids they share (specbench.analysis.shared), in every table: the numbers recomputed by
hand on the shared ids of made-up rows, the notes that say on how many, the refusal when none is shared; and the
flags of runs measured at other machine loads, on other CPUs, or predicted with calibrations apart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import add_fields, write_run
from specbench.analysis import baselines, load, report, shared
from specbench.analysis.adasd_tables import adasd_tables
from specbench.analysis.gammatune_tables import gammatune_table2
from specbench.analysis.sd2_tables import sd2_table
from specbench.analysis.selection import ReportError
from specbench.common.files import write_json_atomic
from specbench.decoding.metrics import summarize

# ar over 100 examples q000..q099, 10 tokens each in 1 + i/10 s; its first 20 took Σ (1 + i/10) = 20 + 19 = 39 s
AR_100 = [{"id": f"q{i:03d}", "new": 10, "s": 1.0 + i / 10, "score": float(i % 2)} for i in range(100)]
AR_ON_20 = 200 / 39  # ar's tok/s on the 20 examples a limit=20 run holds
# vanilla over the first 20: 20 tokens in 1 s each, 8 drafted, 5 accepted, 2 drafting iterations, 10 target calls
VANILLA_20 = [{"id": f"q{i:03d}", "new": 20, "s": 1.0, "drafted": 8, "accepted": 5, "k": 2, "calls": 10,
               "score": 1.0} for i in range(20)]


def overview_row(rep: report.Report, run: str) -> tuple[dict, dict, tuple[str, ...]]:
    """The overview's numbers and cells of the run labelled `run`, and the overview's notes."""
    ov = next(t for t in rep.tables if t.name.startswith("overview"))
    at = next(i for i in ov.values.index if i[1] == run)
    return ({c: ov.values.loc[at, ("", c)] for _, c in ov.values.columns},
            {c: ov.cells.loc[at, ("", c)] for _, c in ov.cells.columns}, ov.notes)


def test_a_run_of_20_examples_against_ar_of_100_is_compared_on_the_20(tmp_path):
    write_run(tmp_path, "ar", "ar", AR_100)
    write_run(tmp_path, "vanilla", "vanilla", VANILLA_20, gamma=5)
    runs = load.load_runs(tmp_path)
    van, ar = (runs[runs["method"] == m].iloc[0] for m in ("vanilla", "ar"))
    assert ar["tokens_per_s_median"] == pytest.approx(1000 / (100 + 495))  # ar's own number: its 100 examples
    assert baselines.speedup_over(van, ar) == pytest.approx(20 / AR_ON_20)  # 3.9, not 20 / 1.68
    nums, cells, notes = overview_row(report.build_report(runs), "vanilla")
    assert nums["speedup vs ar"] == pytest.approx(3.9) and nums["mean ratio"] == pytest.approx(
        sum(20 / (10 / (1 + i / 10)) for i in range(20)) / 20)
    assert cells["speedup vs ar"].startswith("3.90 [")
    # Δscore on the 20: vanilla 1.0, ar's first 20 scores alternate 0, 1
    assert nums["Δscore vs ar"] == pytest.approx(1.0 - 0.5)
    assert "p · gsm8k: vanilla and ar compared on the 20 examples both hold (ar holds 100)" in notes
    # the paper table compares the same way: Target (ar) against Vanilla on the 20
    (t1,) = [t for t in adasd_tables(runs) if t.name == "adasd_table1"]
    assert t1.values.loc[("p", "Target"), ("GSM8K", "speedup")] == pytest.approx(AR_ON_20 / 20)
    assert t1.values.loc[("p", "Target"), ("GSM8K", "tk/sec")] == pytest.approx(AR_ON_20)  # its row: on the 20 too
    assert t1.values.loc[("p", "Target"), ("GSM8K", "acc")] == pytest.approx(0.5)
    assert "p · GSM8K: ar and vanilla compared on the 20 examples both hold (ar holds 100)" in t1.notes
    assert "compared on the 20 examples both hold (ar holds 100)" in t1.markdown()


def test_a_restricted_run_recomputes_every_number_from_its_rows(tmp_path):
    rows = [{"id": "a", "new": 40, "s": 1.0, "calls": 10, "drafted": 50, "accepted": 30, "k": 10, "score": 1.0},
            {"id": "b", "new": 20, "s": 3.0, "calls": 5, "drafted": 6, "accepted": 3, "k": 3, "score": 0.0},
            {"id": "c", "new": 10, "s": 1.0, "calls": 10, "drafted": 10, "accepted": 0, "k": 10, "score": 0.0}]
    run = load.load_runs(write_run(tmp_path, "v", "vanilla", rows)).iloc[0]
    assert run["tokens_per_s_median"] == pytest.approx(70 / 5)
    mine = shared.restricted(run, frozenset({"a", "b"}))
    assert mine["tokens_per_s_median"] == mine["tokens_per_s"] == pytest.approx(60 / 4)
    assert mine["acceptance_rate"] == pytest.approx(33 / 56) and mine["block_efficiency"] == pytest.approx(60 / 15)
    assert mine["mean_drafted"] == pytest.approx(56 / 13) and mine["score"] == pytest.approx(0.5)
    assert mine["prompts"].ids == ("a", "b") and sorted(mine["example_ids"]) == ["a", "b"]
    assert mine["label"] == run["label"] and mine["run_dir"] == run["run_dir"]
    assert shared.restricted(run, frozenset({"a", "b", "c"})) is run  # nothing to drop: the run itself


def test_a_restricted_runs_prediction_is_over_its_own_iterations_at_the_runs_call_costs(tmp_path):
    """Chains of 2 drafts: row a verified 4 (position 1 reached 4 times, accepted 3; position 2: 3, 1), row b 2 (2,
    1; 1, 0); calls cost target_1 0.01 s, a 3-token verify 0.02 s, a drafted token 0.005 s. predicted = Σ E[T | 2] /
    Σ (2 c_draft + c_target(3)) * target_1, with E[T | 2] = 1 + α_1 + α_1 α_2."""
    stats = [{"call_stats": {"iterations": {"2": k}, "reached": reached, "accepted": accepted},
              "call_seconds": {"verify_s": {"2": 0.02 * k}, "draft_s": {"2": 0.01 * k}}}
             for k, reached, accepted in ((4, [4, 3], [3, 1]), (2, [2, 1], [1, 0]))]
    costs = {"target_1": 0.01, "target_by_width": {"3": 0.02}, "draft_per_token": 0.005}
    full = 6 * (1 + 4 / 6 + 4 / 6 * 1 / 4) / (6 * 0.03) * 0.01  # α = 4/6, 1/4 over both rows
    run = add_fields(write_run(tmp_path, "v", "vanilla", [{"id": i, "new": 8, "s": 1.0} for i in "ab"]),
                     {"call_costs": costs, "predicted_speedup": full}, stats)
    loaded_run = load.load_runs(run).iloc[0]
    assert loaded_run["predicted_speedup"] == pytest.approx(full)
    mine = shared.restricted(loaded_run, frozenset({"a"}))
    assert mine["predicted_speedup"] == pytest.approx(4 * (1 + 3 / 4 + 3 / 4 * 1 / 3) / (4 * 0.03) * 0.01)
    assert mine["alphas"] == pytest.approx([3 / 4, 1 / 3])


def test_a_summarys_selected_ids_are_the_run(tmp_path):
    """A folder of 100 rows whose run (limit=20) selected 20: the summary covers those, and so does the report."""
    folder = write_run(tmp_path, "ar", "ar", AR_100)
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()][:20]
    record = json.loads((folder / "config.json").read_text())
    write_json_atomic(folder / "summary.json", {**summarize(rows), **record, "decoded": 0, "resumed": 20,
                                                "selected_ids": [r["id"] for r in rows]})
    write_run(tmp_path, "vanilla", "vanilla", VANILLA_20, gamma=5)
    runs = load.load_runs(tmp_path)
    ar = runs[runs["method"] == "ar"].iloc[0]
    assert ar["n_examples"] == 20 and ar["tokens_per_s_median"] == pytest.approx(AR_ON_20)
    assert len(load.load_examples(tmp_path)) == 40  # 20 rows of each run, not the folder's 100
    nums, _, notes = overview_row(report.build_report(runs), "vanilla")
    assert nums["speedup vs ar"] == pytest.approx(3.9) and not [n for n in notes if "compared on" in n]


def test_a_limit_resumed_in_a_bigger_folder_is_reported_over_the_limit(tmp_path):
    """The runner's own folders: ar with limit=3, then limit=2 in the same folder (resumed: its summary covers the
    2 it selects), vanilla with limit=2: the speedup is over those 2 examples, recomputed here from rows.jsonl."""
    from helpers import small
    from specbench.runs.runner import run

    for method, limit in (("ar", 3), ("ar", 2), ("vanilla", 2)):
        run(small(f"method={method}", f"limit={limit}", "decode.max_new_tokens=8", "threads=1"), tmp_path / method)
    ar_summary = json.loads((tmp_path / "ar" / "summary.json").read_text())
    assert ar_summary["n_examples"] == 2 and len(ar_summary["selected_ids"]) == 2
    rows = {m: [json.loads(line) for line in (tmp_path / m / "rows.jsonl").read_text().splitlines()]
            for m in ("ar", "vanilla")}
    assert len(rows["ar"]) == 3
    ids = {r["id"] for r in rows["vanilla"]}
    tps = {m: sum(r["new_tokens"] for r in rs if r["id"] in ids) / sum(r["decode_s"] for r in rs if r["id"] in ids)
           for m, rs in rows.items()}
    nums, _, notes = overview_row(report.build_report(load.load_runs(tmp_path)), "vanilla")
    assert nums["speedup vs ar"] == pytest.approx(tps["vanilla"] / tps["ar"])
    assert not [n for n in notes if "compared on" in n]  # both runs are of the same 2 examples


def test_the_gammatune_table_divides_by_the_grid_on_the_shared_examples(tmp_path):
    # vanilla γ = 1, 2 over 100 examples: on the first 20, 10 and 20 tok/s (1 s each); the other 80 take 2 s
    for g, new in ((1, 10), (2, 20)):
        write_run(tmp_path, f"vanilla{g}", "vanilla", [{"id": f"q{i:03d}", "new": new, "s": 1.0 if i < 20 else 2.0}
                                                       for i in range(100)], gamma=g)
        write_run(tmp_path, f"gammatune{g}", "gammatune", [{"id": f"q{i:03d}", "new": 30, "s": 1.0}
                                                           for i in range(20)], gamma=g)
    (t,) = gammatune_table2(load.load_runs(tmp_path))
    # 30 / mean(10, 20) at both γ on the 20 (on every row of the grid it would be 30 / mean(1000/180, 2000/180))
    assert t.values.loc[("", "GammaTune"), ("p", "mean")] == pytest.approx(2.0)
    assert t.values.loc[("", "GammaTune"), ("p", "std")] == pytest.approx(0.0)
    # SpecDecode: the grid against itself, on its 100: 1000/180 and 2000/180 over their mean
    assert t.values.loc[("", "SpecDecode"), ("p", "mean")] == pytest.approx(1.0)
    assert t.values.loc[("", "SpecDecode"), ("p", "std")] == pytest.approx(1 / 3)
    assert any("compared on the 20 examples all 3 hold" in n and "holds 100" in n for n in t.notes)


def test_sd2_alpha_and_tau_are_over_the_examples_a_run_shares_with_its_baseline(tmp_path):
    write_run(tmp_path, "pre", "vanilla", [{"id": f"q{i:03d}", "new": 20, "s": 1.0 if i < 20 else 4.0, "calls": 10}
                                           for i in range(100)], temperature=1.0, gamma=8)
    write_run(tmp_path, "sd2", "sd2", [{"id": f"q{i:03d}", "new": 30, "s": 1.0, "calls": 10} for i in range(20)],
              temperature=1.0, gamma=8)
    (t,) = sd2_table(load.load_runs(tmp_path), 1.0)
    assert t.values.loc[("p", "SD²"), ("GSM8K", "α")] == pytest.approx(30 / 20)
    assert t.values.loc[("p", "SD²"), ("GSM8K", "τ")] == pytest.approx(3.0)
    assert any("sd2 and vanilla" in n and "compared on the 20 examples both hold (vanilla holds 100)" in n
               for n in t.notes)


def test_runs_that_share_no_example_are_refused_with_the_command_that_runs_them(tmp_path):
    ar = write_run(tmp_path, "ar", "ar", [{"id": i, "new": 10, "s": 1.0} for i in "ab"])
    van = write_run(tmp_path, "vanilla", "vanilla", [{"id": i, "new": 20, "s": 1.0} for i in "cde"], gamma=5)
    for folder, limit in ((ar, 2), (van, 3)):
        record = json.loads((folder / "config.json").read_text())
        record["config"]["limit"] = limit
        write_json_atomic(folder / "config.json", record)
    runs = load.load_runs(tmp_path)
    with pytest.raises(ReportError, match=r"p · gsm8k: ar and vanilla share no example id.*ar holds 2 \(a, b\); "
                                          r"vanilla holds 3 \(c, d, e\)\); run vanilla's examples with the others: "
                                          r"python run.py method=ar pair=p dataset=gsm8k decode=greedy limit=3$"):
        shared.compared([r for _, r in runs.iterrows()], "p · gsm8k")
    rep = report.build_report(runs)
    assert any("share no example id" in n and "python run.py method=ar pair=p dataset=gsm8k decode=greedy limit=3"
               in n for n in rep.notes)
    assert math.isnan(overview_row(rep, "vanilla")[0]["speedup vs ar"])


def loaded(root: Path, method: str, folder: str, summary: dict, cpu: str | None = None, **options) -> Path:
    """A one-row run whose summary.json gains `summary` and whose config.json records the CPU model `cpu`."""
    run = add_fields(write_run(root, folder, method, [{"new": 20, "s": 1.0, "drafted": 4, "accepted": 2, "k": 1}],
                               **options), summary)
    if cpu is not None:
        record = json.loads((run / "config.json").read_text())
        record["runtime"] = {"cpu": {"model": cpu, "flags": ["avx2"]}}
        write_json_atomic(run / "config.json", record)
    return run


@pytest.mark.parametrize("ar_load, van_load, flagged", [(3.2, 1.1, True), (1.6, 1.1, False), (None, 1.1, False)])
def test_speedups_between_runs_at_different_loads_are_flagged(tmp_path, ar_load, van_load, flagged):
    loaded(tmp_path, "ar", "ar", {} if ar_load is None else {"load_average_median": ar_load})
    loaded(tmp_path, "vanilla", "vanilla", {"load_average_median": van_load}, gamma=5)
    rep = report.build_report(load.load_runs(tmp_path))
    _, _, notes = overview_row(rep, "vanilla")
    flag = [n for n in notes if "different machine loads" in n]
    assert bool(flag) == flagged
    if flagged:  # said under the table and in the notes, with both loads
        assert "vanilla and ar measured at different machine loads (median 1-minute load average vanilla 1.10, " \
               "ar 3.20; more than 1.0 apart)" in flag[0]
        assert any(n.startswith(flag[0]) and "[under overview" in n for n in rep.notes)
        (t1,) = [t for t in rep.tables if t.name == "adasd_table1"]  # the paper's table flags its speedup too
        assert any("different machine loads" in n for n in t1.notes)


@pytest.mark.parametrize("cpus, flagged", [(("Xeon 8480", "EPYC 9654"), True), (("Xeon 8480", "Xeon 8480"), False),
                                           ((None, "EPYC 9654"), False)])
def test_speedups_between_runs_on_different_cpus_are_flagged(tmp_path, cpus, flagged):
    loaded(tmp_path, "ar", "ar", {}, cpus[0])
    loaded(tmp_path, "vanilla", "vanilla", {}, cpus[1], gamma=5)
    _, _, notes = overview_row(report.build_report(load.load_runs(tmp_path)), "vanilla")
    flag = [n for n in notes if "different CPUs" in n]
    assert bool(flag) == flagged
    if flagged:
        assert "(vanilla: EPYC 9654; ar: Xeon 8480)" in flag[0]


@pytest.mark.parametrize("t1, flagged", [((0.0028, 0.0071), True), ((0.0050, 0.0054), False), ((None, 0.0071), False)])
def test_predictions_with_calibrations_apart_are_flagged(tmp_path, t1, flagged):
    """target_1 0.0028 s against 0.0071 s: 154% apart; 0.0050 against 0.0054: 8%, within the 10%."""
    loaded(tmp_path, "ar", "ar", {})
    for method, t in zip(("vanilla", "gammatune"), t1):
        costs = {"call_costs": {"target_1": t, "target_by_width": {"2": 0.01}, "draft_per_token": 0.001}}
        loaded(tmp_path, method, method, {"predicted_speedup": 1.5, **(costs if t is not None else {})}, gamma=5)
    _, _, notes = overview_row(report.build_report(load.load_runs(tmp_path)), "vanilla")
    flag = [n for n in notes if "target_1 calibrations" in n]
    assert bool(flag) == flagged
    if flagged:
        assert "p · gsm8k: the predicted speedups price ar's step at target_1 calibrations from 2.8 ms (vanilla) " \
               "to 7.1 ms (gammatune), 154% apart (more than 10%)" in flag[0]
