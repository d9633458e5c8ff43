"""The `tiny_random` pair, for tests and smoke runs without any download: small random Llama models with fixed seeds
and a byte-level tokenizer. The draft is the target's first layers (same embeddings and head), so the two
distributions are related and acceptance is neither 0 nor 1. The two models' embedding matrices are padded to
different sizes beyond the tokenizer's 259 tokens, to exercise comparison over the shared tokenizer range.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specbench.models.pairs import BUILDERS, Pair, resolve_dtype, shared_vocab_size

SPECIALS = ["<s>", "</s>", "<pad>"]

# merges of the cross-tokenizer test draft's tokenizer (byte-level symbols; Ġ is the space)
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"), ("r", "e"),
          ("Ġ", "a"), ("e", "d"), ("n", "d"), ("Ġ", "s"), ("o", "u"), ("Ġ", "c"), ("in", "g"), ("Ġ", "w"),
          ("a", "t"), ("e", "n"), ("i", "s"), ("Ġ", "o"), ("l", "l"), ("Ġ", "h"), ("o", "r"), ("e", "s")]


def byte_tokenizer(permuted: bool = False, merges: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: 256 byte tokens then <s>, </s>, <pad> (259 ids). permuted: the same tokens with other
    ids (the specials first, the bytes reversed) and the first `merges` of MERGES, for a draft of another vocabulary."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    order = SPECIALS[::-1] + alphabet[::-1] if permuted else alphabet + SPECIALS
    vocab = {ch: i for i, ch in enumerate(order)}
    for a, b in MERGES[:merges]:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES[:merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def tiny_llama(seed: int, **config) -> LlamaForCausalLM:
    """A random LlamaForCausalLM from `config` keyword arguments, initialised under `seed`."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{"tie_word_embeddings": False, **config})
    return LlamaForCausalLM(cfg).eval()


def draft_from_target(target: LlamaForCausalLM, layers: int, vocab_size: int, seed: int) -> LlamaForCausalLM:
    """A draft made of the target's first `layers` layers, its final norm and head (rows padded)."""
    cfg = target.config.to_dict()
    cfg.update(num_hidden_layers=layers, vocab_size=vocab_size)
    for k in ("architectures", "model_type", "transformers_version", "layer_types", "dtype"):
        cfg.pop(k, None)
    draft = tiny_llama(seed, **cfg)
    src = target.state_dict()
    with torch.no_grad():
        for name, t in draft.state_dict().items():
            if name in src:
                s = src[name]
                t[: s.shape[0]].copy_(s[: t.shape[0]])  # embeddings/head: copy the shared rows
    return draft


def damp_upper_layers(model: LlamaForCausalLM, first: int, scale: float) -> None:
    """Scale the residual-branch outputs (o_proj, down_proj) of layers >= first by `scale`: the target is then its
    first layers plus a damped correction, which a draft of those layers misses now and then (acceptance by scale)."""
    with torch.no_grad():
        for layer in model.model.layers[first:]:
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)


@BUILDERS.register("tiny_random")
def build_tiny_random(cfg: dict, device: torch.device) -> Pair:
    """Target from cfg.target (LlamaConfig fields), draft = its first cfg.draft.num_hidden_layers layers; both
    built in float32 and run in cfg.dtype (float32 when absent; `+pair.dtype=bfloat16` for GPU figures)."""
    tok = byte_tokenizer()
    seed = int(cfg.get("seed", 0))
    d_cfg = dict(cfg["draft"]) if cfg.get("draft") else None  # pair.draft=null: the target alone
    common = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    target = tiny_llama(seed, **common, **cfg["target"])
    # 2 damped layers when there is no draft: the same target either way
    damp_upper_layers(target, (d_cfg or {}).get("num_hidden_layers", 2), float(cfg.get("upper_layer_scale", 1.0)))
    dtype = resolve_dtype(cfg.get("dtype", "float32"), device)
    # the ignores: transformers' PreTrainedModel.to, wrapped by functools.wraps(nn.Module.to), takes `self` untyped
    target = target.to(device)  # type: ignore[arg-type]
    draft = None if d_cfg is None else draft_from_target(target, d_cfg["num_hidden_layers"], d_cfg["vocab_size"],
                                                         seed + 1).to(device, dtype)  # type: ignore[arg-type]
    target = target.to(dtype)
    target.name_or_path = f"tiny_random/target(seed={seed})"
    if draft is not None:
        draft.name_or_path = f"tiny_random/draft(seed={seed})"
    return Pair(cfg["name"], target, draft, tok, shared_vocab_size(tok, [m for m in (target, draft) if m is not None]))


@BUILDERS.register("tiny_cross")
def build_tiny_cross(cfg: dict, device: torch.device) -> Pair:
    """tiny_random's target, and its draft with another tokenizer (byte_tokenizer(permuted=True, cfg.draft.merges)):
    the embedding and head rows moved to the permuted ids, so with merges 0 it computes tiny_random's draft
    distribution in another vocabulary; merged tokens keep random rows."""
    pair = build_tiny_random(cfg, torch.device("cpu"))
    merges = int(cfg["draft"].get("merges", 0))
    d_tok = byte_tokenizer(permuted=True, merges=merges)
    perm = torch.tensor([d_tok.convert_tokens_to_ids(t) for t in pair.tokenizer.convert_ids_to_tokens(
        list(range(len(pair.tokenizer))))])  # target id -> draft id of the same token
    assert pair.draft is not None, "tiny_cross needs pair.draft (the draft's shape)"
    draft = pair.draft.float()
    with torch.no_grad():
        for w in (draft.get_input_embeddings().weight, draft.get_output_embeddings().weight):
            w[perm] = w[: len(perm)].clone()
    dtype = resolve_dtype(cfg.get("dtype", "float32"), device)
    draft.name_or_path = f"tiny_cross/draft(seed={cfg.get('seed', 0)}, merges={merges})"
    target = pair.target.to(device, dtype)  # type: ignore[arg-type]  # transformers' wrapped .to, as above
    return Pair(cfg["name"], target, draft.to(device, dtype), pair.tokenizer, pair.vocab_size, d_tok)
