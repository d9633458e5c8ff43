"""Tree acceptance (specbench.decoding.trees) keeps the target distribution: chi-square tests against the exact joint.

The target and the draft are Markov chains over V tokens (the next-token distribution depends on the last token
alone), each row processed at T = 1 with top-k or top-p (helpers.warped_probs). A trial drafts a depth-2 tree from
the root token START: 2..3 children of the root, 1..2 children of each, chosen per the siblings mode (independent
draws from q, draws from q without replacement, or the deterministic top-k of q), runs the rule, and records the
first two emitted tokens (path tokens, then the next token; a second token missing is drawn from the target, as
the next iteration would). Their frequencies must follow the exact joint p(a | START) p(b | a); wrong rules
(the independent-draw rule on children chosen without replacement, the full q on top-k children, a residual never
updated) must fail the same test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import chi2_pvalue_groups, warped_probs
from specbench.decoding.acceptance import JSRelaxed, Rejection, SampleMatch, leading_true
from specbench.methods.block import Block
from specbench.decoding.proposal import SAMPLED, TOP_K, WITHOUT_REPLACEMENT, Proposal, chain
from specbench.decoding.trees import greedy_path, multi_step_path, recursive_rejection_path

V, START, N = 7, 0, 20_000
SETTINGS = {"top_k": (4, None), "top_p": (None, 0.85)}  # (top_k, top_p) at T = 1


def markov(seed: int, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Rows [V, V]: the processed next-token distribution after each token, from random logits."""
    logits = 1.5 * np.random.default_rng(seed).standard_normal((V, V))
    return torch.tensor(np.stack([warped_probs(row, 1.0, top_k, top_p) for row in logits]))


def models(setting: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, Q) [V, V]: target and draft, both processed with the setting's top-k / top-p."""
    return markov(1, *SETTINGS[setting]), markov(5, *SETTINGS[setting])


def draft_trees(mode: str, Q: torch.Tensor, n: int, g: torch.Generator) -> list[Proposal]:
    """n depth-2 trees from START: 2..3 root children, 1..2 below each, chosen from Q per the siblings mode."""
    def choose(rows: torch.Tensor, k: int) -> torch.Tensor:  # [m, V] -> [m, k]; the first j of k are a choice of j
        if mode == TOP_K:
            return rows.topk(k, -1).indices
        return torch.multinomial(rows, k, replacement=mode == SAMPLED, generator=g)

    top = choose(Q[START].expand(n, V), 3)  # [n, 3]
    below = choose(Q[top.reshape(-1)], 2).reshape(n, 3, 2)  # [n, 3, 2]
    shape = torch.randint(0, 2, (n, 4), generator=g)  # root: 2 + shape[:, 0] children; child i: 1 + shape[:, 1 + i]
    out = []
    for t, b, s in zip(top.tolist(), below.tolist(), shape.tolist()):
        k = 2 + s[0]
        tokens, parents = t[:k], [-1] * k
        for i in range(k):
            tokens += b[i][: 1 + s[1 + i]]
            parents += [i] * (1 + s[1 + i])
        q = Q[[START if a < 0 else tokens[a] for a in parents]]  # node j was drawn from q at its parent
        out.append(Proposal(tokens, parents, q, siblings=mode))
    return out


def pair_counts(rule, mode: str, setting: str, n: int = N, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(counts [V, V] of the first two emitted tokens over n trees, the exact joint [V, V])."""
    P, Q = models(setting)
    g = torch.Generator().manual_seed(seed)
    counts = np.zeros((V, V))
    for prop in draft_trees(mode, Q, n, g):
        path, token = rule(prop, P[[START] + prop.tokens], g)
        out = [prop.tokens[j] for j in path] + [token]
        if len(out) < 2:  # the next iteration draws the second token from the target
            out.append(int(torch.multinomial(P[out[0]], 1, generator=g).item()))
        counts[out[0], out[1]] += 1
    return counts, (P[START][:, None] * P).numpy()


def pvalue(counts: np.ndarray, joint: np.ndarray) -> float:
    """Chi-square p-value of counts [V, V] against the joint [V, V] (rare cells binned; a count where the joint is 0
    gives 0)."""
    return chi2_pvalue_groups(counts[None], joint[None])


def rejection(prop, p, g):
    return Rejection().walk(prop, p, g)


def sample_match(prop, p, g):
    return SampleMatch().walk(prop, p, g)


# --- greedy ---


def test_greedy_descends_while_a_child_is_the_argmax():
    # root -> 0 (5) -> 1 (6) -> 2 (7), top at root 5, node 0: 6, node 1: 3 (mismatch: stop there)
    assert greedy_path(chain([5, 6, 7]), [5, 6, 3, 1]) == ([0, 1], 3)
    assert greedy_path(chain([5, 6]), [5, 6, 2]) == ([0, 1], 2)  # all accepted: the bonus argmax at the leaf
    tree = Proposal([4, 5, 1, 2, 3], [-1, -1, 0, 1, 1])  # root: 0 (4), 1 (5); node 1: 3 (2), 4 (3)
    assert greedy_path(tree, [5, 0, 3, 0, 0, 6]) == ([1, 4], 6)  # the second child, then its second child
    assert greedy_path(tree, [4, 1, 0, 0, 0, 0]) == ([0, 2], 0)
    assert greedy_path(tree, [9, 0, 0, 0, 0, 0]) == ([], 9)  # no child matches: empty path, top at the root
    assert greedy_path(Proposal([3, 3], [-1, -1]), [3, 1, 2]) == ([0], 1)  # equal siblings: the first


@pytest.mark.parametrize("rule", [Block(), JSRelaxed(Rejection())], ids=["block", "js_relaxed"])
def test_a_chains_only_rule_refuses_a_tree_naming_the_rules_that_walk_trees(rule):
    tree = Proposal([1, 2], [-1, -1], torch.full((2, V), 1.0 / V))
    with pytest.raises(ValueError, match=r"verifies chains only: .*trees need one of greedy, rejection, sample_match"):
        rule.accept([tree], torch.full((1, 3, V), 1.0 / V), [None])


def test_recursive_rejection_names_the_valid_siblings():
    with pytest.raises(ValueError, match="siblings"):
        recursive_rejection_path(Proposal([1, 2], [-1, -1], torch.full((2, V), 1.0 / V), siblings="odd"),
                                 torch.full((3, V), 1.0 / V))


# --- the exact joint of the first two tokens ---


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("mode", [SAMPLED, WITHOUT_REPLACEMENT, TOP_K])
@pytest.mark.parametrize("rule", [rejection, sample_match], ids=["rejection", "sample_match"])
def test_tree_acceptance_follows_the_target(rule, mode, setting):
    counts, joint = pair_counts(rule, mode, setting)
    assert pvalue(counts, joint) > 1e-3


def test_the_draft_differs_from_the_target():
    """Precondition: q is far from p at every token, and q keeps 3 tokens (3 children without replacement)."""
    for setting in SETTINGS:
        P, Q = models(setting)
        assert (0.5 * (P - Q).abs().sum(-1)).min() > 0.3
        assert (Q > 0).sum(-1).min() >= 3


def stale_residual_path(prop: Proposal, p: torch.Tensor, g: torch.Generator) -> tuple[list[int], int]:
    """Wrong: multi-step sampling that keeps r = p at the node after a rejection (no residual update)."""
    kids, path, node = prop.children(), [], -1
    while True:
        r = p[node + 1]
        for c in kids[node + 1]:
            x = prop.tokens[c]
            if (torch.rand(1, generator=g) * prop.q[c, x] < r[x]).item():
                path.append(c)
                node = c
                break
        else:
            return path, int(torch.multinomial(r, 1, generator=g).item())


WRONG = {"independent rule on without-replacement children": (multi_step_path, WITHOUT_REPLACEMENT),
         "full q on top-k children": (multi_step_path, TOP_K),
         "residual never updated": (stale_residual_path, SAMPLED)}


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("wrong", WRONG)
def test_a_wrong_tree_rule_is_detected(wrong, setting):
    rule, mode = WRONG[wrong]
    counts, joint = pair_counts(rule, mode, setting, n=N // 4)  # a quarter of the draws already finds them
    assert pvalue(counts, joint) < 1e-6


# --- a chain is the special case: the chain rule's acceptances exactly ---


def test_multi_step_on_a_chain_accepts_as_the_chain_rule():
    """Under the same generator state multi_step_path accepts exactly the drafts acceptance.Rejection accepts
    (both draw u_1, u_2, ... in order and accept x_i iff u_i q_i(x_i) < p_i(x_i))."""
    g = torch.Generator().manual_seed(3)
    seen = set()
    for _ in range(400):
        w = int(torch.randint(1, 5, (1,), generator=g))
        p = torch.softmax(2 * torch.randn(w + 1, V, generator=g), -1)
        q = torch.softmax(2 * torch.randn(w, V, generator=g), -1)
        x = torch.multinomial(q, 1, generator=g).squeeze(-1)  # [w]
        state = g.get_state()
        n = leading_true(Rejection()(x, q, p, g)[0])
        g.set_state(state)
        path, _ = multi_step_path(chain(x.tolist(), q), p, g)
        assert path == list(range(n))
        seen.add(n == w)
    assert seen == {True, False}  # both full acceptance and a rejection happened


def test_recursive_rejection_accepts_a_deterministic_child_with_its_target_probability():
    """One-hot q (q None): the first child x is accepted w.p. r(x) = p(x), the second (given a rejection) w.p.
    p(y) / (1 - p(x)); the emitted token is then x, y or a draw from p without x and y."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [1.0, 0, 0, 0], [1.0, 0, 0, 0]])
    g = torch.Generator().manual_seed(0)
    runs = [recursive_rejection_path(Proposal([1, 2], [-1, -1]), p, g) for _ in range(4000)]
    accepted = np.bincount([path[0] + 1 if path else 0 for path, _ in runs], minlength=3) / 4000  # 0: none
    np.testing.assert_allclose(accepted, [0.5, 0.3, 0.2], atol=0.03)
    assert {token for path, token in runs if not path} == {0}


def test_children_past_the_drafts_support_count_as_a_fixed_choice():
    """Without replacement, k = 3 children from a q of support 2: the third is padded in (q_3 = e_x), and the
    emitted token still follows p."""
    from scipy.stats import chisquare

    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [1.0, 0, 0, 0], [1.0, 0, 0, 0], [1.0, 0, 0, 0]], dtype=torch.float64)
    q = torch.tensor([0.6, 0.4, 0.0, 0.0], dtype=torch.float64).expand(3, 4)
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(4)
    for _ in range(10_000):
        tokens = torch.multinomial(q[0], 2, generator=g).tolist() + [2]  # q's support, then the pad
        prop = Proposal(tokens, [-1, -1, -1], q, siblings=WITHOUT_REPLACEMENT)
        path, token = recursive_rejection_path(prop, p, g)
        counts[tokens[path[0]] if path else token] += 1
    assert chisquare(counts, p[0].numpy() * counts.sum()).pvalue > 1e-3
