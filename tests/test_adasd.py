"""AdaSD and its variants (methods/adasd.py) against hand-worked threshold updates, the paper's example,
exact equalities with ar / vanilla, and the distribution test for the lossless Gen-Only ablation."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.decoding.method import Method
from specbench.decoding.records import IterationRecord
from specbench.decoding.policy import POLICIES
from specbench.runs.runner import build_method, run
from helpers import PROMPT, V, chi2_pvalue, compose_cfg, small, table_engine, target_joint
from table_lm import TableLM

LOSSY = ["adasd", "adasd_verify_only", "adasd_variant_a", "adasd_variant_b", "adasd_variant_c"]
ALL = LOSSY + ["adasd_gen_only"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread avoids spinning-thread stalls (~5x)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def rec(w: int, n: int, entropy: list[float] | None = None, js: list[float] | None = None) -> IterationRecord:
    """A hand-made iteration record: w drafted, n accepted, per-position H(q_i) and d_JS(p_i, q_i)."""
    return IterationRecord(drafted=w, accepted=n, stop="policy", draft_s=0.0, verify_s=0.0, entropy=entropy, js=js)


def method(name: str, **options):
    """The policy of method `name` with `options`, reset."""
    m = build_method({"name": name, **options}).policy
    m.reset()
    return m


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


# --- threshold updates on a hand-worked sequence --------------------------------------------------

# Positions after the first rejected one (9.9 bits, 0.99) must enter no list.
SEQ = [
    rec(1, 0, [2.0], [0.6]),  # rejected at 1:  L_E^R = [2.0], L_D^R = [0.6], L_D^A = []
    rec(3, 3, [0.5, 1.0, 1.5], [0.1, 0.2, 0.3]),  # all accepted: L_D^A = [.1, .2, .3]
    rec(4, 1, [0.2, 3.0, 9.9, 9.9], [0.3, 0.8, 0.99, 0.99]),  # L_D^A += [.3]; rejected at 2: 3.0, 0.8
    rec(2, 2, [0.1, 0.1], [0.1, 0.1]),  # L_D^A = [.1, .2, .3, .3, .1, .1] (sum 1.1, n 6)
]
# T_G = mean(L_E^R) after each record: 2.0, 2.0, (2 + 3)/2, unchanged
T_G = [2.0, 2.0, 2.5, 2.5]
# T_V after each record, worked by hand (c_a / c_r: iterations with an accepted / a rejected draft):
T_V = {
    # (mean A + mean R) / 2: A empty -> 0; (.2 + .6)/2; (.225 + .7)/2; (1.1/6 + .7)/2
    "adasd": [0.0, 0.4, 0.4625, (1.1 / 6 + 0.7) / 2],
    # mean A: empty -> 0; .6/3; .9/4; 1.1/6
    "adasd_variant_a": [0.0, 0.2, 0.225, 1.1 / 6],
    # pooled: .6/1; 1.2/4; (.9 + 1.4)/6; (1.1 + 1.4)/8
    "adasd_variant_b": [0.6, 0.3, 2.3 / 6, 0.3125],
    # (c_a mean A + c_r mean R)/(c_a + c_r): A empty -> 0; c=(1,1): .4; c=(2,2): .4625; c=(3,2): (.55 + 1.4)/5
    "adasd_variant_c": [0.0, 0.4, 0.4625, 0.39],
}


@pytest.mark.parametrize("name", sorted(T_V))
def test_threshold_updates_by_hand(name):
    m = method(name)
    assert (m.t_g, m.t_v, m.relaxation()) == (0.0, 0.0, 0.0)
    for r, t_g, t_v in zip(SEQ, T_G, T_V[name]):
        m.update(r)
        assert m.t_g == pytest.approx(t_g, abs=1e-12)
        assert m.t_v == pytest.approx(t_v, abs=1e-12)
        assert m.relaxation() == m.t_v  # the engine hands the new T_V to the js_relaxed rule
        assert m.state() == {"t_g": m.t_g, "t_v": m.t_v}


def test_lists_hold_the_accepted_and_the_first_rejected_draft_only():
    m = method("adasd")
    for r in SEQ:
        m.update(r)
    assert (m.acc_js.n, m.acc_js.total) == (6, pytest.approx(1.1))
    assert (m.rej_js.n, m.rej_js.total) == (2, pytest.approx(1.4))
    assert (m.rej_entropy.n, m.rej_entropy.total) == (2, pytest.approx(5.0))
    assert (m.c_a, m.c_r) == (3, 2)


def test_gen_only_and_verify_only_updates():
    g, v = method("adasd_gen_only"), method("adasd_verify_only")
    plans = [build_method({"name": n}).plan for n in ("adasd_gen_only", "adasd_verify_only")]
    assert [p.rule for p in plans] == ["sample_match", "js_relaxed(sample_match)"]
    for r, t_g, t_v in zip(SEQ, T_G, T_V["adasd"]):
        g.update(r)
        v.update(r)
        assert g.state() == {"t_g": pytest.approx(t_g)}  # no verification threshold
        assert v.state() == {"gamma": 5, "t_v": pytest.approx(t_v)}


def paper_records(kind: str) -> list[IterationRecord]:
    """20 accepted drafts with mean d_JS 0.15 and 20 rejected with mean 0.49 (section 4.4's example)."""
    acc = [0.05, 0.25] * 10  # mean 0.15
    rej = [0.39, 0.59] * 10  # mean 0.49
    if kind == "paired":  # 20 iterations: one accepted then one rejected draft
        return [rec(2, 1, [1.0, 2.0], [a, r]) for a, r in zip(acc, rej)]
    # 10 iterations with two accepted then a rejected draft, 10 iterations rejected at once
    out = [rec(3, 2, [1.0, 1.0, 2.0], [acc[2 * k], acc[2 * k + 1], rej[k]]) for k in range(10)]
    return out + [rec(1, 0, [3.0], [r]) for r in rej[10:]]


@pytest.mark.parametrize("kind,expected", [
    ("paired", {"adasd": 0.32, "adasd_variant_a": 0.15, "adasd_variant_b": 0.32, "adasd_variant_c": 0.32}),
    # c_a = 10, c_r = 20: variant C = (10 * .15 + 20 * .49) / 30
    ("unpaired", {"adasd": 0.32, "adasd_variant_a": 0.15, "adasd_variant_b": 0.32,
                  "adasd_variant_c": 11.3 / 30}),
])
def test_the_papers_example(kind, expected):
    for name, t_v in expected.items():
        m = method(name)
        for r in paper_records(kind):
            m.update(r)
        assert m.t_v == pytest.approx(t_v, abs=1e-12), name
    m = method("adasd")
    for r in paper_records(kind):
        m.update(r)
    assert m.t_g == pytest.approx(2.0 if kind == "paired" else 2.5)  # (10 * 2 + 10 * 3) / 20


@pytest.mark.parametrize("name", sorted(T_V) + ["adasd_gen_only", "adasd_verify_only"])
def test_empty_lists_keep_thresholds_at_zero(name):
    m = method(name)
    m.update(rec(0, 0))  # nothing drafted (length cap): no statistics at all
    assert (m.t_g, m.t_v if m.relaxed else 0.0) == (0.0, 0.0)
    m.update(rec(2, 2, [1.0, 1.5], [0.2, 0.4]))  # accepted only: L_E^R and L_D^R stay empty
    assert m.t_g == 0.0
    if m.relaxed:  # A and B average what there is; AdaSD and C need a rejection too
        assert m.t_v == pytest.approx(0.3 if name in ("adasd_variant_a", "adasd_variant_b") else 0.0)
    m = method(name)
    m.update(rec(1, 0, [1.25], [0.7]))  # rejected only: L_D^A stays empty
    assert m.t_g == 1.25
    if m.relaxed:
        assert m.t_v == pytest.approx(0.7 if name == "adasd_variant_b" else 0.0)


def test_reset_clears_state_unless_persisted():
    for persist in (False, True):
        m = method("adasd", persist=persist)
        for r in SEQ:
            m.update(r)
        m.reset()
        expected = (0.0, 0.0, 0) if not persist else (2.5, T_V["adasd"][-1], 6)
        assert (m.t_g, m.relaxation(), m.acc_js.n) == pytest.approx(expected)


def test_fixed_t_v_is_never_updated():
    m = method("adasd", fixed_t_v=0.25)
    assert m.relaxation() == 0.25
    for r in SEQ:
        m.update(r)
    assert (m.t_v, m.relaxation(), m.t_g) == (0.25, 0.25, 2.5)  # T_G still adapts


def test_bad_options_fail():
    with pytest.raises(ValueError, match="sample_match, rejection"):
        build_method({"name": "adasd", "parts": {"rule": "js_relaxed(sample_match)"}})
    with pytest.raises(ValueError, match="no verification threshold"):
        build_method({"name": "adasd_gen_only", "fixed_t_v": 0.1})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        build_method({"name": "adasd", "fixed_t_v": 1.5})
    with pytest.raises(ValueError, match="unknown options"):
        build_method({"name": "adasd_verify_only", "window": 20})
    with pytest.raises(ValueError, match="integer >= 1"):
        build_method({"name": "adasd", "gamma": 0})


# --- the draft policy --------------------------------------------------------------------------------

Q_1_75 = torch.tensor([0.5, 0.25, 0.125, 0.125])  # H = 1/2 + 2/4 + 3/8 + 3/8 = 1.75 bits
Q_2_5 = torch.tensor([0.25, 0.25, 0.125, 0.125, 0.125, 0.125])  # H = 2 * 2/4 + 4 * 3/8 = 2.5 bits
ONE_HOT = torch.tensor([0.0, 1.0, 0.0])  # H = 0


@pytest.mark.parametrize("name", ["adasd", "adasd_gen_only", "adasd_variant_c"])
def test_entropy_stop(name):
    m = method(name)
    assert m.keep_drafting(1, ONE_HOT, 1)  # H = 0 <= T_G = 0
    assert not m.keep_drafting(1, Q_1_75, 0)  # T_G = 0 < 1.75: stop after the first token
    m.update(rec(2, 0, [1.5, 7.0], [0.5, 0.5]))
    m.update(rec(1, 0, [2.5], [0.5]))  # T_G = (1.5 + 2.5) / 2 = 2.0
    assert m.t_g == 2.0
    assert m.keep_drafting(3, Q_1_75, 0)
    assert not m.keep_drafting(3, Q_2_5, 0)
    assert m.window() == 20 and method(name, gamma=7).window() == 7


def test_verify_only_drafts_gamma_tokens():
    m = method("adasd_verify_only")
    assert m.window() == 5 and method("adasd_verify_only", gamma=3).window() == 3
    assert m.keep_drafting(1, Q_2_5, 0) and m.keep_drafting(4, torch.full((8,), 1 / 8), 0)


def engine(m, temperature: float = 1.0) -> Engine:
    """An engine of the method `m`, or of the AdaSD method around the policy `m`."""
    if not isinstance(m, Method):
        name = next(n for n in POLICIES.names() if POLICIES.get(n) is type(m))
        m = dataclasses.replace(build_method({"name": name}), policy=m)
    return table_engine(m, TableLM(V, 11), TableLM(V, 12), temperature, 128)


def test_window_cap_is_20():
    m = method("adasd", persist=True)  # reset() keeps the T_G set here
    m.t_g = 100.0  # above any entropy of a vocabulary of 8 (<= 3 bits): only the window stops drafting
    gen = engine(m).generate(PROMPT, 60, generator=torch.Generator().manual_seed(0))
    assert gen.records[0].drafted == 20 and gen.records[0].stop == "window"
    assert all(r.drafted <= 20 for r in gen.records)
    m = method("adasd", gamma=7, persist=True)
    m.t_g = 100.0
    gen = engine(m).generate(PROMPT, 60, generator=torch.Generator().manual_seed(0))
    assert gen.records[0].drafted == 7 and all(r.drafted <= 7 for r in gen.records)


def test_js_relaxed_acceptances_count_as_accepted():
    """With T_V = 1 every draft passes (d_JS <= 1): all enter L_D^A, none is rejected, so T_G stays 0
    and, every entropy being > 0, each iteration drafts one token (+ bonus); the 31st token has w = 0."""
    m = method("adasd", fixed_t_v=1.0)
    gen = engine(m).generate(PROMPT, 31, generator=torch.Generator().manual_seed(0))
    assert [r.drafted for r in gen.records] == [1] * 15 + [0]
    assert sum(r.accepted for r in gen.records) == m.acc_js.n == 15
    assert m.rej_js.n == m.rej_entropy.n == 0 and m.t_g == 0.0


def test_relaxed_acceptances_are_counted_apart_from_exact_ones():
    """Greedy with T_V = 1: every draft passes; the exact rule (argmax matching) would have accepted exactly the
    drafts equal to the target's argmax after their prefix (TableLM.logits_for), the others only the relaxation."""
    m = method("adasd", fixed_t_v=1.0)
    target = TableLM(V, 11)
    eng = engine(m, 0.0)  # its target: TableLM(V, 11), as `target`
    gen = eng.generate(PROMPT, 61)
    out, pos, relaxed = gen.token_ids, 0, []
    for r in gen.records[:-1]:  # the last block may be cut by max_new_tokens
        assert r.accepted == r.drafted
        drafts = out[pos : pos + r.accepted]
        relaxed.append(sum(t != int(target.logits_for(PROMPT + out[: pos + i]).argmax()) for i, t in enumerate(drafts)))
        pos += r.accepted + 1
    assert [r.accepted_relaxed for r in gen.records[:-1]] == relaxed
    assert 0 < sum(relaxed) < sum(r.accepted for r in gen.records[:-1])  # both kinds occurred


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logged_thresholds_follow_the_records(temperature):
    """On real iterations, the logged T_G and T_V equal Algorithm 1 recomputed from the records."""
    m = method("adasd")
    gen = engine(m, temperature).generate(PROMPT, 80, generator=torch.Generator().manual_seed(3))
    acc, rej_d, rej_e, t_g, t_v = [], [], [], 0.0, 0.0
    for r in gen.records:
        if r.drafted:
            acc += r.js[: r.accepted]
            if r.accepted < r.drafted:
                rej_d.append(r.js[r.accepted])
                rej_e.append(r.entropy[r.accepted])
        t_g = sum(rej_e) / len(rej_e) if rej_e else t_g
        t_v = (sum(acc) / len(acc) + sum(rej_d) / len(rej_d)) / 2 if acc and rej_d else t_v
        assert r.state == {"t_g": pytest.approx(t_g), "t_v": pytest.approx(t_v)}
    assert rej_d and acc and max(r.drafted for r in gen.records) > 1  # the test exercised both lists


# --- end to end through the runner (tiny_random) -------------------------------------------------------

def test_configs_build_the_registered_methods():
    for name in ALL:
        cfg = compose_cfg(f"method={name}").method
        m = build_method(dict(cfg))
        assert m.name == name and m.plan.lossless == (name == "adasd_gen_only")
        assert m.policy.window() == (5 if name == "adasd_verify_only" else 20)
        assert not m.policy.persist and m.policy.fixed_t_v is None


@pytest.fixture(scope="module")
def ar_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("ar")
    run(small("method=ar", "decode.max_new_tokens=32"), out)
    return rows(out)


def test_gen_only_greedy_equals_ar(tmp_path, ar_rows):
    summary = run(small("method=adasd_gen_only", "decode.max_new_tokens=32"), tmp_path)
    got = rows(tmp_path)
    assert len(got) == len(ar_rows) == 24
    for a, g in zip(ar_rows, got):
        assert g["id"] == a["id"] and g["token_ids"] == a["token_ids"], g["id"]
        assert g["lossless"] is True and g["mean_t_g"] is not None and g["mean_t_v"] is None
    assert summary["lossless"] is True
    assert 0.1 < summary["acceptance_rate"] < 0.95  # drafts were both accepted and rejected
    assert all(g["accepted_relaxed"] == 0 and g["accepted_exact"] == g["accepted"] for g in got)
    assert summary["acceptance_exact"] == summary["acceptance_rate"] and summary["acceptance_relaxed"] == 0
    assert max(g["mean_drafted"] for g in got) > 1.5  # the entropy stop let windows grow


def test_adasd_rows_are_lossy_and_report_t_v(tmp_path):
    summary = run(small("method=adasd", "decode.max_new_tokens=32"), tmp_path)
    got = rows(tmp_path)
    assert summary["lossless"] is False and all(r["lossless"] is False for r in got)
    assert all(r["mean_t_v"] is not None and r["mean_t_g"] is not None for r in got)
    assert max(r["mean_t_v"] for r in got) > 0 and summary["example_means"]["mean_t_v"] > 0
    assert all(r["accepted_exact"] + r["accepted_relaxed"] == r["accepted"] for r in got)
    assert sum(r["accepted_relaxed"] for r in got) > 0  # the relaxation accepted drafts the exact rule rejected
    drafted = sum(r["drafted"] for r in got)
    assert summary["acceptance_relaxed"] == pytest.approx(sum(r["accepted_relaxed"] for r in got) / drafted)
    assert summary["acceptance_exact"] + summary["acceptance_relaxed"] == pytest.approx(summary["acceptance_rate"])


@pytest.mark.parametrize("name", ["adasd_verify_only", "adasd_variant_a", "adasd_variant_b", "adasd_variant_c"])
def test_lossy_variants_rows(tmp_path, name):
    summary = run(small(f"method={name}", "limit=2", "decode.max_new_tokens=16"), tmp_path)
    got = rows(tmp_path)
    assert len(got) == 2 and summary["lossless"] is False and all(r["lossless"] is False for r in got)
    assert all(r["mean_t_v"] is not None for r in got)
    if name == "adasd_verify_only":
        assert all(r["mean_t_g"] is None and r["mean_drafted"] <= 5 for r in got)


def test_verify_only_with_t_v_0_equals_vanilla_sample_match_at_t1(tmp_path):
    common = ("decode=t1", "decode.seed=7", "decode.max_new_tokens=32", "limit=8")
    run(small("method=vanilla", "method.gamma=5", "method.parts.rule=sample_match", *common), tmp_path / "v")
    summary = run(small("method=adasd_verify_only", "method.fixed_t_v=0", *common), tmp_path / "a")
    v, a = rows(tmp_path / "v"), rows(tmp_path / "a")
    assert len(v) == len(a) == 8
    for x, y in zip(v, a):
        assert x["token_ids"] == y["token_ids"], x["id"]
        assert (x["drafted"], x["accepted"]) == (y["drafted"], y["accepted"])
    # at T=1 the random tiny pair rarely matches samples (~1%), but both paths must occur
    assert sum(y["accepted"] for y in a) >= 5 and summary["acceptance_rate"] < 0.9


# --- Gen-Only keeps the target distribution (tests/test_distribution.py's chi-square) -----------------

def joint_counts(cfg: dict, n: int) -> tuple[np.ndarray, list[int]]:
    """Counts [V, V] of the first two of 3 new tokens over n decodes of PROMPT at T=1, and all windows."""
    m, g = build_method(cfg), torch.Generator().manual_seed(1234)
    eng = engine(m)
    counts, windows = np.zeros((V, V)), []
    for _ in range(n):
        gen = eng.generate(PROMPT, 3, generator=g)
        counts[gen.token_ids[0], gen.token_ids[1]] += 1
        windows += [r.drafted for r in gen.records]
    return counts, windows


@pytest.mark.parametrize("persist", [False, True])
def test_gen_only_sampling_follows_the_target(persist):
    """Chi-square of the joint of the first two tokens against the exact target joint.
    persist=True carries T_G across calls, so windows grow past one token."""
    cfg = {"name": "adasd_gen_only", "parts": {"rule": "sample_match"}, "persist": persist}
    counts, windows = joint_counts(cfg, 3000)
    assert counts.sum() == 3000
    assert chi2_pvalue(counts, target_joint(TableLM(V, 11))) > 1e-3
    assert max(windows) >= (2 if persist else 1)


def test_the_distribution_test_detects_the_js_relaxation():
    """Power check: AdaSD with T_V = 0.5 (d_JS of this pair is about 0.5-0.8) is lossy and must fail it."""
    counts, _ = joint_counts({"name": "adasd", "fixed_t_v": 0.5}, 1000)
    assert chi2_pvalue(counts, target_joint(TableLM(V, 11))) < 1e-6
