"""Speculative sampling preserves the target distribution: chi-square over 20,000 decodes.

A tiny target and an unrelated tiny draft (vocabulary 8) decode 3 new tokens from a fixed prompt
with vanilla gamma=2, so the first iteration drafts two tokens and the first two generated tokens
go through acceptance, correction and bonus. Their joint frequency is compared with the exact
target joint p(t1) p(t2 | t1) computed by plain forwards. In CI the models are table LMs
(tests/table_lm.py: microsecond forwards through a real DynamicCache); the same test on random
tiny Llamas runs with `-m slow` (about 3 minutes per rule on 2 CPU cores).
"""

import pytest
import torch

from helpers import N, PROMPT, V, chi2_pvalue, next_probs, sample_pairs, target_joint
from specbench.decoding.acceptance import Rule
from specbench.models.tiny import tiny_llama
from table_lm import TableLM

ARCH = dict(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=64, initializer_range=0.6)


@pytest.fixture(scope="module", params=["table", pytest.param("llama", marks=pytest.mark.slow)])
def models(request):
    if request.param == "table":
        return TableLM(V, 11), TableLM(V, 12)
    torch.set_num_threads(1)
    return tiny_llama(11, **ARCH), tiny_llama(12, **ARCH)


class AcceptAll(Rule):
    """A wrong rule (always accept the drafts): the test must reject it."""

    def __call__(self, x, q, p, generator):
        return torch.ones_like(x, dtype=torch.bool), p.argmax(-1)


def test_draft_differs_from_target(models):
    """Precondition: q is far from p, so the test would catch a rule that leaks q."""
    p, q = next_probs(models[0], PROMPT), next_probs(models[1], PROMPT)
    assert 0.5 * (p - q).abs().sum() > 0.3


@pytest.mark.parametrize("rule", ["rejection", "sample_match"])
def test_vanilla_sampling_follows_the_target(models, rule):
    from specbench.decoding.acceptance import make_rule

    counts = sample_pairs(models, make_rule(rule), N)
    assert counts.sum() == N
    assert chi2_pvalue(counts, target_joint(models[0])) > 1e-3


def test_a_wrong_rule_is_detected(models):
    counts = sample_pairs(models, AcceptAll(), 4000)
    assert chi2_pvalue(counts, target_joint(models[0])) < 1e-6
