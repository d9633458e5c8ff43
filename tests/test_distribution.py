"""Speculative sampling preserves the target distribution: chi-square tests against the exact target.

Rule level (CI): one vectorised call of a rule over M one-draft positions, x_i ~ q, emits x_i when
accepted and the rule's fallback otherwise; the emitted tokens must follow p exactly. Engine level:
a tiny target and an unrelated tiny draft (vocabulary 8) decode 3 new tokens from a fixed prompt
with vanilla gamma=2, so the first iteration drafts two tokens and the first two generated tokens
go through acceptance, correction and bonus. Their joint frequency is compared with the exact
target joint p(t1) p(t2 | t1) computed by plain forwards. In CI the models are table LMs
(tests/table_lm.py: microsecond forwards through a real DynamicCache); the same test on random
tiny Llamas runs with `-m slow` (about 3 minutes per rule on 2 CPU cores). CI runs one engine-level
chi-square test (tests/test_gammatune.py: gammatune from γ = 2 with `rejection`, whose first block is
this vanilla γ = 2 block) plus the rule-level tests here; the engine-level vanilla tests run with `-m slow`.
Temperature, top-k and top-p: the exact reference helpers.warped_probs (numpy, transformers' semantics written
out) is checked by hand, and the engine's Sampler against it on batched logits [B, positions, V]; every lossless
method's sampled tokens under these settings are checked in tests/test_method_contracts.py (d).
"""

import numpy as np
import pytest
import torch

from helpers import (TEST_DEVICE, N, PROMPT, V, AcceptAll, chi2_pvalue, next_probs, sample_pairs, target_joint,
                     warped_probs)
from specbench.decoding.sampling import Sampler, SamplingParams
from specbench.models.tiny import tiny_llama
from table_lm import TableLM

ARCH = dict(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=64, initializer_range=0.6)


@pytest.fixture(scope="module", params=["table", pytest.param("llama", marks=pytest.mark.slow)])
def models(request):
    if request.param == "table":
        return TableLM(V, 11), TableLM(V, 12)
    torch.set_num_threads(1)
    return tiny_llama(11, **ARCH).to(TEST_DEVICE), tiny_llama(12, **ARCH).to(TEST_DEVICE)


def test_draft_differs_from_target(models):
    """Precondition: q is far from p, so the test would catch a rule that leaks q."""
    p, q = next_probs(models[0], PROMPT), next_probs(models[1], PROMPT)
    assert 0.5 * (p - q).abs().sum() > 0.3


M = 200_000  # one-draft positions per rule-level test


def emitted_tokens(rule, p: torch.Tensor, q: torch.Tensor, m: int = M, seed: int = 7) -> torch.Tensor:
    """Tokens [m] of m independent one-draft blocks in one rule call: x_i ~ q, then x_i if accepted, else the
    rule's fallback (correction) at i; p, q [V] are the target and draft distributions at every position."""
    g = torch.Generator().manual_seed(seed)
    x = torch.multinomial(q, m, replacement=True, generator=g)  # [m]
    ok, fallback = rule(x, q.expand(m, -1), p.expand(m + 1, -1), g)  # [m], [m+1]
    return torch.where(ok, x, fallback[:m])


@pytest.mark.parametrize("name", ["rejection", "sample_match"])
def test_a_rules_emitted_tokens_follow_the_target(models, name):
    from scipy.stats import chisquare

    from specbench.decoding.acceptance import make_rule

    p, q = next_probs(models[0], PROMPT).float().cpu(), next_probs(models[1], PROMPT).float().cpu()  # rule level: CPU
    counts = torch.bincount(emitted_tokens(make_rule(name), p, q), minlength=V).double()
    assert chisquare(counts.numpy(), (p.double() / p.double().sum() * M).numpy()).pvalue > 1e-3


def test_a_rule_that_leaks_the_draft_is_detected_at_rule_level(models):
    from scipy.stats import chisquare

    p, q = next_probs(models[0], PROMPT).float().cpu(), next_probs(models[1], PROMPT).float().cpu()
    counts = torch.bincount(emitted_tokens(AcceptAll(), p, q), minlength=V).double()
    assert chisquare(counts.numpy(), (p.double() / p.double().sum() * M).numpy()).pvalue < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["rejection", "sample_match"])
def test_vanilla_sampling_follows_the_target(models, rule):
    from specbench.decoding.acceptance import make_rule

    counts = sample_pairs(models, make_rule(rule), N)
    assert counts.sum() == N
    assert chi2_pvalue(counts, target_joint(models[0])) > 1e-3


def test_a_wrong_rule_is_detected(models):
    counts = sample_pairs(models, AcceptAll(), 4000)
    assert chi2_pvalue(counts, target_joint(models[0])) < 1e-6


# --- temperature, top-k, top-p: the exact reference and the engine's Sampler ---


def test_the_exact_truncated_distribution_is_the_hand_worked_one():
    """warped_probs on p = [0.5, 0.3, 0.15, 0.05]: C_j is the mass of the j most likely tokens."""
    logits = np.log([0.5, 0.3, 0.15, 0.05])

    def close(*p):
        return pytest.approx(np.array(p), abs=1e-12)

    assert warped_probs(logits, 1.0, top_p=0.75) == close(0.625, 0.375, 0, 0)  # C_1 = 0.5 < 0.75 <= C_2 = 0.8
    assert warped_probs(logits, 1.0, top_p=0.9) == close(0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0)  # C_3 = 0.95
    assert warped_probs(logits, 1.0, top_p=0.4) == close(1, 0, 0, 0)  # the most likely token alone: C_1 >= 0.4
    assert warped_probs(logits, 1.0, top_k=2) == close(0.625, 0.375, 0, 0)
    # top-p acts on the distribution renormalised after top-k: top_p 0.83 keeps 3 tokens alone (C_2 = 0.8),
    # 2 after top_k = 3 (C_2 = 0.8 / 0.95 = 0.842)
    assert warped_probs(logits, 1.0, top_p=0.83) == close(0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0)
    assert warped_probs(logits, 1.0, top_k=3, top_p=0.83) == close(0.625, 0.375, 0, 0)
    # temperature first: at T = 0.5, p ~ p^2 = [0.25, 0.09, 0.0225, 0.0025] / 0.365, C_2 = 0.932 >= 0.9
    assert warped_probs(logits, 0.5, top_p=0.9) == close(0.25 / 0.34, 0.09 / 0.34, 0, 0)
    # a tie with the k-th logit stays (TopKLogitsWarper drops only scores below the k-th), but a margin refuses
    # it: float rounding in the engine's forward could split the tie
    ties = np.array([2.0, 1.0, 1.0, 0.0])
    e = np.exp(ties[:3] - 2.0)
    assert warped_probs(ties, 1.0, top_k=2, margin=0.0) == close(*(e / e.sum()), 0)
    with pytest.raises(ValueError, match="top-k cut"):
        warped_probs(ties, 1.0, top_k=2)
    with pytest.raises(ValueError, match="equal probability"):  # which 0.3 TopPLogitsWarper keeps is up to torch.sort
        warped_probs(np.log([0.4, 0.3, 0.3]), 1.0, top_p=0.6, margin=0.0)
    with pytest.raises(ValueError, match="within"):  # C_2 = 0.8 = top_p: float rounding decides the cut
        warped_probs(logits, 1.0, top_p=0.8)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, 0.7), (0.5, 5, None), (0.7, 6, 0.6), (1.3, 3, 0.9),
                                                     (0.8, None, 0.3)])
def test_the_sampler_gives_the_exact_truncated_distribution_on_batched_logits(temperature, top_k, top_p):
    """Sampler.probs on a verify forward's logits [B, positions, V_model] (top-p once crashed on them) and on draft
    logits [B, V_model]: every row is warped_probs of its first V (the tokenizer's range) logits."""
    logits = 2.0 * torch.randn((4, 3, 14), generator=torch.Generator().manual_seed(0))  # V_model = 14, V = 12
    sampler = Sampler(SamplingParams(temperature, top_k, top_p), 12)
    want = np.array([[warped_probs(row[:12], temperature, top_k, top_p) for row in rows]
                     for rows in logits.double().numpy()])  # [B, positions, V]
    got = sampler.probs(logits)
    assert got.shape == (4, 3, 12)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-6)
    np.testing.assert_allclose(sampler.probs(logits[:, 0]).numpy(), want[:, 0], atol=1e-6)
