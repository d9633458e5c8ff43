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
"""

import pytest
import torch

from helpers import TEST_DEVICE, N, PROMPT, V, AcceptAll, chi2_pvalue, next_probs, sample_pairs, target_joint
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

    p, q = next_probs(models[0], PROMPT).float(), next_probs(models[1], PROMPT).float()
    counts = torch.bincount(emitted_tokens(make_rule(name), p, q), minlength=V).double()
    assert chisquare(counts.numpy(), (p.double() * M).numpy()).pvalue > 1e-3


def test_a_rule_that_leaks_the_draft_is_detected_at_rule_level(models):
    from scipy.stats import chisquare

    p, q = next_probs(models[0], PROMPT).float(), next_probs(models[1], PROMPT).float()
    counts = torch.bincount(emitted_tokens(AcceptAll(), p, q), minlength=V).double()
    assert chisquare(counts.numpy(), (p.double() * M).numpy()).pvalue < 1e-6


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
