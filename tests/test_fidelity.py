"""Fidelity of the engine: native `heuristic` and `confidence` against transformers' own assisted generation
(`hf_assisted`) under greedy decoding, token for token and iteration for iteration; `hf_assisted`'s limits."""

import time

import pytest
import torch
from omegaconf import OmegaConf

from helpers import TEST_DEVICE, SAME_VOCAB, compose_cfg, pair_engine
from specbench.bench import smoke_prompts
from specbench.decoding.engine import Engine, Generation
from specbench.models.pairs import load_pair
from specbench.runs.runner import build_method, make_engine, sampling_params

# tiny_random with one vocab_size for both models (transformers refuses different sizes). initializer_range 1.0
# spreads the draft's probabilities around the 0.4 threshold (at 0.2 they sit near 0.05), so the confidence
# stop both fires and lets full windows through, and the ROC refits move the threshold.
PAIR = SAME_VOCAB + ("pair.target.initializer_range=1.0",)
MAX_NEW = 40
HF_HEURISTIC = {"name": "hf_assisted", "gamma": 5, "num_assistant_tokens_schedule": "heuristic",
                "assistant_confidence_threshold": 0.0}


def pair_of(*overrides: str):
    return load_pair(OmegaConf.to_container(compose_cfg(*overrides).pair, resolve=True), torch.device(TEST_DEVICE))


@pytest.fixture(scope="module")
def pair():
    return pair_of(*PAIR)


@pytest.fixture(scope="module")
def prompts(pair):
    return smoke_prompts(pair, 8)


def decode(pair, spec: dict, prompts, max_new: int = MAX_NEW, temperature: float = 0.0, seed: int | None = None
           ) -> list[Generation]:
    method = build_method(spec)
    engine = make_engine(pair, method, sampling_params({"temperature": temperature, "max_new_tokens": max_new}), ())
    gen = lambda: torch.Generator().manual_seed(seed) if seed is not None else None  # noqa: E731
    return [engine.generate(ids, max_new, generator=gen()) for ids in prompts]


def assert_same_run(native: list[Generation], hf: list[Generation]) -> None:
    """Same tokens, same candidates and matches at every iteration, same model calls."""
    for i, (a, b) in enumerate(zip(native, hf)):
        assert a.token_ids == b.token_ids, f"prompt {i}: tokens differ"
        assert [r.drafted for r in a.records] == [r.drafted for r in b.records], f"prompt {i}: candidates differ"
        assert [r.accepted for r in a.records] == [r.accepted for r in b.records], f"prompt {i}: matches differ"
        assert (a.target_calls, a.draft_calls) == (b.target_calls, b.draft_calls), f"prompt {i}: calls differ"
        assert b.target_calls == len(b.records) and b.decode_s >= b.target_model_s + b.draft_model_s > 0


def test_heuristic_equals_transformers_heuristic_schedule(pair, prompts):
    native = decode(pair, {"name": "heuristic", "gamma": 5}, prompts)
    hf = decode(pair, HF_HEURISTIC, prompts)
    assert_same_run(native, hf)
    for a, b in zip(native, hf):  # transformers' own final num_assistant_tokens (written back to the draft)
        assert b.extra["assistant_settings_after"]["num_assistant_tokens"] == a.records[-1].state["gamma"]
    recs = [r for g in native for r in g.records if r.drafted]
    assert any(r.accepted == r.drafted for r in recs) and any(r.accepted < r.drafted for r in recs)
    assert max(r.state["gamma"] for r in recs) > 5


def test_heuristic_kept_across_examples_equals_transformers(pair, prompts):
    saved = pair.draft.generation_config.to_dict()
    native = decode(pair, {"name": "heuristic", "gamma": 5, "persist": True}, prompts[:4])
    hf = decode(pair, {**HF_HEURISTIC, "persist": True}, prompts[:4])
    assert_same_run(native, hf)
    assert hf[1].records[0].drafted != 5  # the second example started from the first one's final γ
    assert pair.draft.generation_config.to_dict() == saved  # the shared draft's config is restored


def test_confidence_equals_transformers_assistant_threshold(pair, prompts):
    native = decode(pair, {"name": "confidence"}, prompts)
    hf = decode(pair, {"name": "hf_assisted"}, prompts)  # transformers' defaults: 20, constant, 0.4 + ROC
    assert_same_run(native, hf)
    recs = [r for g in native for r in g.records]
    assert sum(r.stop == "policy" for r in recs) > 10  # the confidence stop fired
    assert any(r.drafted == 20 for r in recs)  # and let whole windows through
    thresholds = {r.state["threshold"] for r in recs}
    assert len(thresholds) > 5 and min(thresholds) < 0.4 < max(thresholds)  # the ROC refits moved it both ways


def test_confidence_after_a_rejected_eos_draft():
    """A drafted EOS that the target rejects is an ROC sample (q(EOS), 0) in transformers and here."""
    p = pair_of(*SAME_VOCAB)
    ids = smoke_prompts(p, 8)[7:]
    native = decode(p, {"name": "confidence"}, ids, max_new=48)
    assert any(r.stop == "eos" and r.accepted == r.drafted - 1 for r in native[0].records)
    assert_same_run(native, decode(p, {"name": "hf_assisted"}, ids, max_new=48))


def test_hf_assisted_refuses_different_vocab_sizes(tiny_pair):
    ids = tiny_pair.tokenizer("hello")["input_ids"]
    with pytest.raises(ValueError, match="vocab_size 264 and the draft 272"):
        decode(tiny_pair, {"name": "hf_assisted"}, [ids])


def engines(pair, eos_ids=(), stop_strings=()) -> tuple[Engine, Engine]:
    """`ar` and `hf_assisted` engines with these EOS ids and stop strings."""
    return tuple(pair_engine(pair, {"name": name}, eos_ids, stop_strings) for name in ("ar", "hf_assisted"))


def test_hf_assisted_stops_like_the_engine(pair, prompts):
    a_eng, h_eng = engines(pair)
    free = a_eng.generate(prompts[0], 40)
    for n in (1, 7):
        assert h_eng.generate(prompts[0], n).token_ids == free.token_ids[:n]
    eos = free.token_ids[len(free.token_ids) // 2]  # a token the target emits mid-way plays EOS
    a_eng, h_eng = engines(pair, eos_ids={eos})
    a, h = a_eng.generate(prompts[0], 40), h_eng.generate(prompts[0], 40)
    assert a.token_ids == h.token_ids and a.stop_reason == h.stop_reason == "eos"
    stop = free.text[10:12]
    a_eng, h_eng = engines(pair, stop_strings=(stop,))
    a, h = a_eng.generate(prompts[0], 40), h_eng.generate(prompts[0], 40)
    assert a.token_ids == h.token_ids and a.text == h.text and h.stop_reason == "stop_string"


def test_hf_assisted_sampling_is_seeded(pair, prompts):
    torch.manual_seed(0)
    before = torch.get_rng_state()
    runs = [decode(pair, {"name": "hf_assisted"}, prompts[:2], temperature=1.0, seed=s) for s in (1, 1, 2)]
    assert torch.equal(torch.get_rng_state(), before)  # the caller's global RNG is left alone
    tokens = [[g.token_ids for g in r] for r in runs]
    assert tokens[0] == tokens[1] != tokens[2]
    for g in runs[0]:  # every committed token is one iteration's accepted drafts or its next token
        assert sum(r.accepted + 1 for r in g.records) == len(g.token_ids) == MAX_NEW


def test_hf_assisted_first_block_spans_what_the_engines_does(pair, prompts, monkeypatch):
    """first_block_s starts at the first model call, as the engine's does: transformers' set-up before its
    loop (here slowed by SETUP_S) counts in decode_s only; the first block is the first iteration."""
    from transformers.generation.utils import GenerationMixin

    SETUP_S = 0.5
    slow = GenerationMixin._get_candidate_generator

    def slowed(self, *args, **kwargs):
        time.sleep(SETUP_S)
        return slow(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "_get_candidate_generator", slowed)
    (h,) = decode(pair, HF_HEURISTIC, prompts[:1])
    first = h.records[0]
    assert h.decode_s >= SETUP_S > h.first_block_s >= first.draft_s + first.verify_s > 0
    (n,) = decode(pair, {"name": "heuristic", "gamma": 5}, prompts[:1])  # the same first block natively
    assert n.first_block_s >= n.records[0].draft_s + n.records[0].verify_s > 0
