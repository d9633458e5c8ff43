"""predicted_speedup: the analytic speedup over ar from per-position acceptance and per-call costs, and the summary
that reports it from what the run folder recorded."""

import json
import random

import pytest

import specbench.runs.runner as runner
from helpers import small
from specbench.decoding import speedup
from specbench.decoding.records import IterationRecord
from specbench.runs import calibration, measurements
from specbench.runs.results import ROWS


def rec(w: int, n: int, draft_s: float = 0.0, verify_s: float = 0.0) -> IterationRecord:
    return IterationRecord(drafted=w, accepted=n, stop="window", draft_s=draft_s, verify_s=verify_s)


def test_a_hand_computed_case():
    """Prompt iteration left out; w=2 twice (n=2, n=0), w=1 once (n=1); target 1.0 s per call whatever
    its width, drafts 0.1 s per token. alpha_1 = 2/3 (3 reached, 2 accepted), alpha_2 = 1/1."""
    records = [rec(2, 2, 9.0, 9.0), rec(2, 2, 0.2, 1.0), rec(2, 0, 0.2, 1.0), rec(1, 1, 0.1, 1.0)]
    stats = speedup.call_stats(records)
    assert stats["iterations"] == {"2": 2, "1": 1} and stats["reached"] == [3, 1] and stats["accepted"] == [2, 1]
    assert speedup.alphas(stats) == pytest.approx([2 / 3, 1.0])
    costs = speedup.call_costs(stats, target_1=1.0)
    assert costs["target_1"] == 1.0 and costs["draft_per_token"] == pytest.approx(0.1)
    assert costs["target_by_width"] == pytest.approx({"2": 1.0, "3": 1.0})
    # E[T|2] = 1 + 2/3 + 2/3 = 7/3, E[T|1] = 5/3; seconds: 2 (2 * 0.1 + 1) + (0.1 + 1) = 3.5
    assert speedup.predicted_speedup(stats, costs) == pytest.approx((2 * 7 / 3 + 5 / 3) / 3.5)
    # an observed one-token call wins over the calibration; no drafting iteration: no prediction
    assert speedup.call_costs(speedup.call_stats([rec(0, 0), rec(0, 0, 0, 0.5)]), 9.0)["target_1"] == 0.5
    assert speedup.predicted_speedup(speedup.call_stats([rec(0, 0)]), costs) is None


def test_every_verified_position_has_its_alpha_zeros_included():
    """Positions verified but never accepted keep alpha 0: reached [38], accepted [] is [0.0] (not []); a head run
    whose second position was reached 3 times and never accepted reports [a_1, 0.0]; a tree's iterations too."""
    assert speedup.alphas({"reached": [38], "accepted": []}) == [0.0]
    assert speedup.alphas({"reached": [73, 3], "accepted": [3]}) == pytest.approx([3 / 73, 0.0])
    never = speedup.call_stats([rec(2, 0), rec(2, 0), rec(2, 0)])  # first left out: two iterations, nothing accepted
    assert never["reached"] == [2] and never["accepted"] == [] and speedup.alphas(never) == [0.0]
    deep = speedup.call_stats([rec(3, 0), rec(3, 1), rec(3, 1)])  # position 2 reached twice, never accepted
    assert speedup.alphas(deep) == pytest.approx([1.0, 0.0])
    tree = speedup.call_stats([rec(8, 0), IterationRecord(drafted=8, accepted=1, stop="tree", draft_s=0.0,
                                                           verify_s=0.0, depth=3)])
    assert speedup.alphas(tree) == pytest.approx([1.0, 0.0])  # depth 3: positions 1, 2 reached, 1 accepted


def test_leviathan_for_a_fixed_window():
    """One w, c_target(w+1) = c_target(1): (1 - a^(w+1)) / ((1 - a)(w c + 1)) with c = c_draft / c_target."""
    a, w, c = 0.7, 4, 0.05
    stats = {"iterations": {"4": 10}, "verify_s": {"4": 10.0}, "draft_s": {"4": 10 * w * c},
             "reached": [10, 7, 4.9, 3.43], "accepted": [7, 4.9, 3.43, 2.401]}  # alpha = a at every position
    assert speedup.predicted_speedup(stats, speedup.call_costs(stats, 1.0)) == pytest.approx(
        (1 - a ** (w + 1)) / ((1 - a) * (w * c + 1)))


def test_a_simulated_run_recovers_its_alphas_and_costs():
    """Iterations drawn with known per-position acceptance and known call costs: the estimates converge."""
    rng = random.Random(0)
    true_alpha, widths = [0.9, 0.6, 0.3], [1, 2, 3]
    c1, cd, cost = 1.0, 0.1, {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}  # cost[k]: a target call verifying k tokens
    records = [rec(3, 3, 1.0, 5.0)]  # the prompt's iteration: left out
    for _ in range(20_000):
        w = rng.choice(widths)
        n = 0
        while n < w and rng.random() < true_alpha[n]:
            n += 1
        records.append(rec(w, n, w * cd, cost[w + 1]))
    stats = speedup.call_stats(records)
    assert speedup.alphas(stats) == pytest.approx(true_alpha, abs=0.02)
    costs = speedup.call_costs(stats, c1)
    assert costs["draft_per_token"] == pytest.approx(cd) and costs["target_by_width"]["3"] == pytest.approx(1.2)
    expected = {w: speedup.expected_tokens(true_alpha, w) for w in widths}
    truth = sum(expected.values()) / sum(w * cd + cost[w + 1] for w in widths) * c1
    assert speedup.predicted_speedup(stats, costs) == pytest.approx(truth, rel=0.02)
    # rows keep the statistics in two fields; merging two halves gives the whole
    half = len(records) // 2
    rows = [speedup.row_fields(speedup.call_stats(records[:half])), speedup.row_fields(speedup.call_stats(records[half - 1:]))]
    merged = speedup.merge_stats(speedup.from_row(r) for r in rows)
    assert merged["iterations"] == stats["iterations"] and merged["reached"] == stats["reached"]


def test_above_batch_size_1_target_1_is_the_calibrations_never_a_rows():
    """At B > 1 a row's one-token verify shared a call as wide as the batch's widest window: c_target(1) is the
    calibration's (a call over B rows), and the costs say at which batch size and from where."""
    stats = speedup.call_stats([rec(0, 0), rec(0, 0, 0.0, 0.5), rec(2, 1, 0.2, 1.0)])
    one = speedup.call_costs(stats, 9.0)
    assert (one["batch_size"], one["target_1"], one["target_1_from"]) == (1, 0.5, "rows")
    four = speedup.call_costs(stats, 9.0, batch_size=4)
    assert (four["batch_size"], four["target_1"], four["target_1_from"]) == (4, 9.0, "calibration")
    assert four["target_by_width"] == one["target_by_width"] == {"1": 0.5, "3": 1.0}
    none = speedup.call_costs(stats, None, batch_size=4)
    assert none["target_1"] is None and none["target_1_from"] is None and speedup.predicted_speedup(stats, none) is None


def summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def counting_calibration(monkeypatch) -> list[int]:
    """calibration.calibrate_target_1, recording the rows of each call (the batch size it measured at)."""
    calls, real = [], calibration.calibrate_target_1

    def counting(job, examples, tokens=32):
        calls.append(len(examples))
        return real(job, examples, tokens)

    monkeypatch.setattr(calibration, "calibrate_target_1", counting)
    return calls


def test_pure_resumes_rewrite_the_same_summary_at_batch_size_2(tmp_path, monkeypatch):
    """The summary comes from what the folder recorded: resuming with no new rows rewrites summary.json
    identically (every number: predicted speedup, its costs, peak memory, finished); the target_1 calibration is
    measured once, at the run's batch size, and recorded, so the first summary's prediction is the resumes'."""
    calls = counting_calibration(monkeypatch)
    job = small("method=vanilla", "limit=4", "decode.max_new_tokens=12", "batch_size=2", "threads=1")
    runner.run(job, tmp_path)
    first = summary_of(tmp_path)
    runner.run(job, tmp_path)
    second = summary_of(tmp_path)
    runner.run(job, tmp_path)
    assert summary_of(tmp_path) == second  # every field
    assert (first["decoded"], first["resumed"], second["decoded"], second["resumed"]) == (4, 0, 0, 4)
    assert {k: v for k, v in first.items() if k not in ("decoded", "resumed")} == {
        k: v for k, v in second.items() if k not in ("decoded", "resumed")}
    assert calls == [2]  # one calibration, over a batch of 2 rows
    costs = second["call_costs"]
    record = measurements.target_1(tmp_path, 0, 2)
    assert costs["batch_size"] == 2 and costs["target_1_from"] == "calibration"
    assert costs["target_1"] == record["seconds"]
    assert record["rows"] == 2 and record["examples"] == ["smoke-00", "smoke-01"]
    assert second["predicted_speedup"] == first["predicted_speedup"] is not None
    # one process decoded rows: one record of its peak memory, which the summaries report
    (process,) = measurements.processes(tmp_path, 0)
    assert process["decoded"] == 4 and second["peak_rss_mb"] == process["peak_rss_mb"]
    assert second["finished"] == process["finished"]


def without_one_token_verifies(run_dir) -> list[dict]:
    """Remove every width-1 statistic (iterations that drafted nothing) from the folder's rows, by hand, so its
    summary must take target_1 from the calibration; the rows as rewritten."""
    rows = [json.loads(line) for line in (run_dir / ROWS).read_text().splitlines()]
    for r in rows:
        for key in ("call_stats", "call_seconds"):
            for part in r[key].values():
                if isinstance(part, dict):
                    part.pop("0", None)
    (run_dir / ROWS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_a_calibration_a_run_at_batch_size_1_needs_is_measured_once(tmp_path, monkeypatch):
    """Rows that never verified one token (here: any width-1 statistics removed by hand) take target_1 from the
    calibration: measured by the first summary that needs it, read back by every later one."""
    calls = counting_calibration(monkeypatch)
    job = small("method=vanilla", "limit=2", "decode.max_new_tokens=12", "threads=1")
    runner.run(job, tmp_path)
    without_one_token_verifies(tmp_path)
    runner.run(job, tmp_path)
    second = summary_of(tmp_path)
    runner.run(job, tmp_path)
    assert summary_of(tmp_path) == second and len(calls) <= 1 and calls == [1] * len(calls)
    assert calls == [1] and measurements.target_1(tmp_path, 0, 1)["seconds"] == second["call_costs"]["target_1"]
    assert second["call_costs"]["target_1_from"] == "calibration" and second["call_costs"]["batch_size"] == 1
    assert second["predicted_speedup"] is not None



def test_the_calibration_prefills_each_whole_prompt_once(tmp_path, monkeypatch):
    """The target_1 calibration's warm-up decodes the prompts cut to their first `tokens` tokens (8 here, below the
    smoke prompts' lengths); each of its measured passes decodes the whole prompts: a long prompt's prefill is paid
    once per pass, not by the warm-up."""
    import functools

    from specbench.decoding.engine import Engine

    real, seen = Engine.generate_batch, []

    def recording(self, prompts, *args, **kwargs):
        if self.method.name == "ar":
            seen.append([len(p) for p in prompts])
        return real(self, prompts, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate_batch", recording)
    monkeypatch.setattr(calibration, "calibrate_target_1", functools.partial(calibration.calibrate_target_1, tokens=8))
    job = small("method=vanilla", "limit=2", "decode.max_new_tokens=12", "threads=1", "warmup=0")
    runner.run(job, tmp_path)
    rows = without_one_token_verifies(tmp_path)  # a summary that had none calibrated, this one must
    runner.run(job, tmp_path)
    whole = [r["prompt_tokens"] for r in rows[:1]]  # batch_size 1: the calibration decodes the first example
    assert whole[0] > 8 and seen == [[8], *[whole] * calibration.PASSES]
    assert summary_of(tmp_path)["call_costs"]["target_1_from"] == "calibration"
