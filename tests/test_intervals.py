"""specbench.analysis.intervals: the bootstrap intervals against scipy.stats.bootstrap (one repeat), their coverage on
data with a known answer (about 95 of 100 intervals cover it), values by hand, and the report's cells and --time."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from helpers import write_run
from specbench.analysis import intervals, load, overview, report
from specbench.analysis.selection import ReportError
from specbench.analysis.intervals import paired_interval, paired_value, prompt_arrays


def rows_of(tokens, seconds, *, score=None, repeat=0, first=None, later=None) -> list[dict]:
    """Rows of prompts p0..: new_tokens, decode_s, score, repeat (first: first_block_s; later: tokens after it)."""
    out = []
    for i, (n, s) in enumerate(zip(tokens, seconds)):
        r = {"id": f"p{i}", "repeat": repeat, "new_tokens": float(n), "decode_s": float(s), "target_calls": n / 2,
             "accepted": n / 2, "drafted": n, "score": None if score is None else float(score[i])}
        if first is not None:
            r["first_block_s"] = float(first[i])
            r["call_stats"] = {"accepted": [int(later[i]) - 1], "iterations": {"3": 1}}  # later[i] tokens
        out.append(r)
    return out


def test_values_by_hand():
    a = prompt_arrays(rows_of([10, 30], [1.0, 2.0], score=[1, 0]))
    b = prompt_arrays(rows_of([10, 30], [2.0, 6.0], score=[1, 1]))
    assert paired_value(a, b, "speedup") == pytest.approx((40 / 3) / (40 / 8))
    assert paired_value(a, b, "mean ratio") == pytest.approx(((10 / 1) / (10 / 2) + (30 / 2) / (30 / 6)) / 2)
    assert paired_value(a, b, "Δscore") == pytest.approx(0.5 - 1.0)
    # one prompt twice: both prompts' values identical, so every draw gives the value: a zero-width interval
    same = prompt_arrays(rows_of([10, 10], [1.0, 1.0]))
    assert intervals.interval(same, "tok/s") == pytest.approx((10.0, 10.0))
    # after the first block: 5 tokens over 1.0 - 0.5 s and 20 over 2.0 - 1.0 s
    c = prompt_arrays(rows_of([10, 30], [1.0, 2.0], first=[0.5, 1.0], later=[5, 20]))
    d = prompt_arrays(rows_of([10, 30], [2.0, 4.0], first=[1.0, 2.0], later=[5, 20]))
    assert paired_value(c, d, "speedup", "after_first_block") == pytest.approx((25 / 1.5) / (25 / 3.0))


def test_repeats_are_grouped_by_prompt_and_uneven_counts_kept():
    rows = rows_of([10, 20], [1.0, 1.0]) + rows_of([10], [2.0], repeat=1)  # p0 twice, p1 once
    p = prompt_arrays(rows)
    assert p.ids == ("p0", "p1") and p.count.tolist() == [2, 1]
    assert p.fields["seconds"][0].tolist() == [1.0, 2.0] and np.isnan(p.fields["seconds"][1, 1])
    lo, hi = intervals.interval(p, "tok/s")
    # every draw uses p0 at 10 tok/s or 5 tok/s and p1 at 20 tok/s: within [5, 20]
    assert 5.0 <= lo < hi <= 20.0


def test_unknown_statistic_or_time_is_refused_with_the_valid_names():
    p = prompt_arrays(rows_of([1], [1.0]))
    with pytest.raises(ValueError, match="valid statistics are tok/s, τ, AccRate, accept length, vllm length, score"):
        intervals.interval(p, "speedup")
    with pytest.raises(ValueError, match="valid times are decode, after_first_block"):
        intervals.interval(p, "tok/s", "wall")
    with pytest.raises(ValueError, match="share no prompt"):
        paired_interval(p, prompt_arrays([{**rows_of([1], [1.0])[0], "id": "other"}]), "speedup")


def synthetic(rng: np.random.Generator, n: int, speedup: float, repeats: int = 1):
    """Paired runs over n prompts: tokens ~ 20..200, b's seconds = tokens / 10 · noise, a's = b's / speedup with its
    own noise (lognormal, mean 1). The ratio of totals converges to `speedup`. Scores are 0/1 with P(a) = 0.6,
    P(b) = 0.7: a true Δscore of -0.1."""
    tokens = rng.integers(20, 200, n)
    base = tokens / 10.0
    sa, sb = [], []
    for r in range(repeats):
        noise_a, noise_b = rng.lognormal(-0.02, 0.2, n), rng.lognormal(-0.02, 0.2, n)
        sa += rows_of(tokens, base / speedup * noise_a, score=rng.random(n) < 0.6, repeat=r)
        sb += rows_of(tokens, base * noise_b, score=rng.random(n) < 0.7, repeat=r)
    return prompt_arrays(sa), prompt_arrays(sb)


def test_intervals_match_scipy_percentile_bootstrap():
    """One repeat: our interval of the paired speedup and of tok/s agree with scipy's percentile bootstrap within its
    Monte-Carlo error (a tenth of the interval's width)."""
    a, b = synthetic(np.random.default_rng(1), 40, 1.7)
    ta, sa = a.fields["new_tokens"][:, 0], a.fields["seconds"][:, 0]
    tb, sb = b.fields["new_tokens"][:, 0], b.fields["seconds"][:, 0]

    def speedup(x, y, u, v, axis=-1):
        return (x.sum(axis) / y.sum(axis)) / (u.sum(axis) / v.sum(axis))

    ref = stats.bootstrap((ta, sa, tb, sb), speedup, paired=True, vectorized=True, method="percentile",
                          n_resamples=20_000, rng=np.random.default_rng(0)).confidence_interval
    lo, hi = paired_interval(a, b, "speedup")
    assert abs(lo - ref.low) < 0.1 * (ref.high - ref.low) and abs(hi - ref.high) < 0.1 * (ref.high - ref.low)
    ref1 = stats.bootstrap((ta, sa), lambda x, y, axis=-1: x.sum(axis) / y.sum(axis), paired=True, vectorized=True,
                           method="percentile", n_resamples=20_000, rng=np.random.default_rng(0)).confidence_interval
    lo1, hi1 = intervals.interval(a, "tok/s")
    width = ref1.high - ref1.low
    assert abs(lo1 - ref1.low) < 0.1 * width and abs(hi1 - ref1.high) < 0.1 * width


@pytest.mark.parametrize("repeats", [1, 3])
def test_coverage_on_data_with_a_known_answer(repeats):
    """100 synthetic paired runs (40 prompts each): the speedup's interval covers the true 1.7 about 95 times in
    100, the Δscore's the true -0.1 about as often (a binomial(100, 0.95) count lies in [88, 100] with probability
    > 0.999; percentile intervals on 40 prompts run a little short, so [85, 100])."""
    rng = np.random.default_rng(7 + repeats)
    speedup = diff = 0
    for _ in range(100):
        a, b = synthetic(rng, 40, 1.7, repeats)
        lo, hi = paired_interval(a, b, "speedup")
        speedup += lo <= 1.7 <= hi
        lo, hi = paired_interval(a, b, "Δscore")
        diff += lo <= -0.1 <= hi
    assert 85 <= speedup <= 100 and 85 <= diff <= 100
    # and not a trivially wide interval: at 40 prompts the speedup's is well inside ±20%
    lo, hi = paired_interval(*synthetic(rng, 40, 1.7, repeats), "speedup")
    assert hi - lo < 0.4 * 1.7


def test_a_wrong_answer_is_not_covered():
    """The coverage check can fail: the intervals rarely cover a speedup 30% off the truth."""
    rng = np.random.default_rng(3)
    covered = sum(lo <= 1.7 * 1.3 <= hi for lo, hi in (paired_interval(*synthetic(rng, 40, 1.7), "speedup")
                                                        for _ in range(50)))
    assert covered < 5


def test_the_same_folder_gives_the_same_intervals():
    a, b = synthetic(np.random.default_rng(2), 30, 1.3)
    assert paired_interval(a, b, "mean ratio") == paired_interval(a, b, "mean ratio")
    assert intervals.interval(a, "score") == intervals.interval(a, "score")


def test_the_report_prints_intervals_and_marks_a_score_difference(tmp_path):
    """The overview's cells carry intervals; a lossy run scoring 0 where ar scores 1 on 20 prompts is marked ≠0, a
    run scoring as ar does is not; --time after_first_block divides by the time after the first block and says so."""
    n = 20
    write_run(tmp_path, "ar", "ar", [{"new": 50, "s": 5.0 + i % 3, "score": 1.0} for i in range(n)])
    write_run(tmp_path, "vanilla", "vanilla", [{"new": 50, "s": 2.0 + i % 2, "score": 1.0, "drafted": 40,
                                                "accepted": 30, "k": 8, "calls": 10} for i in range(n)], gamma=5)
    write_run(tmp_path, "adasd", "adasd", [{"new": 50, "s": 1.5, "score": float(i % 4 == 0), "drafted": 40,
                                            "accepted": 35, "k": 8, "calls": 9} for i in range(n)])
    rep = report.build_report(load.load_runs(tmp_path))
    ov = next(t for t in rep.tables if t.name == "overview")
    cells = ov.cells.droplevel(0)
    assert cells.loc["adasd", ("", "Δscore vs ar")].endswith(overview.DIFFERS)
    assert cells.loc["vanilla", ("", "Δscore vs ar")] == "+0.000 [+0.000–+0.000]"
    runs = load.load_runs(tmp_path).set_index("method")
    lo, hi = intervals.of_pair(runs.loc["vanilla"], runs.loc["ar"], "speedup")[1:]
    assert cells.loc["vanilla", ("", "speedup vs ar")] == f"{ov.values.droplevel(0).loc['vanilla', ('', 'speedup vs ar')]:.2f} [{lo:.2f}–{hi:.2f}]"
    assert lo < 1000 / 50 / (1000 / 120) < hi  # 50 tokens per prompt: vanilla 20 prompts in 50 s, ar in 120 s
    assert "95% bootstrap interval over prompts" in ov.title and intervals.TIMES["decode"] in ov.title
    with pytest.raises(ReportError, match="valid times are decode, after_first_block"):
        load.timed(load.load_runs(tmp_path), "wall")


def test_the_printed_median_over_repeats_lies_inside_its_interval():
    """tok/s is the median over repeats of each repeat's Σ tokens / Σ seconds; one slow repeat of three does not move
    the median, and the interval (repeats resampled as whole passes) holds it."""
    rng = np.random.default_rng(5)
    tokens = rng.integers(20, 200, 30)
    rows = []
    for r, slow in enumerate([1.0, 1.0, 1.6]):
        rows += rows_of(tokens, tokens / 100 * slow * rng.lognormal(0, 0.05, 30), repeat=r)
    p = prompt_arrays(rows)
    per_repeat = [sum(x["new_tokens"] for x in rows if x["repeat"] == r) / sum(x["decode_s"] for x in rows
                                                                                if x["repeat"] == r) for r in range(3)]
    assert intervals.value(p, "tok/s") == pytest.approx(float(np.median(per_repeat)))
    lo, hi = intervals.interval(p, "tok/s")
    assert lo <= intervals.value(p, "tok/s") <= hi
