"""Acceptance rules on hand-made p and q."""

import pytest
import torch

from specbench.decoding.acceptance import JSRelaxed, RULES, Greedy, Rejection, leading_true, make_rule
from specbench.decoding.sampling import js_distance
from specbench.decoding.proposal import chain
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
        ok, fb = make_rule(name, greedy=True)(x, torch.zeros(3, 4), p, None)
        n = leading_true(ok)
        assert n == 2 and fb[n] == 3


def test_greedy_all_accepted_gives_bonus():
    p = torch.stack([onehot(1), onehot(2), onehot(3)]) * 0.9 + 0.025
    ok, fb = make_rule("greedy", greedy=True)(torch.tensor([1, 2]), torch.zeros(2, 4), p, None)
    assert leading_true(ok) == 2 and fb[2] == 3


def test_rejection_certain_cases():
    g = torch.Generator().manual_seed(0)
    rule = make_rule("rejection")
    # p(x) >= q(x): always accepted
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.3, 0.5, 0.1, 0.1]])
    for _ in range(50):
        ok, fb = rule(torch.tensor([1]), q, p, g)
        assert ok.tolist() == [True]
    # p(x) = 0: always rejected, and the correction comes from norm(max(p - q, 0)) = onehot(2)
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    for _ in range(50):
        ok, fb = rule(torch.tensor([0]), q, p, g)
        assert ok.tolist() == [False] and fb[0] == 2


def test_rejection_acceptance_probability_is_p_over_q():
    # p(x)/q(x) = 0.2/0.8 = 0.25
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    q = torch.tensor([[0.8, 0.2]])
    acc = sum(bool(make_rule("rejection")(torch.tensor([0]), q, p, g)[0][0]) for _ in range(4000))
    assert abs(acc / 4000 - 0.25) < 0.03


def test_sample_match_accepts_iff_target_draw_matches():
    g = torch.Generator().manual_seed(0)
    # p one-hot on 3 at position 1: a draft of 3 always matches, any other never
    p = torch.stack([onehot(3), onehot(1)])
    ok, fb = make_rule("sample_match")(torch.tensor([3]), torch.full((1, 4), 0.25), p, g)
    assert ok.tolist() == [True] and fb[1] == 1
    ok, fb = make_rule("sample_match")(torch.tensor([2]), torch.full((1, 4), 0.25), p, g)
    assert ok.tolist() == [False] and fb[0] == 3


def test_js_relaxed_accepts_close_mismatches_only():
    p = torch.stack([onehot(1), onehot(2), onehot(0)])
    x = torch.tensor([0, 3])  # both mismatch under greedy
    q = torch.tensor([[0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6]])  # d_JS(p_i, q_i) = 0.411, 0.629
    rule = make_rule("js_relaxed(sample_match)", greedy=True, threshold=0.5)
    assert isinstance(rule, JSRelaxed) and not rule.lossless
    ok, _ = rule(x, q, p, None)
    assert ok.tolist() == [True, False]
    torch.testing.assert_close(rule.js[0], js_distance(p[:2], q))  # the distances it decided on, kept for the records
    assert rule.js[0].tolist() == pytest.approx([0.4113, 0.6291], abs=1e-4)
    for threshold, want in ((0.0, [False, False]), (0.40, [False, False]), (0.42, [True, False]), (0.63, [True, True])):
        rule.threshold = threshold
        assert rule(x, q, p, None)[0].tolist() == want, threshold


def test_greedy_is_fixed_when_the_rule_is_built():
    """At temperature 0 every base rule is `greedy` (no random draw); sampled rules stay sampled."""
    assert isinstance(make_rule("rejection", greedy=True), Greedy)
    assert isinstance(make_rule("js_relaxed(rejection)", greedy=True).base, Greedy)
    assert isinstance(make_rule("js_relaxed(rejection)").base, Rejection)
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    make_rule("sample_match", greedy=True)(torch.tensor([1]), torch.full((1, 4), 0.25), torch.full((2, 4), 0.25), g)
    assert torch.equal(g.get_state(), state)


def test_unknown_rule_lists_valid_names():
    with pytest.raises(UnknownNameError, match="rejection.*sample_match"):
        make_rule("nope")
    assert set(RULES.names()) == {"greedy", "rejection", "sample_match", "block"}


def test_js_relaxed_counts_the_drafts_only_the_relaxation_accepted():
    """x_1 = 1 is p_1's argmax (exact); x_2 = 3 is not, and only d_JS(p_2, q_2) = 0.629 <= T_V lets it pass."""
    p = torch.stack([onehot(1), onehot(2), onehot(0)])
    q = torch.tensor([[0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6]])
    rule = make_rule("js_relaxed(sample_match)", greedy=True, threshold=0.63)
    ok, _ = rule(torch.tensor([1, 3]), q, p, None)
    assert ok.tolist() == [True, True] and rule.exact[0].tolist() == [True, False]

    def verdict(tokens, threshold):
        return rule.accept([chain(tokens, q)], p[None], [None], [threshold])[0]

    assert (verdict([1, 3], 0.63).accepted, verdict([1, 3], 0.63).relaxed) == (2, 1)
    assert (verdict([1, 3], 0.0).accepted, verdict([1, 3], 0.0).relaxed) == (1, 0)  # the mismatch is rejected
    v = verdict([0, 3], 0.5)  # x_1 only by the relaxation (0.411), x_2 rejected (0.629): the next token is argmax p_2
    assert (v.accepted, v.relaxed, v.token) == (1, 1, 2)


@pytest.mark.parametrize("name", ["greedy", "rejection", "sample_match"])
def test_exact_rules_relax_nothing(name):
    p = torch.stack([onehot(1), onehot(2), onehot(0)])
    rule = make_rule(name, greedy=name == "greedy")
    v = rule.accept([chain([0, 3], torch.full((2, 4), 0.25))], p[None], [torch.Generator().manual_seed(0)], [1.0])[0]
    assert v.relaxed == 0 and v.js is None


def test_greedy_on_the_host_matches_the_batched_decide():
    """Greedy.accept_top (the engine's path: the margins' argmax copy) gives every row the verdict of the batched
    decide (chains) and of the tree walk (a tree), on chains of 0..4 drafts right-aligned in one batch."""
    g = torch.Generator().manual_seed(0)
    V, W = 5, 4
    for _ in range(50):
        p = torch.rand((4, W + 1, V), generator=g).softmax(-1)  # [B, W+1, V]
        top = p.argmax(-1)
        props = []
        for b, n in enumerate(torch.randint(0, W + 1, (4,), generator=g).tolist()):
            x = top[b, W - n : W].clone()  # the target's choices, some then changed: each row's first mismatch varies
            x[torch.rand(n, generator=g) < 0.3] = torch.randint(0, V, (1,), generator=g)
            props.append(chain(x.tolist()))
        batched = Greedy().accept(props, p, [None] * 4)
        host = Greedy.accept_top(props, top.tolist())
        assert [(v.path, v.token) for v in host] == [(v.path, v.token) for v in batched]
    tree = chain([])
    tree.tokens, tree.parents = [3, 1, 4], [-1, -1, 1]  # the root's children 3 and 1, and 4 below 1
    p = torch.stack([onehot(1, V), onehot(2, V), onehot(4, V), onehot(0, V)])  # the root's argmax 1, then 1's 4
    assert Greedy.accept_top([tree], [p.argmax(-1).tolist()])[0].path == Greedy().walk(tree, p, None)[0] == [1, 2]
