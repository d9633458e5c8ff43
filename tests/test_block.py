"""Rule `block` (Sun et al., block verification) against independent truth.

- The paper's own example (section 3): two context-free models on {a, b}, the target M_b = (1/3, 2/3), the draft
  M_s = (2/3, 1/3), γ = 2: token-wise rejection accepts 10/9 drafts per iteration in expectation, block
  verification 11/9.
- The output stream follows the target: bigram models on 4 tokens (context-dependent p and q), γ = 3, iterations
  repeated until each of M rows has 3 tokens; their joint counts against the exact p(t1) p(t2 | t1) p(t3 | t2)
  (chi-square), and a wrong variant (the residual without the block weight) fails the same check.
- Never fewer drafts than rejection in expectation: exact expectations over every draft block of random bigram
  pairs, E_rej = sum_j prod_{i<=j} min(1, r_i) and E_block = sum_j P(τ >= j) = sum_j (1 - prod_{i>=j} (1 - h_i)),
  computed here from the definitions in float64, and the rule's empirical mean against E_block.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specbench.decoding.acceptance import Greedy, make_rule
from specbench.methods.block import Block
from specbench.decoding.proposal import Proposal
from specbench.decoding.rule import Chains


def accepted_counts(rule, x: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n [N], fallback [N, γ+1]) of the rule on N chains x [N, γ] ~ q [N, γ, V] against p [N, γ+1, V]."""
    N, g = x.shape
    ok, fallback = rule.decide(Chains(x, [g] * N, given_q=q), p, [None] * N, None)
    return ok.to(torch.int64).cumprod(1).sum(1), fallback


def test_the_papers_example_accepts_11_9_against_10_9():
    torch.manual_seed(0)
    N = 200_000
    target, draft = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    x = torch.multinomial(draft, 2 * N, replacement=True).view(N, 2)
    q, p = draft.expand(N, 2, 2).clone(), target.expand(N, 3, 2).clone()
    mean = {name: accepted_counts(make_rule(name), x, q, p)[0].double().mean().item() for name in ("rejection", "block")}
    assert mean["rejection"] == pytest.approx(10 / 9, abs=0.01)
    assert mean["block"] == pytest.approx(11 / 9, abs=0.01)


def bigrams(seed: int, V: int, sharp: float = 1.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft bigram tables [V, V] (row: the previous token), random and far apart."""
    g = torch.Generator().manual_seed(seed)
    return (torch.softmax(sharp * torch.randn(V, V, generator=g, dtype=torch.float64), -1),
            torch.softmax(sharp * torch.randn(V, V, generator=g, dtype=torch.float64), -1))


class UnweightedResidual(Block):
    """A wrong block rule: the correction drawn from max(P - Q, 0), token-wise rejection's, not max(w P - Q, 0)."""

    def decide(self, c, p, generators, thresholds):
        ok, _ = super().decide(c, p, generators, thresholds)
        W, V = c.W, p.shape[-1]
        resid = (p[:, :W] - c.q(V, p.dtype)).clamp_min(0.0)
        resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, p[:, :W])
        return ok, torch.multinomial(torch.cat([resid, p[:, W:]], 1).flatten(0, 1), 1).view(p.shape[:2])


def stream_counts(rule, P: torch.Tensor, Q: torch.Tensor, start: int, gamma: int, K: int, M: int) -> np.ndarray:
    """Counts [V^K] of the first K tokens of M streams decoded by draft-verify iterations with `rule`."""
    V = P.shape[0]
    out = torch.full((M, K), -1, dtype=torch.long)
    have = torch.zeros(M, dtype=torch.long)
    last = torch.full((M,), start, dtype=torch.long)
    while (have < K).any():
        rows = (have < K).nonzero()[:, 0]
        prev, xs, qs, ps = last[rows], [], [], []
        for _ in range(gamma):  # x_i ~ Q(. | x_{i-1}); p and q at each position from the bigram tables
            qs.append(Q[prev])
            ps.append(P[prev])
            prev = torch.multinomial(Q[prev], 1)[:, 0]
            xs.append(prev)
        ps.append(P[prev])
        x = torch.stack(xs, 1)
        n, fallback = accepted_counts(rule, x, torch.stack(qs, 1).float(), torch.stack(ps, 1).float())
        block = torch.cat([x, torch.zeros_like(x[:, :1])], 1)
        block[torch.arange(len(rows)), n] = fallback[torch.arange(len(rows)), n]  # x_1..x_n, then the next token
        for k in range(gamma + 1):
            take = (k <= n) & (have[rows] < K)
            r = rows[take]
            out[r, have[r]] = block[take, k]
            have[r] += 1
        last[rows] = block[torch.arange(len(rows)), n]
    index = (out * V ** torch.arange(K - 1, -1, -1)).sum(1)
    return np.bincount(index.numpy(), minlength=V**K).astype(np.float64)


def stream_pvalue(rule, seed: int = 3, M: int = 60_000) -> float:
    torch.manual_seed(seed)
    V, K = 4, 3
    P, Q = bigrams(seed, V)
    counts = stream_counts(rule, P, Q, start=0, gamma=3, K=K, M=M)
    exact = np.array([float(P[0, a] * P[a, b] * P[b, c]) for a, b, c in itertools.product(range(V), repeat=K)])
    return chisquare(counts, exact / exact.sum() * M).pvalue


def test_the_stream_follows_the_target():
    assert stream_pvalue(make_rule("block")) > 1e-3


def test_a_wrong_block_rule_fails_the_stream_check():
    assert stream_pvalue(UnweightedResidual()) < 1e-6


def exact_expectations(P: np.ndarray, Q: np.ndarray, start: int, gamma: int) -> tuple[float, float]:
    """(E_rej, E_block): expected accepted drafts over every block x ~ Q, from the definitions (float64)."""
    V = P.shape[0]
    e_rej = e_blk = 0.0
    for x in itertools.product(range(V), repeat=gamma):
        ctx = (start, *x)  # ctx[i] precedes x_{i+1}
        qx = np.prod([Q[ctx[i], x[i]] for i in range(gamma)])
        r = [P[ctx[i], x[i]] / Q[ctx[i], x[i]] for i in range(gamma)]
        e_rej += qx * sum(np.prod([min(1.0, v) for v in r[: j + 1]]) for j in range(gamma))
        w = [1.0]
        for v in r:
            w.append(min(1.0, w[-1] * v))
        h = []
        for j in range(1, gamma + 1):
            if j == gamma:
                h.append(w[j])
                continue
            m = np.maximum(w[j] * P[ctx[j]] - Q[ctx[j]], 0).sum()
            h.append(m / (m + 1 - w[j]) if m + 1 - w[j] > 0 else 1.0)
        e_blk += qx * sum(1 - np.prod([1 - hh for hh in h[j - 1 :]]) for j in range(1, gamma + 1))
    return e_rej, e_blk


def test_block_accepts_at_least_as_much_as_rejection_in_expectation():
    gains = []
    for seed in range(12):
        P, Q = (t.numpy() for t in bigrams(100 + seed, 3, sharp=1.0 + 0.2 * seed))
        e_rej, e_blk = exact_expectations(P, Q, 0, 3)
        assert e_blk >= e_rej - 1e-12, seed
        gains.append(e_blk - e_rej)
    assert max(gains) > 0.01  # the comparison is not vacuous: block gains on some pairs


def test_the_rules_mean_is_the_exact_expectation():
    torch.manual_seed(5)
    P, Q = bigrams(7, 3)
    M, gamma = 200_000, 3
    prev, xs, qs, ps = torch.zeros(M, dtype=torch.long), [], [], []
    for _ in range(gamma):
        qs.append(Q[prev])
        ps.append(P[prev])
        prev = torch.multinomial(Q[prev], 1)[:, 0]
        xs.append(prev)
    ps.append(P[prev])
    x, q, p = torch.stack(xs, 1), torch.stack(qs, 1), torch.stack(ps, 1)
    e_rej, e_blk = exact_expectations(P.numpy(), Q.numpy(), 0, gamma)
    c = Chains(x, [gamma] * M, given_q=q)
    for name, exact in (("block", e_blk), ("rejection", e_rej)):
        rule = make_rule(name)
        assert accepted_counts(rule, x, q, p)[0].double().mean().item() == pytest.approx(exact, abs=0.01)
        assert rule.expected(c, p).mean().item() == pytest.approx(exact, abs=0.01)  # E[. | drafts] averaged


@pytest.mark.parametrize("name", ["greedy", "rejection", "sample_match", "block"])
def test_expected_acceptance_of_a_ragged_batch_is_each_rows_alone(name):
    """Rows of 0..4 drafts right-aligned (pads before them): each row's E[accepted | drafts] as if alone."""
    g = torch.Generator().manual_seed(0)
    lengths, V = [3, 0, 4, 1], 5
    W = max(lengths)
    rule = make_rule(name, greedy=name == "greedy")
    x = torch.full((len(lengths), W), -1)
    q = torch.zeros(len(lengths), W, V, dtype=torch.float64)
    p = torch.full((len(lengths), W + 1, V), float("nan"), dtype=torch.float64)
    alone = []
    for b, n in enumerate(lengths):
        qb = torch.softmax(torch.randn(n, V, generator=g, dtype=torch.float64), -1)
        pb = torch.softmax(torch.randn(n + 1, V, generator=g, dtype=torch.float64), -1)
        xb = torch.multinomial(qb, 1, generator=g)[:, 0] if n else torch.zeros(0, dtype=torch.long)
        x[b, W - n :], q[b, W - n :], p[b, W - n :] = xb, qb, pb
        alone.append(rule.expected(Chains(xb[None], [n], given_q=qb[None]), pb[None]).item())
    got = rule.expected(Chains(x, lengths, given_q=q), p)
    assert got.tolist() == pytest.approx(alone, abs=1e-12)
    assert got[1] == 0 and all(0 <= a <= n for a, n in zip(alone, lengths))


def test_greedy_decoding_builds_greedy_and_trees_are_refused():
    assert isinstance(make_rule("block", greedy=True), Greedy)
    tree = Proposal([1, 2], [-1, -1], torch.full((2, 4), 0.25))
    with pytest.raises(ValueError, match="rule 'block' verifies chains"):
        make_rule("block").accept([tree], torch.full((1, 3, 4), 0.25), [None])


def test_the_rules_benchmark_compares_on_the_same_drafts(capsys):
    from specbench.bench.cli import main

    assert main(["rules", "--prompts", "2", "--max-new-tokens", "16", "--rules", "rejection,block,sample_match"]) == 0
    out = capsys.readouterr().out
    lines = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert set(lines) >= {"rejection", "block", "sample_match"}
    assert "τ × 1.0000 [1.0000, 1.0000]" in lines["rejection"]  # the first rule against itself
    with pytest.raises(SystemExit, match="temperature must be > 0"):
        main(["rules", "--temperature", "0"])
