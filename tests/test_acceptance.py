"""Acceptance rules on hand-made p and q."""

import pytest
import torch

from specbench.decoding.acceptance import JSRelaxed, RULES, leading_true, make_rule
from specbench.common.registry import UnknownNameError


def onehot(i: int, v: int = 4) -> torch.Tensor:
    t = torch.zeros(v)
    t[i] = 1.0
    return t


def test_leading_true():
    assert leading_true(torch.tensor([True, True, False, True])) == 2
    assert leading_true(torch.tensor([False, True])) == 0
    assert leading_true(torch.tensor([True, True])) == 2
    assert leading_true(torch.zeros(0, dtype=torch.bool)) == 0


def test_greedy_accepts_until_first_argmax_mismatch():
    # target argmax per position: 1, 2, 3, 0 ; drafts 1, 2, 0 -> accept 2, next = argmax p_3 = 3
    p = torch.stack([onehot(1) * 0.7 + 0.1, onehot(2) * 0.7 + 0.1, onehot(3) * 0.7 + 0.1, onehot(0) * 0.7 + 0.1])
    x = torch.tensor([1, 2, 0])
    for name in ("greedy", "rejection", "sample_match"):  # at temperature 0 all reduce to greedy
        ok, fb = make_rule(name)(x, torch.zeros(3, 4), p, True, None)
        n = leading_true(ok)
        assert n == 2 and fb[n] == 3


def test_greedy_all_accepted_gives_bonus():
    p = torch.stack([onehot(1), onehot(2), onehot(3)]) * 0.9 + 0.025
    ok, fb = make_rule("greedy")(torch.tensor([1, 2]), torch.zeros(2, 4), p, True, None)
    assert leading_true(ok) == 2 and fb[2] == 3


def test_rejection_certain_cases():
    g = torch.Generator().manual_seed(0)
    rule = make_rule("rejection")
    # p(x) >= q(x): always accepted
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.3, 0.5, 0.1, 0.1]])
    for _ in range(50):
        ok, fb = rule(torch.tensor([1]), q, p, False, g)
        assert ok.tolist() == [True]
    # p(x) = 0: always rejected, and the correction comes from norm(max(p - q, 0)) = onehot(2)
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    for _ in range(50):
        ok, fb = rule(torch.tensor([0]), q, p, False, g)
        assert ok.tolist() == [False] and fb[0] == 2


def test_rejection_acceptance_probability_is_p_over_q():
    # p(x)/q(x) = 0.2/0.8 = 0.25
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    q = torch.tensor([[0.8, 0.2]])
    acc = sum(bool(make_rule("rejection")(torch.tensor([0]), q, p, False, g)[0][0]) for _ in range(4000))
    assert abs(acc / 4000 - 0.25) < 0.03


def test_sample_match_accepts_iff_target_draw_matches():
    g = torch.Generator().manual_seed(0)
    # p one-hot on 3 at position 1: a draft of 3 always matches, any other never
    p = torch.stack([onehot(3), onehot(1)])
    ok, fb = make_rule("sample_match")(torch.tensor([3]), torch.full((1, 4), 0.25), p, False, g)
    assert ok.tolist() == [True] and fb[1] == 1
    ok, fb = make_rule("sample_match")(torch.tensor([2]), torch.full((1, 4), 0.25), p, False, g)
    assert ok.tolist() == [False] and fb[0] == 3


def test_js_relaxed_accepts_close_mismatches_only():
    p = torch.stack([onehot(1), onehot(2), onehot(0)])
    x = torch.tensor([0, 3])  # both mismatch under greedy
    rule = make_rule("js_relaxed(sample_match)", threshold=0.5)
    assert isinstance(rule, JSRelaxed) and not rule.lossless
    ok, _ = rule(x, torch.zeros(2, 4), p, True, None, js=torch.tensor([0.4, 0.6]))
    assert ok.tolist() == [True, False]
    rule.threshold = 0.0
    ok, _ = rule(x, torch.zeros(2, 4), p, True, None, js=torch.tensor([0.4, 0.6]))
    assert ok.tolist() == [False, False]
    with pytest.raises(ValueError, match="JS"):
        rule(x, torch.zeros(2, 4), p, True, None)


def test_unknown_rule_lists_valid_names():
    with pytest.raises(UnknownNameError, match="rejection.*sample_match"):
        make_rule("nope")
    assert set(RULES.names()) == {"greedy", "rejection", "sample_match"}
