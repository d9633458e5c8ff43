"""Dependent heads on disk, and loading one onto a pair by folder or hub id. Formats (config.json + weights), which
`task=distill task.kind=eagle3|medusa` also writes:
- EAGLE-3 release (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): Llama fields (eagle3.LLAMA_KEYS) plus draft_vocab_size;
  weights pytorch_model.bin or model.safetensors with fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d
  (and embed_tokens.weight in some releases). The release names no target layers: EAGLE-3 reads hidden_states
  (2, L // 2, L - 3) (the input of decoder layer k is hidden_states[k]); folders written here add
  eagle_aux_hidden_state_layer_ids.
- speculators, as vLLM serves (speculators_model_type "eagle3", e.g. RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3):
  the Llama fields under transformer_layer_config, with draft_vocab_size, norm_before_residual, target_hidden_size,
  eagle_aux_hidden_state_layer_ids and speculators_config; weights model.safetensors with layers.0.* for midlayer.*,
  embed_tokens.weight and the training-only verifier_norm / verifier_lm_head (ignored).
- Medusa release (e.g. FasterDecoding/medusa-vicuna-7b-v1.3): medusa_num_heads, medusa_num_layers,
  base_model_name_or_path; weights medusa_lm_head.safetensors or .pt with keys `{i}.{j}.linear.*` and
  `{i}.{num_layers}.weight`, the heads counted from the weights (the 7B release's config says 2, its file holds 5).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TypeAlias, cast

import torch
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from safetensors.torch import save_file
from torch import nn
from transformers import PreTrainedModel

from specbench.common.files import atomic_folder
from specbench.common.hub import source_of, unavailable
from specbench.common.options import OptionError
from specbench.models.drafters import INFO, PairView, finished_info, trained_folder
from specbench.models.eagle3 import Eagle3Config, Eagle3Head
from specbench.models.head_check import (EAGLE3_WEIGHTS, MEDUSA_WEIGHTS, HeadFormatError,  # noqa: F401 - re-exported
                                         check_head_folder, eagle3_config, eagle3_layers, read_config, read_tensors,
                                         release_names, weight_file)
from specbench.models.medusa import MedusaConfig, MedusaHeads
from specbench.models.pairs import input_embedding

Head: TypeAlias = Eagle3Head | MedusaHeads  # a dependent head of either kind


class HeadBinding(Protocol):
    """What load_head reads of a method's binding (decoding's Binding, which models may not import)."""

    @property
    def models(self) -> Mapping[str, nn.Module]: ...

    @property
    def pair(self) -> PairView | None: ...

KINDS = ("eagle3", "medusa")
FORMATS = {"eagle3": ("eagle3", "speculators"), "medusa": ("medusa",)}  # the formats each kind saves in


def read_head(folder: str | Path, target_layers: int) -> tuple[str, Head, nn.Embedding | None]:
    """(format, head module in float32, the head's own token embedding or None) of a head folder, after
    head_check.check_head_folder (target_layers as there)."""
    folder = Path(folder)
    fmt = check_head_folder(folder, None, target_layers)
    cfg = read_config(folder)
    if fmt == "medusa":
        _, w = read_tensors(weight_file(folder, MEDUSA_WEIGHTS), None)
        layers = int(cfg.get("medusa_num_layers", 1))
        n = len({k.split(".")[0] for k in w})  # from the weights: a release's medusa_num_heads may understate them
        vocab, hidden = w[f"0.{layers}.weight"].shape
        heads = MedusaHeads(MedusaConfig(n, layers, hidden, vocab))
        heads.load_state_dict(w)
        return fmt, heads.float(), None
    c = eagle3_config(cfg, fmt, target_layers)
    w = release_names(read_tensors(weight_file(folder, EAGLE3_WEIGHTS), None)[1], fmt)
    embed = w.pop("embed_tokens.weight", None)
    head = Eagle3Head(c)
    if "d2t" not in w:  # a head over the whole vocabulary (check_head_folder refused a smaller one without d2t)
        w["d2t"], w["t2d"] = head.d2t, head.t2d
    head.load_state_dict({"t2d": head.t2d, **w})
    if "t2d" not in w:
        head.set_vocab(head.target_ids())  # t2d marks d2t's target ids
    return fmt, head.float(), (nn.Embedding.from_pretrained(embed.float()) if embed is not None else None)


def eagle3_json(c: Eagle3Config, fmt: str, target: PreTrainedModel | None, name: str) -> dict[str, Any]:
    """config.json of an EAGLE-3 head in format `fmt` (eagle3: the release layout, or speculators)."""
    llama = {**c.llama_fields(), "num_hidden_layers": 1, "model_type": "llama"}
    head = {"draft_vocab_size": c.draft_vocab_size, "norm_before_residual": c.norm_before_residual,
            "eagle_aux_hidden_state_layer_ids": list(c.layers)}
    if fmt == "eagle3":
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], **llama, **head}
    else:
        arch = list(getattr(getattr(target, "config", None), "architectures", None) or ["LlamaForCausalLM"])
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": llama, **head,
               "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                      "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                      "verifier": {"name_or_path": name, "architectures": arch}}}
    if c.target_hidden_size is not None:  # EAGLE's loader reads a present key, even null
        cfg["target_hidden_size"] = c.target_hidden_size
    return cfg


def save_head(head: Head, folder: str | Path, fmt: str, target: PreTrainedModel | None,
              embed: nn.Embedding | None = None) -> Path:
    """Write `head` to `folder` (replacing it atomically) in format `fmt` (FORMATS: medusa for MedusaHeads, eagle3 or
    speculators for an Eagle3Head); target: the target model, named in the config (speculators' verifier, Medusa's
    base model)."""
    name = getattr(target, "name_or_path", "") or ""
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    with atomic_folder(Path(folder), replace=True) as tmp:
        if fmt == "medusa":
            assert isinstance(head, MedusaHeads), f"format medusa saves MedusaHeads, not {type(head).__name__}"
            m = head.config
            cfg = {"medusa_num_heads": m.num_heads, "medusa_num_layers": m.num_layers, "base_model_name_or_path": name,
                   "hidden_size": m.hidden_size, "vocab_size": m.vocab_size}
            torch.save(state, tmp / "medusa_lm_head.pt")  # the only file Medusa's from_pretrained reads
        elif fmt in ("eagle3", "speculators"):
            assert isinstance(head, Eagle3Head), f"format {fmt} saves an Eagle3Head, not {type(head).__name__}"
            cfg = eagle3_json(head.config, fmt, target, name)
            if fmt == "speculators":
                state = {k.replace("midlayer.", "layers.0.", 1): v for k, v in state.items()}
                if embed is not None:
                    state["embed_tokens.weight"] = embed.weight.detach().contiguous().cpu()
            save_file(state, tmp / "model.safetensors")
        else:
            raise ValueError(f"unknown head format {fmt!r}; valid: eagle3, speculators, medusa")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return Path(folder)


def check_head_source(method: str, spec: object, kind: str) -> None:
    """Before any model loads: a head folder on this machine passes check_head_folder; a hub id must be cached or
    downloadable (else the error gives the download command). The rest is checked when the head loads."""
    if not isinstance(spec, str) or not spec:
        return  # a module or nothing
    path = Path(spec)
    folder = path / "head" if (path / INFO).exists() else path  # a finished distill run's head/, or a head folder
    if folder.is_dir():
        check_head_folder(folder, kind)
    if path.exists():
        return
    try:
        validate_repo_id(spec)
    except HFValidationError:
        return  # a path: load_head says what is missing there
    source_of(spec, None)


_LOADED: dict[str, tuple[str, Head, nn.Embedding | None]] = {}


def head_folder(spec: str | None, pair: PairView | None, kind: str) -> Path:
    """The head folder of method.head: a finished distill run's head/, a head folder, or a hub id's snapshot."""
    if spec is None or spec in ("", "None"):
        raise OptionError(f"method.head: no head given; set it to the folder of a `python run.py task=distill "
                          f"task.kind={kind}` run, a head folder (EAGLE-3 release, speculators or Medusa layout) or a "
                          "hub id")
    path = Path(spec)
    if (path / INFO).exists():
        assert pair is not None, "a method binding carries its pair"  # a trained head is checked against it
        trained_folder(path, pair, kind, key="method.head")
        return path / "head"
    if path.is_dir():
        return path
    if "/" in spec and (spec.startswith((".", "/")) or spec.count("/") > 1):
        finished_info(path, kind, key="method.head")  # no distill.json: raises DrafterMissing with how to train one
    source = source_of(spec, None)
    try:
        return Path(snapshot_download(spec, local_files_only=source == "cache"))
    except OSError as err:
        raise unavailable([f"could not load head {spec!r}: {err}"], [(spec, None)]) from err


def load_head(spec: str | Head | None, binding: HeadBinding, kind: str
              ) -> tuple[Head, tuple[int, ...], str, Path | None]:
    """(head on the target's device and dtype, the target hidden_states indices it reads, its name, the folder read)
    of method.head: a head module (tests), a finished distill folder, a head folder, or a hub id."""
    target = cast(PreTrainedModel, binding.models["target"])  # the target role: the pair's transformers model
    tc = target.config.get_text_config()
    L, H, V = tc.num_hidden_layers, tc.hidden_size, target.get_output_embeddings().weight.shape[0]
    if isinstance(spec, nn.Module):
        fmt, head, embed, name = ("medusa" if isinstance(spec, MedusaHeads) else "eagle3"), spec, None, "in-memory head"
        folder = None
    else:
        folder = head_folder(spec, binding.pair, kind)
        key = json.dumps([str(folder.resolve()), (folder / "config.json").stat().st_mtime_ns, str(target.device),
                          str(target.dtype), L])
        if key not in _LOADED:
            _LOADED.clear()
            _LOADED[key] = read_head(folder, L)
        fmt, head, embed = _LOADED[key]
        name = str(spec)
    if (fmt == "medusa") != (kind == "medusa"):
        raise OptionError(f"method.head: {name} holds a {fmt} head; this method needs a {kind} head")
    where = f"{folder / 'config.json'}" if folder is not None else name  # the file the head's shape came from
    if isinstance(head, MedusaHeads):  # kind medusa (checked above)
        m = head.config
        if (m.hidden_size, m.vocab_size) != (H, V):
            raise HeadFormatError(f"method.head: {where} reads hidden size {m.hidden_size} and predicts {m.vocab_size} "
                                  f"tokens; the target has {H} and {V}")
        layers: tuple[int, ...] = (L,)  # the last hidden state, after the target's final norm
    else:
        c = head.config
        if (c.features, c.vocab_size) != (H, V) or not all(1 <= k <= L for k in c.layers):
            raise HeadFormatError(f"method.head: {where} reads target states of size {c.features} at hidden_states "
                                  f"{list(c.layers)} over {c.vocab_size} tokens; the target has size {H}, indices "
                                  f"1..{L} and {V} tokens")
        layers = tuple(c.layers)
        head.attach((embed or input_embedding(target)).to(target.device))  # the head's own embedding, else the target's
    return head.to(target.device, target.dtype).eval(), layers, name, folder
