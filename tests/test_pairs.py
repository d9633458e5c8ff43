"""Pair loading: per-process reuse, freeing on change, dtype rules, shared vocabulary range."""

import gc
import weakref

import pytest
import torch
from omegaconf import OmegaConf

from helpers import compose_cfg
from specbench.models import pairs


def pair_cfg(*overrides):
    return OmegaConf.to_container(compose_cfg(*overrides).pair, resolve=True)


def test_same_pair_is_reused_and_a_new_one_frees_the_old():
    a = pairs.load_pair(pair_cfg("pair=tiny_random"), torch.device("cpu"))
    assert pairs.load_pair(pair_cfg("pair=tiny_random"), torch.device("cpu")) is a
    ref = weakref.ref(a.target)
    del a
    b = pairs.load_pair(pair_cfg("pair=tiny_random", "pair.seed=1"), torch.device("cpu"))
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
