"""Draft sources beyond a same-tokenizer draft model, against transformers' own implementations and exact truth.

- `pld` equals transformers' generate(prompt_lookup_num_tokens=..., max_matching_ngram_size=...) (through
  hf_assisted) token for token and candidates for candidates; its lookup equals PromptLookupCandidateGenerator's
  on random sequences; at temperature 1 its tokens follow the exact target joint (chi-square).
- `layer_skip` equals generate(assistant_early_exit=...) token for token, candidates, matches and calls; its
  early-exit view computes exactly the target's first layers (tiny_random's draft is built that way); at
  temperature 1 its tokens follow the exact target joint.
- `uag` on tiny_cross (a draft of another vocabulary, with and without merges) equals `ar` and transformers'
  universal assisted generation token for token; its candidates differ (another alignment), which is documented.
- A cross-tokenizer pair runs only uag / hf_assisted / target-only methods, refused early with the key named.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from helpers import (SAME_VOCAB, V, AcceptAll, bound_engine, chi2_pvalue, compose_cfg, joint_counts, pair_engine, small,
                     target_joint)
from specbench.bench import smoke_prompts
from specbench.common.options import OptionError
from specbench.decoding.acceptance import make_rule
from specbench.methods.pld import lookup
from specbench.methods.uag import new_text, to_target
from specbench.models.early_exit import early_exit
from specbench.models.pairs import load_pair
from specbench.models.tiny import tiny_llama
from specbench.runs import runner
from table_lm import TableLM

MAX_NEW = 40


def pair_of(*overrides: str):
    return load_pair(OmegaConf.to_container(compose_cfg(*overrides).pair, resolve=True), torch.device("cpu"))


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return pair_of(*SAME_VOCAB)


@pytest.fixture(scope="module")
def prompts(pair):
    """8 smoke prompts, each followed by a repeat of its own start, so that lookups find matches."""
    return [p + p[: len(p) // 2] for p in smoke_prompts(pair, 8)]


def decode(pair, spec: dict, prompts: list[list[int]], max_new: int = MAX_NEW) -> list:
    engine = pair_engine(pair, spec, eos_ids=pair.eos_ids([pair.target]))
    return [engine.generate(p, max_new) for p in prompts]


def its(gen) -> list[tuple[int, int]]:
    return [(r.drafted, r.accepted) for r in gen.records]


# --- prompt lookup ---


def hf_lookup(ids: list[int], n: int, k: int, eos: list[int]) -> list[int]:
    """transformers' PromptLookupCandidateGenerator's candidates after ids (no length cap)."""
    gen = PromptLookupCandidateGenerator(eos_token_id=torch.tensor(eos), num_output_tokens=k,
                                         max_matching_ngram_size=n, max_length=10**6)
    out, _ = gen.get_candidates(torch.tensor([ids]))
    return out[0, len(ids):].tolist()


def test_lookup_equals_transformers_prompt_lookup_on_random_sequences():
    g = np.random.default_rng(0)
    found = 0
    for trial in range(600):
        ids = g.integers(0, 5, size=int(g.integers(1, 30))).tolist()  # a small alphabet: many repeats
        n, k = int(g.integers(1, 4)), int(g.integers(1, 12))
        want = hf_lookup(ids, n, k, [4])
        assert lookup(ids, n, k, frozenset({4})) == want, (ids, n, k)
        found += bool(want)
    assert found > 200  # most trials proposed something


@pytest.mark.parametrize("max_ngram", [2, 3])
def test_pld_equals_transformers_prompt_lookup(pair, prompts, max_ngram):
    native = decode(pair, {"name": "pld", "gamma": 10, "max_ngram": max_ngram}, prompts)
    hf = decode(pair, {"name": "hf_assisted", "prompt_lookup_num_tokens": 10, "max_matching_ngram_size": max_ngram},
                prompts)
    ar = decode(pair, {"name": "ar"}, prompts)
    for i, (a, b, t) in enumerate(zip(native, hf, ar)):
        assert a.token_ids == b.token_ids == t.token_ids, f"prompt {i}: tokens differ"
        assert len(a.records) == len(b.records) and a.target_calls == b.target_calls == len(b.records)
        committed = 0
        for k, (ra, rb) in enumerate(zip(a.records, b.records)):
            # transformers does not cap lookup candidates at the tokens left (it crops after the verify)
            assert ra.drafted == min(rb.drafted, MAX_NEW - committed - 1), f"prompt {i} iteration {k}"
            assert ra.accepted == min(rb.accepted, ra.drafted), f"prompt {i} iteration {k}"
            committed += ra.accepted + 1
        assert a.draft_calls == b.draft_calls == 0
    assert sum(r.accepted for g in native for r in g.records) > 0 and any(
        r.accepted < r.drafted for g in native for r in g.records)


def test_pld_proposes_nothing_without_a_match(pair):
    gen = decode(pair, {"name": "pld"}, [[7]], max_new=1)[0]  # one token: no n-gram with an earlier occurrence
    assert [(r.drafted, r.stop) for r in gen.records] == [(0, "length")]
    engine = pair_engine(pair, {"name": "pld", "max_ngram": 2})
    assert lookup([3, 1, 2], 2, 10, frozenset()) == [] and engine.method.drafter.max_ngram == 2


def test_pld_cuts_its_proposal_before_an_eos():
    assert lookup([5, 6, 9, 7, 1, 5, 6], 2, 10, frozenset({7})) == [9]
    assert lookup([5, 6, 7, 1, 5, 6], 2, 10, frozenset({7})) == []  # the cut leaves nothing: no drafts


def test_pld_bad_options_name_the_key():
    with pytest.raises(OptionError, match="method.max_ngram"):
        runner.build_method({"name": "pld", "max_ngram": 0})
    with pytest.raises(OptionError, match="method.gamma"):
        runner.build_method({"name": "pld", "gamma": 0})


# --- layer skip ---


def test_early_exit_view_is_the_targets_first_layers(pair):
    """tiny_random's draft is its target's first 2 layers, final norm and head: the view computes the same."""
    view = early_exit(pair.target, 2)
    x = torch.tensor([smoke_prompts(pair, 1)[0]])
    with torch.no_grad():
        a, b = view(x).logits[..., : pair.vocab_size], pair.draft(x).logits[..., : pair.vocab_size]
    assert torch.equal(a, b)
    assert view.model.embed_tokens.weight.data_ptr() == pair.target.model.embed_tokens.weight.data_ptr()
    assert len(view.model.layers) == 2 and len(pair.target.model.layers) == 4  # the target is untouched
    for bad in (0, 4, 2.5, True):
        with pytest.raises(OptionError, match=r"method.exit_layer.*\[1, 3\]"):
            early_exit(pair.target, bad)


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
def test_layer_skip_equals_transformers_early_exit(pair, prompts, exit_layer):
    native = decode(pair, {"name": "layer_skip", "gamma": 5, "exit_layer": exit_layer}, prompts)
    hf = decode(pair, {"name": "hf_assisted", "gamma": 5, "assistant_early_exit": exit_layer,
                       "assistant_confidence_threshold": 0.0}, prompts)
    ar = decode(pair, {"name": "ar"}, prompts)
    for i, (a, b, t) in enumerate(zip(native, hf, ar)):
        assert a.token_ids == b.token_ids == t.token_ids, f"prompt {i}: tokens differ"
        assert its(a) == its(b), f"prompt {i}: candidates or matches differ"
        assert (a.target_calls, a.draft_calls) == (b.target_calls, b.draft_calls), f"prompt {i}: calls differ"
    assert any(r.accepted < r.drafted for g in native for r in g.records)


def test_layer_skip_with_the_drafts_layers_is_vanilla(pair, prompts):
    """exit_layer 2 on tiny_random is its draft model: the same schedule as vanilla with the pair's draft."""
    a = decode(pair, {"name": "layer_skip", "gamma": 4, "exit_layer": 2}, prompts)
    b = decode(pair, {"name": "vanilla", "gamma": 4}, prompts)
    assert [its(g) for g in a] == [its(g) for g in b]


def test_target_only_methods_run_on_a_pair_without_a_draft(pair, prompts):
    alone = dataclasses.replace(pair, draft=None)  # a copy: the loaded pair is cached for other tests
    for spec in ({"name": "pld"}, {"name": "layer_skip", "exit_layer": 2},
                 {"name": "hf_assisted", "prompt_lookup_num_tokens": 10},
                 {"name": "hf_assisted", "assistant_early_exit": 2}):
        assert len(decode(alone, spec, prompts[:1])[0].token_ids) == MAX_NEW
    with pytest.raises(ValueError, match="has no draft model"):
        decode(alone, {"name": "vanilla"}, prompts[:1])


# --- universal assisted generation (another tokenizer) ---


@pytest.mark.parametrize("merges", [0, 24])
def test_uag_equals_ar_and_transformers_universal_assisted_generation(prompts, merges):
    cross = pair_of("pair=tiny_cross", f"pair.draft.merges={merges}")
    assert cross.draft_tokenizer.get_vocab() != cross.tokenizer.get_vocab()
    if merges:
        assert len(cross.draft_tokenizer.tokenize(" the cat is in the hat")) < len(" the cat is in the hat")
    native = decode(cross, {"name": "uag", "gamma": 5}, prompts)
    hf = decode(cross, {"name": "hf_assisted", "gamma": 5, "assistant_confidence_threshold": 0.0}, prompts)
    ar = decode(cross, {"name": "ar"}, prompts)
    for i, (a, b, t) in enumerate(zip(native, hf, ar)):
        assert a.token_ids == b.token_ids == t.token_ids, f"prompt {i}: tokens differ"
        assert a.draft_calls >= len(a.records) and a.target_calls == len(a.records) < MAX_NEW + 1
        # an iteration drafts nothing only when the drafts' text is empty (a partial UTF-8 character dropped)
        assert sum(r.drafted > 0 for r in a.records) >= 0.8 * len(a.records)
    assert sum(r.accepted for g in native for r in g.records) > 0


def test_uag_conversions():
    cross = pair_of("pair=tiny_cross", "pair.draft.merges=24")
    t_tok, d_tok = cross.tokenizer, cross.draft_tokenizer
    ctx = d_tok.encode("Say: the", add_special_tokens=False)
    new = d_tok.encode(" cat in the hat", add_special_tokens=False)
    assert new_text(d_tok, ctx, new) == " cat in the hat"
    assert new_text(d_tok, ctx, d_tok.encode(" \u00e9", add_special_tokens=False)[:2]) == " "  # a partial character
    committed = t_tok.encode("Say: the", add_special_tokens=False)
    assert to_target(t_tok, committed, " cat", 10) == t_tok.encode(" cat", add_special_tokens=False)
    assert committed + to_target(t_tok, committed, " cat", 3) == t_tok.encode("Say: the cat", add_special_tokens=False)


def test_a_cross_tokenizer_pair_runs_only_methods_that_retokenize(tmp_path):
    for method in ("vanilla", "adasd", "draft_only"):
        with pytest.raises(OptionError, match=r"cross_tokenizer: true.*method=uag"):
            runner.run(small("pair=tiny_cross", f"method={method}", "limit=1"), tmp_path / method)
        assert not (tmp_path / method).exists()
    with pytest.raises(OptionError, match=r"decode.temperature=0 only"):
        runner.run(small("pair=tiny_cross", "method=uag", "decode=t1", "limit=1"), tmp_path / "t1")
    with pytest.raises(OptionError, match=r"batch_size=1"):
        runner.run(small("pair=tiny_cross", "method=uag", "batch_size=2", "limit=2"), tmp_path / "b2")
    runner.run(small("pair=tiny_cross", "method=pld", "limit=1", "decode.max_new_tokens=8"), tmp_path / "pld")
    assert (tmp_path / "pld" / "rows.jsonl").exists()


def test_a_hub_pair_with_two_vocabularies_needs_cross_tokenizer(tmp_path):
    from specbench.models.pairs import build_hub

    t_dir, d_dir = tmp_path / "t", tmp_path / "d"
    cross = pair_of("pair=tiny_cross")
    for folder, model, tok in ((t_dir, cross.target, cross.tokenizer), (d_dir, cross.draft, cross.draft_tokenizer)):
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    cfg = {"name": "local_cross", "builder": "hub", "target": {"path": str(t_dir)}, "draft": {"path": str(d_dir)}}
    with pytest.raises(ValueError, match="do not share a tokenizer vocabulary.*cross_tokenizer: true"):
        build_hub(cfg, torch.device("cpu"))
    loaded = build_hub({**cfg, "cross_tokenizer": True}, torch.device("cpu"))
    assert loaded.draft_tokenizer.get_vocab() == cross.draft_tokenizer.get_vocab()
    assert loaded.vocab_size == len(cross.tokenizer)


# --- sampling: the target's distribution (chi-square against the exact joint) ---

PLD_PROMPT = [1, 5, 3, 5, 1, 5]  # its last 2-gram (1, 5) occurred before: pld drafts 3, 5 (gamma 2)
N = 6000


def test_pld_sampling_follows_the_target():
    target = TableLM(V, 11)
    assert lookup(PLD_PROMPT, 2, 2, frozenset()) == [3, 5]
    pld = runner.build_method({"name": "pld", "gamma": 2})
    counts = joint_counts(bound_engine(pld, {"target": target}, V, 1.0, context=64), N, PLD_PROMPT)
    joint = target_joint(target, PLD_PROMPT)
    assert 0.05 < joint[3].sum() < 0.95  # the first draft is both accepted and rejected often
    assert chi2_pvalue(counts, joint) > 1e-3
    leaky = runner.build_method({"name": "pld", "gamma": 2})
    engine = bound_engine(leaky, {"target": target}, V, 1.0, context=64)
    engine.rule = AcceptAll()  # a wrong rule: the same test must fail
    assert chi2_pvalue(joint_counts(engine, 2000, PLD_PROMPT), joint) < 1e-6


@pytest.mark.slow  # 6000 decodes (29 s); in CI the sampling contract (test_method_contracts.py) covers layer_skip
def test_layer_skip_sampling_follows_the_target():
    torch.set_num_threads(1)
    target = tiny_llama(11, vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                        initializer_range=0.6)
    method = runner.build_method({"name": "layer_skip", "gamma": 2, "exit_layer": 1})
    engine = bound_engine(method, {"target": target}, V, 1.0, context=64)
    assert method.plan.lossless and engine.rule.lossless and make_rule("rejection").lossless
    joint = target_joint(target, [1, 5, 2])
    assert chi2_pvalue(joint_counts(engine, N, [1, 5, 2]), joint) > 1e-3
