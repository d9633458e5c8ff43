"""The batched acceptance step against a per-row reference and against each row decoded alone.

The reference below decides one row at a time as the rules are defined (torch.multinomial for every categorical
draw, a uniform per draft), written independently of specbench.decoding.acceptance. The batched rules, run once
over a ragged batch whose pad columns hold NaN (so reading one would show), must give every row the same path,
next token, relaxed count and distances, and leave each row's generator in the same state. Then the engine: under
sampling, every row of a B = 5 batch with its own seeded generator gets the tokens it gets alone (a table LM, whose
batched distributions equal its single-row ones exactly).
"""

from __future__ import annotations

import pytest
import torch

from helpers import TEST_DEVICE, V, FixedGamma, table_engine
from specbench.decoding.acceptance import make_rule
from specbench.decoding.proposal import TOP_K, Proposal, chain
from specbench.decoding.sampling import js_distance
from table_lm import TableLM

NAMES = ["greedy", "rejection", "sample_match", "block", "js_relaxed(rejection)", "js_relaxed(sample_match)"]


def reference(name: str, x: torch.Tensor, q: torch.Tensor, p: torch.Tensor, g: torch.Generator, t: float
              ) -> tuple[int, int, int, torch.Tensor | None]:
    """(accepted, next token, relaxed, d_JS) of one chain x [w] ~ q [w, V] against p [w+1, V], per its definition."""
    w = len(x)
    base = name.removeprefix("js_relaxed(").rstrip(")")
    dev = p.device
    if base == "greedy":
        top = p.argmax(-1)
        exact, fallback = x == top[:w], top
    elif base == "rejection":
        u = torch.rand(w, generator=g, device=dev)
        exact = torch.tensor([bool(u[i] < p[i, x[i]] / q[i, x[i]]) for i in range(w)], dtype=torch.bool, device=dev)
        dists = [(p[i] - q[i]).clamp_min(0) if (p[i] - q[i]).clamp_min(0).sum() > 0 else p[i] for i in range(w)]
        fallback = torch.multinomial(torch.stack(dists + [p[w]]), 1, generator=g)[:, 0]
    elif base == "block":  # Sun et al.'s Algorithm 2, one position at a time
        u = torch.rand(w, generator=g, device=dev)
        weight = [1.0]
        for i in range(w):
            weight.append(min(1.0, weight[-1] * float(p[i, x[i]] / q[i, x[i]])))
        resid = [(weight[i] * p[i] - q[i]).clamp_min(0) for i in range(w)]  # R_i: max(w_i P_i - Q_i, 0)
        h = []
        for j in range(1, w + 1):
            m = float(resid[j].sum()) if j < w else 0.0
            h.append(weight[w] if j == w else (m / (m + 1 - weight[j]) if m + 1 - weight[j] > 0 else 1.0))
        tau = max([j for j in range(1, w + 1) if float(u[j - 1]) < h[j - 1]], default=0)
        exact = torch.tensor([i < tau for i in range(w)], dtype=torch.bool, device=dev)
        dists = [r if r.sum() > 0 else p[i] for i, r in enumerate(resid)]
        fallback = torch.multinomial(torch.stack(dists + [p[w]]), 1, generator=g)[:, 0]
    else:
        y = torch.multinomial(p, 1, generator=g)[:, 0]
        exact, fallback = x == y[:w], y
    js = js_distance(p[:w], q) if name.startswith("js_relaxed") else None
    ok = exact | (js <= t) if js is not None else exact
    n = next((i for i in range(w) if not ok[i]), w)
    return n, int(fallback[n]), int((~exact[:n]).sum()), js


def ragged_batch(seed: int) -> tuple[list[Proposal], torch.Tensor, list[float]]:
    """Six chains of 0..5 drafts (q drawn, one-hot or top-k chosen), p [6, W+1, V] right-aligned, NaN elsewhere, on
    the test device (the CUDA lane: every draw made there)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [0, 1, 3, 5, 5, 2]
    W = max(lengths)
    p = torch.full((len(lengths), W + 1, V), float("nan"))
    props = []
    for b, n in enumerate(lengths):
        p[b, W - n :] = torch.softmax(2 * torch.randn(n + 1, V, generator=gen), -1)
        q = torch.softmax(2 * torch.randn(n, V, generator=gen), -1)
        x = torch.multinomial(q, 1, generator=gen)[:, 0].tolist() if n else []
        q = q.to(TEST_DEVICE)
        if b == 2:  # a deterministic proposal: q one-hot
            props.append(chain(x))
        elif b == 3:  # children chosen, not drawn: the rule must see one-hot q
            props.append(Proposal(x, list(range(-1, n - 1)), q, siblings=TOP_K))
        else:
            props.append(chain(x, q))
    return props, p.to(TEST_DEVICE), [0.1 * b for b in range(len(lengths))]


@pytest.mark.parametrize("name", NAMES)
def test_batched_verdicts_equal_the_per_row_reference(name):
    decided = 0
    for seed in range(40):
        props, p, thresholds = ragged_batch(seed)
        rule = make_rule(name, greedy=name == "greedy")
        gens = [torch.Generator(TEST_DEVICE).manual_seed(1000 * seed + b) for b in range(len(props))]
        verdicts = rule.accept(props, p, gens, thresholds)
        W = p.shape[1] - 1
        for b, (prop, v) in enumerate(zip(props, verdicts)):
            n = len(prop)
            g = torch.Generator(TEST_DEVICE).manual_seed(1000 * seed + b)
            x = torch.tensor(prop.tokens, dtype=torch.long, device=TEST_DEVICE)
            want = reference(name, x, prop.verify_q(V, TEST_DEVICE), p[b, W - n :], g, thresholds[b])
            assert (v.accepted, v.token, v.relaxed) == want[:3], (name, seed, b)
            assert v.path == list(range(v.accepted))
            if want[3] is not None:
                torch.testing.assert_close(v.js, want[3])
            assert torch.equal(gens[b].get_state(), g.get_state()), (name, seed, b)  # the same draws were made
            decided += n > v.accepted
    assert decided > 20  # rejections happened, so the corrections were compared too


def test_rows_without_generators_are_drawn_at_once():
    """No row has a generator: one draw for the batch; every token is still a valid outcome of its row."""
    props, p, thresholds = ragged_batch(0)
    W = p.shape[1] - 1
    for name in NAMES[1:]:
        for v, prop, b in zip(make_rule(name).accept(props, p, [None] * len(props), thresholds), props, range(6)):
            assert 0 <= v.accepted <= len(prop) and 0 <= v.token < V
            assert p[b, W - len(prop) + v.accepted, v.token] > 0 or name.startswith("js")


@pytest.mark.parametrize("rule", ["rejection", "sample_match", "block"])
def test_seeded_rows_get_their_own_tokens_in_a_batch(rule):
    """Sampling at T = 1: each of five rows (prompts of different lengths, so ragged drafts and finishes) decoded
    in one batch, each with its own seeded generator, gives the tokens it gives alone with the same seed."""
    engine = table_engine(FixedGamma(make_rule(rule)), TableLM(V, 11), TableLM(V, 12), 1.0, 64)
    prompts = [[1, 5, 2], [3], [4, 4, 6, 1, 7, 0, 2], [2, 6], [0]]
    for trial in range(5):
        seeds = [100 * trial + b for b in range(len(prompts))]
        alone = [engine.generate(p, 12, torch.Generator().manual_seed(s)).token_ids for p, s in zip(prompts, seeds)]
        batch = engine.generate_batch(prompts, 12, [torch.Generator().manual_seed(s) for s in seeds])
        assert [g.token_ids for g in batch] == alone, (rule, trial)
        assert len(set(map(tuple, alone))) > 1
