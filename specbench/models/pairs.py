"""Model pairs: load a target and a draft (hub ids or local paths), check they share a vocabulary.

A pair config (conf/pair/*.yaml) has `name`, `builder` (`hub` or a registered builder such as `tiny_random`),
`target` and `draft` model specs (MODEL_KEYS; `params_b`: billions of parameters, for the GPU memory the pair needs)
and an optional `tokenizer` path.
"""

from __future__ import annotations

import gc
import json
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, cast

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specbench.common.errors import UserError
from specbench.common.options import OptionError
from specbench.common.registry import Registry
from specbench.common.hub import ModelUnavailable, check_hub_id, hub_source, pretrained, unavailable

if TYPE_CHECKING:
    from transformers.utils.quantization_config import QuantizationConfigMixin

log = logging.getLogger(__name__)

Builder = Callable[[dict[str, Any], torch.device], "Pair"]  # a pair config and the device -> the loaded pair
BUILDERS: Registry[Builder] = Registry("pair builder", plugins="specbench.models")
_LOADED: dict[str, "Pair"] = {}

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass
class Pair:
    """A loaded pair: target, optional draft, the target's tokenizer and its vocabulary range, and the draft's own
    tokenizer when it differs (a cross-tokenizer pair, for methods that re-tokenize: uag)."""

    name: str
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    vocab_size: int  # shared tokenizer range; logits beyond it (embedding padding) are ignored
    draft_tokenizer: PreTrainedTokenizerBase | None = None  # None: the draft shares `tokenizer`

    def same_tokenizer(self, role: str) -> bool:
        """Does the model playing `role` read and write the ids of `tokenizer`?"""
        return role == "target" or self.draft_tokenizer is None

    def model(self, role: str) -> PreTrainedModel:
        """The model playing `role` ('target' or 'draft')."""
        m = self.target if role == "target" else self.draft
        if m is None:
            raise OptionError(f"pair {self.name!r} has no {role} model: it runs only methods that use the target "
                             f"alone (method=ar); pick a pair with a draft for speculative methods")
        return m

    def eos_ids(self, models: list[PreTrainedModel]) -> set[int]:
        """Ids that end a generation: the tokenizer's EOS and each model's generation-config EOS ids."""
        ids = {self.tokenizer.eos_token_id}
        for m in models:
            e = m.generation_config.eos_token_id if m.generation_config is not None else None
            ids |= set(e if isinstance(e, list) else [e])
        return ids - {None}

    def pad_id(self, models: list[PreTrainedModel]) -> int:
        """The id to pad batches with: the tokenizer's pad id, else the smallest of eos_ids(models)."""
        if self.tokenizer.pad_token_id is not None:
            return self.tokenizer.pad_token_id
        eos = self.eos_ids(models)
        if not eos:
            raise ValueError(f"pair {self.name!r}: its tokenizer has neither a pad token nor an EOS id to pad with")
        return min(eos)

    def context_length(self, models: list[PreTrainedModel]) -> int | None:
        """The smallest max_position_embeddings among `models` (None if none declares one)."""
        lens = [getattr(m.config.get_text_config(), "max_position_embeddings", None) for m in models]
        return min((n for n in lens if n), default=None)


def input_embedding(model: PreTrainedModel) -> nn.Embedding:
    """The model's input token embedding (typed by transformers as any nn.Module; an nn.Embedding in causal LMs)."""
    return cast(nn.Embedding, model.get_input_embeddings())


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda if available else cpu; anything else is passed to torch.device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 on CUDA, float32 on CPU."""
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise OptionError(f"pair.target.dtype / pair.draft.dtype: unknown dtype {dtype!r}; "
                          f"valid: auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


MODEL_KEYS = {"path", "revision", "dtype", "device_map", "max_memory", "offload_folder", "attn_implementation",
              "quantization", "trust_remote_code", "tokenizer", "params_b"}
PLACEMENT = ("attn_implementation", "device_map", "max_memory", "offload_folder")  # from_pretrained's, as given


def _quantization_config(quant: dict | None) -> QuantizationConfigMixin | None:
    """Weight quantization from the pair config: `{bits: 8|4}` with bitsandbytes (default), or
    `{bits: 8|4, backend: quanto}` (optimum-quanto, as the GammaTune paper used for its 70B target)."""
    if not quant:
        return None
    q = dict(quant)
    bits = q.pop("bits", None)
    backend = q.pop("backend", "bitsandbytes")
    if backend not in ("bitsandbytes", "quanto"):
        raise OptionError(f"pair.<target|draft>.quantization.backend must be bitsandbytes or quanto, got {backend!r}")
    if bits not in (4, 8):
        raise OptionError(f"pair.<target|draft>.quantization.bits must be 4 or 8, got {bits!r}")
    if backend == "quanto":
        from transformers import QuantoConfig

        return QuantoConfig(weights=f"int{bits}", **q)
    from transformers import BitsAndBytesConfig

    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True, **q)
    compute = q.pop("compute_dtype", "bfloat16")
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=_DTYPES[compute], **q)


ONE_GPU_GB = 80.0  # the largest common single GPU (A100 / H100 80 GB): weights beyond it need several GPUs


def bytes_per_param(spec: dict) -> tuple[float, str]:
    """Bytes per weight on a GPU and their kind: the quantization's bits / 8, else the dtype's (auto = bfloat16)."""
    bits = (spec.get("quantization") or {}).get("bits")
    if bits:
        return bits / 8, f"int{bits}"
    dtype = resolve_dtype(spec.get("dtype"), torch.device("cuda"))
    return dtype.itemsize, str(dtype).removeprefix("torch.")


def model_needs(role: str, spec: dict) -> tuple[str, float]:
    """One line on what a model needs on GPUs, and its weights in GB: params_b x 1e9 x bytes_per_param."""
    if not spec.get("params_b"):
        return f"  {role} {spec['path']}: size not recorded (params_b in the pair config)", 0.0
    per, kind = bytes_per_param(spec)
    gb = spec["params_b"] * per  # 1e9 parameters x bytes each = GB
    line = f"  {role} {spec['path']}: {spec['params_b']:g} B parameters x {per:g} bytes ({kind}) = {gb:.1f} GB"
    if gb <= ONE_GPU_GB:
        return line + " (fits one GPU)", gb
    spread = "set" if spec.get("device_map") == "auto" else f"add pair.{role}.device_map=auto"
    return line + f": more than one {ONE_GPU_GB:.0f} GB GPU holds, so device_map: auto over several GPUs ({spread})", gb


def pair_needs(cfg: dict) -> str:
    """What the pair needs: each model's weights at its dtype on GPUs, and whether device_map: auto is required."""
    needs = [model_needs(role, cfg[role]) for role in ("target", "draft") if cfg.get(role)]
    lines = [f"Pair {cfg['name']!r} needs on GPUs (weights alone; the KV cache and activations come on top):"]
    lines += [line for line, _ in needs] + [f"  together: {sum(gb for _, gb in needs):.1f} GB"]
    return "\n".join(lines)


HEADROOM = 1.2  # the KV cache and activations on top of the weights, as a fraction of them (a rule of thumb)


def weights_gb(cfg: dict) -> float | None:
    """The pair's weights in GB at their dtypes (model_needs), None when no model records params_b (toy pairs)."""
    specs = [cfg[role] for role in ("target", "draft") if cfg.get(role)]
    if not any(spec.get("params_b") for spec in specs):
        return None
    return sum(model_needs(role, spec)[1] for role, spec in zip(("target", "draft"), specs))


def gpus_needed(cfg: dict) -> int | None:
    """GPUs of ONE_GPU_GB a job of the pair asks for: ceil(weights_gb x HEADROOM / ONE_GPU_GB), at least 1; None for
    a pair of unrecorded size (the toy and random pairs, which run on a CPU)."""
    gb = weights_gb(cfg)
    return None if gb is None else max(1, math.ceil(gb * HEADROOM / ONE_GPU_GB))


def pair_files(cfg: dict) -> dict[str, tuple[str, str | None]]:
    """(path, revision) of what a hub pair loads: tokenizer, target, and with a draft draft_tokenizer and draft."""
    t_spec, d_spec = cfg["target"], cfg.get("draft")
    files = {"tokenizer": (cfg.get("tokenizer") or t_spec["path"], t_spec.get("revision")),
             "target": (t_spec["path"], t_spec.get("revision"))}
    if d_spec:
        files |= {"draft_tokenizer": (d_spec.get("tokenizer") or d_spec["path"], d_spec.get("revision")),
                  "draft": (d_spec["path"], d_spec.get("revision"))}
    return files


def check_pair_sources(cfg: dict) -> dict[tuple[str, str | None], str]:
    """hub_source of every model and tokenizer of a hub pair (pair_files), before anything is loaded; one error
    names all that are missing, with what the pair needs."""
    sources, problems, missing = {}, [], []
    for key in dict.fromkeys(pair_files(cfg).values()):  # distinct, in order
        check_hub_id(key[0])
        try:
            sources[key] = hub_source(*key)
        except ModelUnavailable as err:
            problems.append(f"  - {err}")
            missing.append(key)
    if problems:
        head = f"pair {cfg['name']!r}: {len(missing)} of its models cannot be loaded here:"
        raise unavailable([head, *problems], missing, pair_needs(cfg))
    return sources


def load_model(spec: dict, device: torch.device, source: str | None = None) -> PreTrainedModel:
    """One causal LM from a model spec, in eval mode, on `device` unless spec.device_map is set; `source` as
    hub_source answers it (asked here when None)."""
    unknown = set(spec) - MODEL_KEYS
    if unknown:
        raise OptionError(f"unknown model keys {sorted(unknown)} for {spec.get('path')!r}; valid: {sorted(MODEL_KEYS)}")
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(spec.get("dtype"), device),
                              **{k: spec[k] for k in PLACEMENT if spec.get(k)}}
    if spec.get("trust_remote_code"):
        kwargs["trust_remote_code"] = True
    qc = _quantization_config(spec.get("quantization"))
    if qc is not None:
        kwargs["quantization_config"] = qc
    model = pretrained(AutoModelForCausalLM.from_pretrained, spec["path"], spec.get("revision"), source, **kwargs)
    if "device_map" not in kwargs and qc is None:
        model.to(device)
    return model.eval()


def load_tokenizer(path: str, revision: str | None = None, source: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer at a hub id or local path (`source` as in load_model)."""
    return pretrained(AutoTokenizer.from_pretrained, path, revision, source)


class VocabularyMismatch(UserError, ValueError):
    """Target and draft tokenizers differ in a pair not marked cross_tokenizer; the message names both models."""


def check_vocab(target_name: str, tok_t: PreTrainedTokenizerBase, draft_name: str,
                tok_d: PreTrainedTokenizerBase) -> None:
    """Raise unless target and draft tokenizers map the same strings to the same ids."""
    if tok_t.get_vocab() != tok_d.get_vocab():
        raise VocabularyMismatch(f"target {target_name!r} (vocabulary {len(tok_t)}) and draft {draft_name!r} "
                                 f"(vocabulary {len(tok_d)}) do not share a tokenizer vocabulary; speculative "
                                 "decoding here needs one vocabulary, except method=uag (and hf_assisted), which "
                                 "re-tokenize the drafts: for them, mark the pair config with cross_tokenizer: true "
                                 "(pair.cross_tokenizer=true); other methods need a draft of the target's tokenizer")


def check_cross_tokenizer(cfg: dict, method_name: str, uses_pair_draft: bool, cross_ok: bool) -> None:
    """Before loading: a pair marked cross_tokenizer runs its draft only in methods that re-tokenize."""
    if cfg.get("cross_tokenizer") and uses_pair_draft and not cross_ok:
        raise OptionError(f"pair {cfg['name']!r} has cross_tokenizer: true (its draft has another tokenizer than its "
                          f"target), and method {method_name!r} needs one vocabulary; run it with method=uag "
                          "(re-tokenized drafts), hf_assisted (transformers' universal assisted generation), or a "
                          "method that needs no draft model (ar, pld, layer_skip)")


def shared_vocab_size(tokenizer: PreTrainedTokenizerBase, models: list[PreTrainedModel]) -> int:
    """len(tokenizer), checked against each model's output size (which may be padded larger)."""
    v = len(tokenizer)
    for m in models:
        out = m.get_output_embeddings().weight.shape[0]
        if out < v:
            raise ValueError(f"model {m.name_or_path!r} has {out} output logits but the tokenizer has {v} tokens")
    return v


@BUILDERS.register("hub")
def build_hub(cfg: dict, device: torch.device) -> Pair:
    """Load target and draft from hub ids or local paths, once each is known to be loadable."""
    t_spec, d_spec = cfg["target"], cfg.get("draft")
    files, sources = pair_files(cfg), check_pair_sources(cfg)
    tok = load_tokenizer(*files["tokenizer"], sources[files["tokenizer"]])
    d_tok = None
    if d_spec:
        d_tok = load_tokenizer(*files["draft_tokenizer"], sources[files["draft_tokenizer"]])
        if not cfg.get("cross_tokenizer"):
            check_vocab(t_spec["path"], tok, d_spec["path"], d_tok)
            d_tok = None
        elif tok.get_vocab() == d_tok.get_vocab():
            d_tok = None  # marked cross, yet one vocabulary: every method runs on it
    target = load_model(t_spec, device, sources[files["target"]])
    draft = load_model(d_spec, device, sources[files["draft"]]) if d_spec else None
    models = [target] + ([draft] if draft is not None and d_tok is None else [])  # those of the target's ids
    return Pair(cfg["name"], target, draft, tok, shared_vocab_size(tok, models), d_tok)


def load_pair(cfg: dict, device: torch.device) -> Pair:
    """The pair for `cfg`, reusing the one this process loaded last if the config is the same."""
    key = json.dumps({"cfg": cfg, "device": str(device)}, sort_keys=True, default=str)
    if key in _LOADED:
        log.info("reusing loaded pair %s", cfg["name"])
        return _LOADED[key]
    free_pairs()
    builder = BUILDERS.get(cfg.get("builder", "hub"))
    log.info("loading pair %s", cfg["name"])
    _LOADED[key] = builder(cfg, device)
    return _LOADED[key]


def free_pairs() -> None:
    """Drop every cached pair and release its memory."""
    _LOADED.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
