"""predicted_speedup: the analytic speedup over ar from per-position acceptance and per-call costs."""

import random

import pytest

from specbench.decoding import speedup
from specbench.decoding.method import IterationRecord


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
