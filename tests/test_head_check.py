"""Malformed head folders are refused before any model loads, each with one message naming the folder, the file and
what is wrong (specbench.models.head_check), and nothing is written; a target whose attention cannot take a tree
mask is refused before decoding. Each case starts from a head saved by save_head and breaks one thing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import ROOT
from specbench.common.options import OptionError
from specbench.methods.eagle3 import Eagle3
from specbench.methods.medusa import Medusa
from specbench.models.eagle3 import Eagle3Config, Eagle3Head
from specbench.models.heads import HeadFormatError, save_head
from specbench.models.medusa import MedusaConfig, MedusaHeads

V, H = 259, 16  # the tiny_random target's vocabulary and hidden size (tests/conftest.py's tiny_pair)


def eagle3_folder(tmp_path: Path, draft_vocab: int = 64, fmt: str = "eagle3") -> Path:
    """A valid EAGLE-3 head for a V-token, H-wide target, draft vocabulary every 4th id."""
    head = Eagle3Head(Eagle3Config(H, 32, 2, 1, V, draft_vocab, (1, 2, 3)))
    if draft_vocab < V:
        head.set_vocab(torch.arange(draft_vocab) * 4)
    return save_head(head, tmp_path / f"head_{fmt}", fmt, None)


def medusa_folder(tmp_path: Path, heads: int = 3, layers: int = 1) -> Path:
    return save_head(MedusaHeads(MedusaConfig(heads, layers, H, V)), tmp_path / "medusa", "medusa", None)


def edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def edit_weights(folder: Path, fn) -> None:
    path = folder / "model.safetensors"
    save_file(fn(load_file(path)), path)


def refused(cls, folder: Path) -> str:
    """The message building the method with this head gives (before any model loads)."""
    with pytest.raises(HeadFormatError) as err:
        cls(head=str(folder))
    return str(err.value)


def test_a_valid_head_passes(tmp_path):
    Eagle3(head=str(eagle3_folder(tmp_path)))
    Eagle3(head=str(eagle3_folder(tmp_path, fmt="speculators")))
    Medusa(head=str(medusa_folder(tmp_path)))


def test_no_config(tmp_path):
    folder = eagle3_folder(tmp_path)
    (folder / "config.json").unlink()
    assert refused(Eagle3, folder) == f"{folder} has no config.json: not a head folder"


def test_malformed_json(tmp_path):
    folder = eagle3_folder(tmp_path)
    (folder / "config.json").write_text('{"hidden_size": 16,\n "draft_vocab_size": }')
    message = refused(Eagle3, folder)
    assert message.startswith(f"{folder / 'config.json'}: not JSON (") and "line 2" in message


def test_a_config_without_hidden_size(tmp_path):
    folder = eagle3_folder(tmp_path)
    edit_config(folder, hidden_size=None)
    assert refused(Eagle3, folder) == (f"{folder / 'config.json'}: hidden_size must be an integer >= 1 (missing); the "
                                       "head is built from hidden_size, intermediate_size, num_attention_heads, "
                                       "num_key_value_heads, vocab_size")
    folder = eagle3_folder(tmp_path, fmt="speculators")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["transformer_layer_config"]["hidden_size"] = "16"
    (folder / "config.json").write_text(json.dumps(cfg))
    assert "transformer_layer_config.hidden_size must be an integer >= 1 ('16')" in refused(Eagle3, folder)


def test_weights_of_the_wrong_shape_or_missing(tmp_path):
    folder = eagle3_folder(tmp_path)
    edit_weights(folder, lambda w: {**w, "fc.weight": w["fc.weight"].T.contiguous()})
    message = refused(Eagle3, folder)
    assert message.startswith(f"{folder / 'model.safetensors'}: the weights do not match config.json: wrong shapes: "
                              "fc.weight [48, 16] (the config gives [16, 48])"), message
    edit_weights(folder, lambda w: {k: v for k, v in w.items() if k not in ("fc.weight", "norm.weight")})
    assert "missing fc.weight, norm.weight" in refused(Eagle3, folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    assert refused(Eagle3, folder).startswith(f"{folder / 'model.safetensors'}: not a readable weight file")
    (folder / "model.safetensors").unlink()
    assert "has none of the weight files model.safetensors, pytorch_model.bin" in refused(Eagle3, folder)


def test_draft_vocab_size_against_the_weights(tmp_path):
    folder = eagle3_folder(tmp_path)
    edit_config(folder, draft_vocab_size=80)
    assert refused(Eagle3, folder) == (f"{folder / 'model.safetensors'}: lm_head.weight has 64 rows but config.json's "
                                       "draft_vocab_size is 80")


def test_a_small_draft_vocabulary_without_d2t_is_refused(tmp_path):
    """Silently accepted before: draft id i read as target id i."""
    folder = eagle3_folder(tmp_path)
    edit_weights(folder, lambda w: {k: v for k, v in w.items() if k not in ("d2t", "t2d")})
    assert refused(Eagle3, folder) == (f"{folder / 'model.safetensors'}: draft_vocab_size 64 < vocab_size 259 but no "
                                       "d2t tensor maps draft ids to target ids; without it draft id i would be read "
                                       "as target id i")


def test_d2t_of_absolute_ids_is_refused(tmp_path):
    folder = eagle3_folder(tmp_path)  # draft ids 0, 4, .., 252 of 259: as offsets, i + 4i leaves the vocabulary
    edit_weights(folder, lambda w: {**w, "d2t": torch.arange(64) * 4})
    assert refused(Eagle3, folder) == (f"{folder / 'model.safetensors'}: d2t maps draft id i to target id i + d2t[i] "
                                       "(offsets, as EAGLE-3 writes them); here those ids are outside 0..258 "
                                       "(absolute target ids instead of offsets?)")
    head = Eagle3Head(Eagle3Config(H, 32, 2, 1, V, 64, (1, 2, 3)))
    head.set_vocab(torch.arange(64) * 2)  # ids 0, 2, .., 126: read as offsets, i + 2i stays inside; t2d tells
    folder = save_head(head, tmp_path / "every_other", "eagle3", None)
    edit_weights(folder, lambda w: {**w, "d2t": torch.arange(64) * 2})
    assert refused(Eagle3, folder) == (f"{folder / 'model.safetensors'}: t2d marks 64 target ids but d2t's 64 draft "
                                       "ids map to others (d2t of absolute ids instead of offsets?)")


def test_a_medusa_config_that_overstates_its_layers(tmp_path):
    folder = medusa_folder(tmp_path)
    edit_config(folder, medusa_num_layers=2)
    message = refused(Medusa, folder)
    assert message == (f"{folder / 'config.json'}: medusa_num_layers is 2, but medusa_lm_head.pt holds head 0's layers "
                       "[0, 1] (its vocabulary layer `0.2.weight` is missing): the config overstates or understates "
                       "the layers")


def test_a_head_of_the_other_kind(tmp_path):
    folder = medusa_folder(tmp_path)
    assert refused(Eagle3, folder) == f"{folder}: holds a medusa head; this method needs a eagle3 head"


def test_a_head_for_another_vocabulary_is_refused_when_it_binds(tiny_pair, tmp_path):
    from specbench.models.heads import load_head
    from specbench.runs.binding import build_method, pair_binding
    from specbench.decoding.sampling import SamplingParams

    width = tiny_pair.target.config.hidden_size
    head = Eagle3Head(Eagle3Config(width, 32, 2, 1, 300, 300, (1, 2, 3)))  # the target's width, another vocabulary
    folder = save_head(head, tmp_path / "other_vocab", "eagle3", None)
    method = build_method({"name": "eagle3", "head": str(folder)})
    with pytest.raises(HeadFormatError) as err:
        load_head(str(folder), pair_binding(tiny_pair, method, SamplingParams(0.0)), "eagle3")
    assert str(err.value) == (f"method.head: {folder / 'config.json'} reads target states of size {width} at "
                              f"hidden_states [1, 2, 3] over 300 tokens; the target has size {width}, indices 1..4 and "
                              f"{tiny_pair.target.get_output_embeddings().weight.shape[0]} tokens")


def test_the_cli_refuses_before_loading_and_writes_nothing(tmp_path):
    import subprocess
    import sys

    folder = eagle3_folder(tmp_path)
    edit_config(folder, hidden_size=None)
    root = tmp_path / "results"
    p = subprocess.run([sys.executable, "run.py", "pair=tiny_random", "dataset=smoke", "limit=1", "method=eagle3",
                        f"method.head={folder}", f"paths.results={root}", "threads=1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode != 0
    assert f"{folder / 'config.json'}: hidden_size must be an integer >= 1 (missing)" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert not root.exists() or not any(root.rglob("rows.jsonl"))
    assert not any(d.name == "eagle3" for d in root.rglob("*")) if root.exists() else True


@pytest.mark.parametrize("impl", ["flash_attention_2", "sliding"])
def test_a_target_that_cannot_take_a_tree_mask_is_refused_before_decoding(tiny_pair, impl, monkeypatch):
    from specbench.decoding.sampling import SamplingParams
    from specbench.runs.runner import build_method, make_engine

    config = tiny_pair.target.config
    if impl == "sliding":
        monkeypatch.setattr(config, "layer_types", ["sliding_attention"] + ["full_attention"] * 3, raising=False)
        want = "sliding_attention"
    else:
        monkeypatch.setattr(config, "_attn_implementation", impl, raising=False)
        want = "flash_attention_2"
    with pytest.raises(OptionError, match=f"method 'dyn_tree' verifies trees.*{want}"):
        make_engine(tiny_pair, build_method({"name": "dyn_tree"}), SamplingParams(0.0), ())
