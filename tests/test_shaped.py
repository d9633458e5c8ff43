"""The shaped_random pair: the real conf/pair configs shrunk for the CPU; shapes, calibrated agreement, the engine."""

import time

import pytest
import torch
from omegaconf import OmegaConf

from helpers import compose_cfg, pair_engine
from specbench.models import pairs
from specbench.models.shaped import agreement, build_shaped_random, chain, random_model, shrink, successor, \
    word_tokenizer

CPU = torch.device("cpu")
CLASSES = {"llama31_8b_1b_shaped": "LlamaForCausalLM", "qwen3_8b_0p6b_shaped": "Qwen3ForCausalLM"}


def pair_cfg(name: str) -> dict:
    """conf/pair/<name>.yaml as the runner composes it."""
    return OmegaConf.to_container(compose_cfg(f"pair={name}").pair, resolve=True)


def tiny_cfg(name: str, **top) -> dict:
    """The pair shrunk by shrink(), in float32 unless `top` says otherwise."""
    return {**shrink(pair_cfg(name)), "dtype": "float32", **top}


_BUILT: dict[tuple, pairs.Pair] = {}


def built(name: str, acceptance: float = 0.7) -> pairs.Pair:
    """tiny_cfg(name) built once per (name, acceptance) in this module."""
    if (name, acceptance) not in _BUILT:
        _BUILT[name, acceptance] = build_shaped_random(tiny_cfg(name, acceptance=acceptance), CPU)
    return _BUILT[name, acceptance]


@pytest.mark.parametrize("name", CLASSES)
def test_shapes_dtype_and_tokenizer(name):
    cfg = tiny_cfg(name)
    pair = pairs.load_pair(cfg, CPU)  # found through the builder registry (the specbench.models plugins)
    for role, layers in (("target", 2), ("draft", 1)):
        m = pair.model(role)
        assert type(m).__name__ == CLASSES[name] and m.config.model_type == cfg[role]["model_type"]
        assert (m.config.hidden_size, m.config.num_hidden_layers, m.config.vocab_size) == (64, layers, 512)
        assert m.dtype == torch.float32 and not m.config.tie_word_embeddings
        head = m.get_output_embeddings().weight
        assert head.shape == (512, 64) and head[-3:].abs().sum() == 0  # <s>, </s>, <pad> rows are zero
    tok = pair.tokenizer
    assert len(tok) == pair.vocab_size == 512
    assert [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id] == [509, 510, 511]
    assert tok("t0 t7 t508")["input_ids"] == [0, 7, 508] and tok.decode([5, 6]) == "t5 t6"
    assert pair.target.name_or_path == f"shaped_random/{cfg['target']['model_type']}(64x2, seed=0)"
    pairs.free_pairs()


def test_the_configured_dtype_is_built_and_the_default_dtype_restored():
    cfg = shrink(pair_cfg("qwen3_8b_0p6b_shaped"))
    assert cfg["dtype"] == "bfloat16"
    pair = build_shaped_random(cfg, CPU)
    assert pair.target.dtype == pair.draft.dtype == torch.bfloat16 and torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("name,target_b,draft_b", [("llama31_8b_1b_shaped", 8.030, 1.498),
                                                   ("qwen3_8b_0p6b_shaped", 8.191, 0.752)])
def test_full_size_models_are_made_on_the_given_device(name, target_b, draft_b):
    """At full size on the meta device: every weight is made there (none on the CPU), in the counts the YAML states."""
    cfg = pair_cfg(name)
    tok = word_tokenizer(cfg["target"]["vocab_size"])
    for role, billions in (("target", target_b), ("draft", draft_b)):
        m = random_model(cfg[role], tok, 0, torch.bfloat16, torch.device("meta"))
        assert {p.device.type for p in m.parameters()} == {"meta"} and m.dtype == torch.bfloat16
        assert round(sum(p.numel() for p in m.parameters()) / 1e9, 3) == billions
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("name", CLASSES)
def test_agreement_on_fresh_sequences(name):
    f = successor(0, 512, CPU)
    fresh = chain(f, seed=1234, shape=(8, 128))  # calibration used seed + 2 = 2, 4 x 128
    hi, lo = built(name, 0.7), built(name, 0.4)
    a_hi, a_lo = agreement(hi.target, fresh, f), agreement(lo.target, fresh, f)
    assert abs(a_hi - 0.7) <= 0.08 and abs(a_lo - 0.4) <= 0.08 and a_lo < a_hi
    assert agreement(hi.draft, fresh, f) >= 0.97 and agreement(lo.draft, fresh, f) >= 0.97
    assert abs(hi.target.config.shaped_agreement - 0.7) <= 0.03 and hi.draft.config.shaped_agreement >= 0.99
    assert hi.target.config.shaped_embedding_scale > 0 and hi.draft.config.shaped_embedding_scale > 0


def argmax_decode(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens of `model` after prompt, each from a fresh forward of the whole sequence (no cache)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids).logits[0, -1].argmax().view(1, 1)], 1)
    return ids[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", CLASSES)
def test_vanilla_greedy_equals_the_target_and_accepts_as_calibrated(name):
    pair, gamma, alpha = built(name, 0.7), 5, 0.7
    f = successor(0, 512, CPU)
    records = []
    for k in range(2):
        prompt = pair.tokenizer(" ".join(f"t{i}" for i in chain(f, 50 + k, (1, 16))[0].tolist()))["input_ids"]
        eos = pair.eos_ids([pair.target, pair.draft])
        out = pair_engine(pair, {"name": "vanilla", "gamma": gamma}, eos_ids=eos).generate(prompt, 64)
        assert out.token_ids == argmax_decode(pair.target, prompt, 64) and out.stop_reason == "length"
        records += out.records
    accepted, drafted = sum(r.accepted for r in records), sum(r.drafted for r in records)
    rejections = sum(r.accepted < r.drafted for r in records)
    # per-token acceptance: each draft token is accepted with probability alpha until the first rejection, so the
    # estimate is accepted / (accepted + rejections); accepted / drafted is then sum_k<=w alpha^k / w per window w
    per_token = accepted / (accepted + rejections)
    expected = sum(sum(alpha ** i for i in range(1, r.drafted + 1)) for r in records) / drafted
    assert 0.5 <= per_token <= 0.9, per_token
    assert abs(accepted / drafted - expected) <= 0.1, (accepted / drafted, expected)


@pytest.mark.parametrize("key,value,match", [
    (("target", "model_type"), "gpt2", r"pair\.target\.model_type must be one of llama, qwen3; got 'gpt2'"),
    (("draft", "model_type"), None, r"pair\.draft\.model_type must be one of llama, qwen3"),
    (("acceptance",), 1.5, r"pair\.acceptance must be a number in \(0, 1\)"),
    (("acceptance",), 0, r"pair\.acceptance must be"),
    (("draft", "vocab_size"), 500, r"pair\.target\.vocab_size and pair\.draft\.vocab_size must be one integer"),
])
def test_bad_input_names_its_key(key, value, match):
    cfg = tiny_cfg("llama31_8b_1b_shaped")
    node = cfg
    for k in key[:-1]:
        node = node[k]
    node[key[-1]] = value
    with pytest.raises(ValueError, match=match):
        build_shaped_random(cfg, CPU)


def test_the_full_size_tokenizer_builds_in_a_second():
    start = time.perf_counter()
    tok = word_tokenizer(151936)
    took = time.perf_counter() - start
    assert len(tok) == 151936 and tok.convert_ids_to_tokens(151932) == "t151932" and tok.pad_token_id == 151935
    assert took < 2.0, took
