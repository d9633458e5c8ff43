"""A head folder checked before anything loads: its config.json, its weights' names and shapes, its vocabulary map.
Only the config and the weight files' headers (safetensors) or state dicts (torch files) are read, and compared
with the head the config builds (on the meta device); one HeadFormatError names the folder, the file and what is
wrong. What needs the target (its hidden size, vocabulary and layers) is checked when the head binds (heads.load_head).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import safe_open

from specbench.common.errors import UserError
from specbench.models.eagle3 import LLAMA_KEYS, Eagle3Config, Eagle3Head
from specbench.models.medusa import MedusaConfig, MedusaHeads
UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")  # speculators options the head does not implement
EAGLE3_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
MEDUSA_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors")
REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")


class HeadFormatError(UserError, ValueError):
    """A folder that holds no head this project reads, or a head of another kind or target."""


def read_config(folder: Path) -> dict:
    """config.json of a head folder as a dict; the error names the file and, for bad JSON, its line and column."""
    path = folder / "config.json"
    if not path.is_file():
        raise HeadFormatError(f"{folder} has no config.json: not a head folder")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HeadFormatError(f"{path}: not JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise HeadFormatError(f"{path}: a JSON object of the head's fields is expected, got {type(cfg).__name__}")
    return cfg


def eagle3_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's target states: hidden_states indices (2, L // 2, L - 3), clamped to 1..L for tiny targets."""
    return tuple(min(max(k, 1), num_layers) for k in (2, num_layers // 2, num_layers - 3))


def eagle3_config(cfg: dict, fmt: str, target_layers: int) -> Eagle3Config:
    """The head's config from a config.json of format `fmt` (eagle3 | speculators); target_layers: the target's
    decoder layers (EAGLE-3's default states when the config names none)."""
    layers = tuple(cfg.get("eagle_aux_hidden_state_layer_ids") or eagle3_layers(target_layers))
    if fmt == "speculators":  # Llama fields under transformer_layer_config; vLLM reads no norm_before_residual as true
        cfg = {**cfg["transformer_layer_config"], **{k: cfg.get(k) for k in ("draft_vocab_size", "target_hidden_size")},
               "norm_before_residual": cfg.get("norm_before_residual", True)}
    fields = {k: cfg[k] for k in LLAMA_KEYS if cfg.get(k) is not None}
    return Eagle3Config(**fields, draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
                        layers=layers, target_hidden_size=cfg.get("target_hidden_size"),
                        norm_before_residual=bool(cfg.get("norm_before_residual", False)))


T = TypeVar("T")


def release_names(weights: dict[str, T], fmt: str) -> dict[str, T]:
    """A weight file's names as the release layout's: a speculators file's layers.0.* are midlayer.*, and its
    training-only verifier_* are left out."""
    if fmt != "speculators":
        return weights
    return {k.replace("layers.0.", "midlayer.", 1): v for k, v in weights.items() if not k.startswith("verifier_")}


def head_format(cfg: dict) -> str:
    """eagle3 | speculators | medusa, from a config.json's fields."""
    if cfg.get("speculators_model_type") == "eagle3":
        return "speculators"
    if "medusa_num_heads" in cfg:
        return "medusa"
    if "draft_vocab_size" in cfg or any("eagle3" in str(a).lower() for a in cfg.get("architectures") or []):
        return "eagle3"
    raise HeadFormatError("its config.json is none of: the EAGLE-3 release layout (draft_vocab_size), the "
                          "speculators format (speculators_model_type: eagle3), Medusa's (medusa_num_heads)")


def weight_file(folder: Path, names: tuple[str, ...]) -> Path:
    """The first of the weight files `names` in the folder."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise HeadFormatError(f"{folder} has none of the weight files {', '.join(names)}")


def read_tensors(path: Path, names: tuple[str, ...] | None = ()
                 ) -> tuple[dict[str, tuple[int, ...]], dict[str, torch.Tensor]]:
    """(name -> shape of every tensor, the tensors `names` that are present, None: all) of a weight file; a
    safetensors file is read from its header, a torch file weights-only."""
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), "pt") as f:
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
                return shapes, {k: f.get_tensor(k) for k in (shapes if names is None else names) if k in shapes}
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - any reader error: the file is not a readable weight file
        raise HeadFormatError(f"{path}: not a readable weight file ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise HeadFormatError(f"{path}: a state dict of tensors is expected")
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    return shapes, {k: state[k] for k in (shapes if names is None else names) if k in shapes}


def positive_ints(path: Path, cfg: dict, keys: tuple[str, ...], where: str = "") -> None:
    """Each of `keys` in cfg is an integer >= 1; the error names the file, the key and what was found."""
    for k in keys:
        v = cfg.get(k)
        if type(v) is not int or v < 1:
            found = "missing" if k not in cfg else f"{v!r}"
            raise HeadFormatError(f"{path}: {where}{k} must be an integer >= 1 ({found}); the head is built from "
                                  f"{', '.join(keys)}")


def compare_shapes(path: Path, got: dict[str, tuple[int, ...]], want: dict[str, tuple[int, ...]],
                   optional: set[str]) -> None:
    """Missing, extra and misshapen tensors of a weight file against the head the config describes."""
    missing = sorted(set(want) - set(got) - optional)
    extra = sorted(set(got) - set(want))
    wrong = [f"{k} {list(got[k])} (the config gives {list(want[k])})" for k in sorted(set(got) & set(want))
             if got[k] != want[k]]
    listed = [f"{what} {', '.join(names[:6])}" + (f" and {len(names) - 6} more" if len(names) > 6 else "")
              for what, names in (("missing", missing), ("unexpected", extra)) if names]
    problems = listed + ([f"wrong shapes: {'; '.join(wrong[:4])}"] if wrong else [])
    if problems:
        raise HeadFormatError(f"{path}: the weights do not match config.json: {'; '.join(problems)}")


def check_vocab_map(path: Path, vd: int, V: int, tensors: dict[str, torch.Tensor]) -> None:
    """An EAGLE-3 head's d2t [V_d] (offsets: draft id i is target id i + d2t[i]) and t2d [V] (membership)."""
    if "d2t" not in tensors:
        if vd < V:
            raise HeadFormatError(f"{path}: draft_vocab_size {vd} < vocab_size {V} but no d2t tensor maps draft ids "
                                  "to target ids; without it draft id i would be read as target id i")
        return
    target = torch.arange(vd) + tensors["d2t"].long()
    inside = bool(target.min() >= 0) and bool(target.max() < V)
    if not inside or len(torch.unique(target)) != vd:
        raise HeadFormatError(f"{path}: d2t maps draft id i to target id i + d2t[i] (offsets, as EAGLE-3 writes "
                              f"them); here those ids are {'not distinct' if inside else f'outside 0..{V - 1}'} "
                              "(absolute target ids instead of offsets?)")
    t2d = tensors.get("t2d")
    if t2d is not None and (int(t2d.bool().sum()) != vd or not bool(t2d.bool()[target].all())):
        raise HeadFormatError(f"{path}: t2d marks {int(t2d.bool().sum())} target ids but d2t's {vd} draft ids map to "
                              "others (d2t of absolute ids instead of offsets?)")


def check_eagle3(folder: Path, cfg: dict, fmt: str, target_layers: int) -> None:
    """An EAGLE-3 folder (release or speculators layout) against the head its config describes."""
    path = folder / "config.json"
    if fmt == "speculators":
        inner = cfg.get("transformer_layer_config")
        if not isinstance(inner, dict):
            raise HeadFormatError(f"{path}: transformer_layer_config (the layer's Llama fields) is missing")
        positive_ints(path, inner, REQUIRED, "transformer_layer_config.")
        bad = [k for k in UNSUPPORTED if cfg.get(k)]
        if bad:
            raise HeadFormatError(f"{path}: {', '.join(bad)} set; this EAGLE-3 head implements none of them")
    else:
        positive_ints(path, cfg, REQUIRED)
    if "draft_vocab_size" in cfg:
        positive_ints(path, cfg, ("draft_vocab_size",))
    c = eagle3_config(cfg, fmt, target_layers)
    if c.draft_vocab_size > c.vocab_size:
        raise HeadFormatError(f"{path}: draft_vocab_size {c.draft_vocab_size} exceeds vocab_size {c.vocab_size}")
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in Eagle3Head(c).state_dict().items()}
    wpath = weight_file(folder, EAGLE3_WEIGHTS)
    shapes, tensors = read_tensors(wpath, ("d2t", "t2d"))
    shapes = release_names(shapes, fmt)
    shapes.pop("embed_tokens.weight", None)
    rows = shapes.get("lm_head.weight", (c.draft_vocab_size,))[0]
    if rows != c.draft_vocab_size:
        raise HeadFormatError(f"{wpath}: lm_head.weight has {rows} rows but config.json's draft_vocab_size is "
                              f"{c.draft_vocab_size}")
    compare_shapes(wpath, shapes, want, {"d2t", "t2d"})
    check_vocab_map(wpath, c.draft_vocab_size, c.vocab_size, tensors)


def check_medusa(folder: Path, cfg: dict) -> None:
    """A Medusa folder: medusa_num_layers residual blocks and a vocabulary layer per head in the weights."""
    path = folder / "config.json"
    layers = cfg.get("medusa_num_layers", 1)
    if type(layers) is not int or layers < 0:
        raise HeadFormatError(f"{path}: medusa_num_layers must be an integer >= 0, got {layers!r}")
    wpath = weight_file(folder, MEDUSA_WEIGHTS)
    shapes, _ = read_tensors(wpath)
    heads = sorted({int(k.split(".")[0]) for k in shapes if k.split(".")[0].isdigit()})
    if not heads or heads != list(range(len(heads))):
        raise HeadFormatError(f"{wpath}: Medusa's keys `{{head}}.{{layer}}...` numbered 0..k-1 are expected, found "
                              f"heads {heads[:8]}")
    out = shapes.get(f"0.{layers}.weight")
    if out is None or len(out) != 2:
        found = sorted({int(k.split(".")[1]) for k in shapes if k.startswith("0.") and k.split(".")[1].isdigit()})
        raise HeadFormatError(f"{path}: medusa_num_layers is {layers}, but {wpath.name} holds head 0's layers "
                              f"{found} (its vocabulary layer `0.{layers}.weight` is missing): the config overstates "
                              "or understates the layers")
    with torch.device("meta"):  # the names and shapes of heads built as the config and vocabulary layer say
        medusa = MedusaHeads(MedusaConfig(len(heads), layers, hidden_size=out[1], vocab_size=out[0]))
    compare_shapes(wpath, shapes, {k: tuple(v.shape) for k, v in medusa.state_dict().items()}, set())


def check_head_folder(folder: str | Path, kind: str | None, target_layers: int = 32) -> str:
    """The format of the head folder (eagle3 | speculators | medusa) after every check this module makes; kind: the
    method's (eagle3 | medusa; None: either); target_layers as in eagle3_config."""
    folder = Path(folder)
    cfg = read_config(folder)
    try:
        fmt = head_format(cfg)
    except HeadFormatError as err:
        raise HeadFormatError(f"{folder / 'config.json'}: {err}") from None
    if kind is not None and (fmt == "medusa") != (kind == "medusa"):
        raise HeadFormatError(f"{folder}: holds a {fmt} head; this method needs a {kind} head")
    if fmt == "medusa":
        check_medusa(folder, cfg)
    else:
        check_eagle3(folder, cfg, fmt, target_layers)
    return fmt
