"""Pair loading: per-process reuse, freeing on change, dtype rules, shared vocabulary range."""

import copy
import gc
import weakref
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from helpers import TEST_DEVICE, compose_cfg
from specbench.models import pairs


def pair_cfg(*overrides):
    return OmegaConf.to_container(compose_cfg(*overrides).pair, resolve=True)


def test_same_pair_is_reused_and_a_new_one_frees_the_old():
    a = pairs.load_pair(pair_cfg("pair=tiny_random"), torch.device(TEST_DEVICE))
    assert pairs.load_pair(pair_cfg("pair=tiny_random"), torch.device(TEST_DEVICE)) is a
    ref = weakref.ref(a.target)
    del a
    b = pairs.load_pair(pair_cfg("pair=tiny_random", "pair.seed=1"), torch.device(TEST_DEVICE))
    gc.collect()
    assert ref() is None  # the previous pair's models were released
    assert b.target is not None
    pairs.free_pairs()


def test_shared_vocab_range_and_padding(tiny_pair):
    assert tiny_pair.vocab_size == len(tiny_pair.tokenizer) == 259
    assert tiny_pair.target.get_output_embeddings().weight.shape[0] == 264
    assert tiny_pair.draft.get_output_embeddings().weight.shape[0] == 272


def test_dtype_rules():
    assert pairs.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert pairs.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert pairs.resolve_dtype("float16", torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="valid: auto"):
        pairs.resolve_dtype("float8", torch.device("cpu"))


def test_paper_pairs_use_bf16_on_gpu_and_device_map_for_70b():
    for name in ("llama70b_8b", "llama70b_1b", "qwen72b_7b"):
        cfg = pair_cfg(f"pair={name}")
        assert cfg["target"]["device_map"] == "auto" and cfg["target"]["dtype"] == "auto"
    q = pair_cfg("pair=llama70bi_8bi_int8")["target"]["quantization"]
    assert q == {"bits": 8, "backend": "quanto"}


def test_unknown_model_key_is_refused():
    with pytest.raises(ValueError, match="unknown model keys.*dtyp"):
        pairs.load_model({"path": "x", "dtyp": "bf16"}, torch.device("cpu"))


def test_eos_ids_and_the_pad_id_come_from_one_collection(tiny_pair):
    tok = copy.deepcopy(tiny_pair.tokenizer)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[7, tok.eos_token_id]))
    pair = pairs.Pair("p", tiny_pair.target, None, tok, tiny_pair.vocab_size)
    assert pair.eos_ids([model]) == {7, tok.eos_token_id}
    assert pair.pad_id([model]) == tok.pad_token_id  # the tokenizer's pad id first
    tok.pad_token = None
    assert tok.pad_token_id is None and pair.pad_id([model]) == 7  # else the smallest EOS id
    tok.eos_token, model.generation_config.eos_token_id = None, None
    with pytest.raises(ValueError, match="neither a pad token nor an EOS id"):
        pair.pad_id([model])
