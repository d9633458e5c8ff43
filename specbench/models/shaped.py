"""The `shaped_random` pair: random models with the layer shapes of a real pair, for GPU timing without a download.

Both models' embeddings and heads are set so that the next token follows a shared random bigram map f: a model
whose residual stream is dominated by its input token's embedding predicts f(x). One embedding scale per model,
calibrated at build time, sets how often that holds: the draft almost always, the target at `pair.acceptance` (α,
per position), so greedy vanilla with window γ accepts about α (1 - α^γ) / (1 - α) of its γ drafts per iteration
(0.39 of them at α = 0.7, γ = 5). The heads' EOS rows are zero: generations run to max_new_tokens. The tokenizer
has words t0 .. t{V-4} and <s>, </s>, <pad>; other words (a dataset's text) read as t0.
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, PreTrainedTokenizerFast, Qwen3Config

from specbench.common.options import OptionError
from specbench.models.pairs import BUILDERS, Pair, input_embedding, resolve_dtype, shared_vocab_size
from specbench.models.tiny import SPECIALS  # the last three ids

log = logging.getLogger(__name__)

CONFIGS = {"llama": LlamaConfig, "qwen3": Qwen3Config}
CHAIN_P = 0.7  # calibration text: x_{t+1} = f(x_t) with this probability, else a random id
CALIB_SHAPE = (4, 128)  # calibration sequences x positions
DRAFT_AGREEMENT, TOLERANCE, MAX_STEPS, MAX_DOUBLINGS = 0.99, 0.03, 20, 30


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Words t0 .. t{V-4} then <s>, </s>, <pad>: exactly vocab_size ids; an unknown word reads as t0."""
    words = [f"t{i}" for i in range(vocab_size - len(SPECIALS))] + SPECIALS
    tok = Tokenizer(models.WordLevel(vocab=dict(zip(words, range(vocab_size))), unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def successor(seed: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """f [V]: a random permutation of the regular ids [0, V-3), seeded and made on `device` (CPU and CUDA give different
    f for one seed); specials map to themselves (their head rows are zero, so nothing predicts them)."""
    regular = vocab_size - len(SPECIALS)
    g = torch.Generator(device=device).manual_seed(seed)
    perm = torch.randperm(regular, generator=g, device=device)
    return torch.cat([perm, torch.arange(regular, vocab_size, device=device)])


def chain(f: torch.Tensor, seed: int, shape: tuple[int, int] = CALIB_SHAPE, p: float = CHAIN_P) -> torch.Tensor:
    """Token ids [N, T] on f's device: x_0 random, x_{t+1} = f(x_t) with probability p else a random regular id."""
    regular = f.numel() - len(SPECIALS)
    g = torch.Generator(device=f.device).manual_seed(seed)
    n, length = shape
    x = torch.empty(n, length, dtype=torch.long, device=f.device)
    x[:, 0] = torch.randint(regular, (n,), generator=g, device=f.device)
    for t in range(length - 1):
        follow = torch.rand(n, generator=g, device=f.device) < p
        jump = torch.randint(regular, (n,), generator=g, device=f.device)
        x[:, t + 1] = torch.where(follow, f[x[:, t]], jump)
    return x


@torch.inference_mode()
def agreement(model: PreTrainedModel, ids: torch.Tensor, f: torch.Tensor) -> float:
    """Fraction of positions of ids [N, T] where the model's greedy next token is f(x_t)."""
    return (model(ids).logits.argmax(-1) == f[ids]).float().mean().item()


def _validate(cfg: dict) -> None:
    """OptionErrors naming the pair key: model types, acceptance in (0, 1), one vocab_size."""
    for role in ("target", "draft"):
        kind = cfg[role].get("model_type")
        if kind not in CONFIGS:
            raise OptionError(f"pair.{role}.model_type must be one of {', '.join(CONFIGS)}; got {kind!r}")
    a = cfg.get("acceptance")
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < 1:
        raise OptionError(f"pair.acceptance must be a number in (0, 1) (the target's greedy agreement with the "
                          f"draft's bigram map); got {a!r}")
    vt, vd = cfg["target"].get("vocab_size"), cfg["draft"].get("vocab_size")
    if vt != vd or not isinstance(vt, int) or vt <= len(SPECIALS):
        raise OptionError(f"pair.target.vocab_size and pair.draft.vocab_size must be one integer > {len(SPECIALS)} "
                          f"(the shared word tokenizer); got {vt!r} and {vd!r}")


def random_model(spec: dict, tok: PreTrainedTokenizerFast, seed: int, dtype: torch.dtype,
                 device: torch.device) -> PreTrainedModel:
    """A random causal LM of spec's shape, allocated directly on `device` in `dtype`, untied whatever the real model
    does (make_bigram sets the head to the embedding's rows permuted by f, so it must be a matrix of its own)."""
    fields = {k: v for k, v in spec.items() if k != "model_type"}
    config = CONFIGS[spec["model_type"]](**fields, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    finally:
        torch.set_default_dtype(old)
    shape = f"{config.hidden_size}x{config.num_hidden_layers}"
    model.name_or_path = f"shaped_random/{spec['model_type']}({shape}, seed={seed})"
    return model.eval()


@torch.no_grad()
def make_bigram(model: PreTrainedModel, f: torch.Tensor, seed: int) -> None:
    """Embedding E [V, H] := E0 ~ N(0, 1) (scale s = 1); head rows W[f(v)] = E0[v] / sqrt(H); special rows 0."""
    emb, head = input_embedding(model).weight, model.get_output_embeddings().weight
    v, h = emb.shape
    g = torch.Generator(device=emb.device).manual_seed(seed)
    emb.copy_(torch.randn(v, h, generator=g, device=emb.device, dtype=emb.dtype))
    # logits_u = W[u] . norm(h_L); with h_L ~ s E0[x], W[f(x)] . E0[x] / sqrt(H) ~ sqrt(H) beats the other rows'
    # N(0, 1), so argmax = f(x). The 1 / sqrt(H) keeps logits O(sqrt H) for any s (the argmax ignores it).
    head.index_copy_(0, f, emb / math.sqrt(h))
    head[v - len(SPECIALS):] = 0  # <s>, </s>, <pad>: logit 0 < the top regular logit, so never emitted greedily


@torch.no_grad()
def calibrate(model: PreTrainedModel, ids: torch.Tensor, f: torch.Tensor, goal: float | None) -> tuple[float, float]:
    """Scale E by s: goal None doubles s until agreement >= DRAFT_AGREEMENT, else bisects log s to agreement within
    TOLERANCE of goal (the closest kept). Returns (s, agreement on ids [N, T])."""
    # the last residual h_L = s E0[x] + d(context): the first layer reads RMSNorm(s E0[x]), which does not depend on
    # s, so d changes little with s while the s E0[x] term grows with it; agreement rises with s
    emb = input_embedding(model).weight
    state = {"s": 1.0}

    def at(s: float) -> float:  # set E = s E0 in place (multiply by s_new / s_old), then measure
        emb.mul_(s / state["s"])
        state["s"] = s
        return agreement(model, ids, f)

    a = at(1.0)
    if goal is None:
        while a < DRAFT_AGREEMENT and state["s"] < 2.0 ** MAX_DOUBLINGS:
            a = at(state["s"] * 2)
        if a >= DRAFT_AGREEMENT:
            return state["s"], a
        raise RuntimeError(f"{model.name_or_path}: agreement {a:.3f} < {DRAFT_AGREEMENT} at embedding scale "
                           f"{state['s']:g}; its head cannot follow the bigram map (vocabulary too large for its "
                           f"width?)")
    best = (abs(a - goal), 1.0, a)
    # log2 s bracket: agreement(2^lo) < goal <= agreement(2^hi), an end not yet known infinite
    lo, hi = (0.0, math.inf) if a < goal else (-math.inf, 0.0)
    for _ in range(MAX_STEPS):
        if abs(a - goal) <= TOLERANCE:
            break
        x = hi - 2 if math.isinf(lo) else lo + 2 if math.isinf(hi) else (lo + hi) / 2  # s / 4 or s * 4, then halves
        a = at(2.0 ** x)
        best = min(best, (abs(a - goal), state["s"], a))
        lo, hi = (x, hi) if a < goal else (lo, x)
    if best[0] > TOLERANCE:
        log.warning("%s: agreement %.3f is the closest to pair.acceptance=%.3f in %d steps", model.name_or_path,
                    best[2], goal, MAX_STEPS)
    return best[1], at(best[1]) if best[1] != state["s"] else a  # measured again where E was rescaled back


@BUILDERS.register("shaped_random")
def build_shaped_random(cfg: dict, device: torch.device) -> Pair:
    """Target and draft of cfg.target / cfg.draft's shapes (llama or qwen3), random, on `device` in cfg.dtype,
    with the target's greedy agreement with the draft's bigram map calibrated to cfg.acceptance."""
    _validate(cfg)
    seed, goal = int(cfg.get("seed", 0)), float(cfg["acceptance"])
    dtype = resolve_dtype(cfg.get("dtype", "auto"), device)
    tok = word_tokenizer(cfg["target"]["vocab_size"])
    f = successor(seed, len(tok), device)
    ids = chain(f, seed + 2)
    target = random_model(cfg["target"], tok, seed, dtype, device)
    make_bigram(target, f, seed)
    draft = random_model(cfg["draft"], tok, seed + 1, dtype, device)
    make_bigram(draft, f, seed + 1)
    d_scale, d_agree = calibrate(draft, ids, f, None)
    t_scale, t_agree = calibrate(target, ids, f, goal)
    target.config.shaped_agreement, draft.config.shaped_agreement = t_agree, d_agree
    target.config.shaped_embedding_scale, draft.config.shaped_embedding_scale = t_scale, d_scale
    log.info("shaped_random %s: target %s agrees with f at %.3f (pair.acceptance %.3f, embedding scale %.4g); "
             "draft %s at %.3f (scale %.4g)", cfg["name"], target.name_or_path, t_agree, goal, t_scale,
             draft.name_or_path, d_agree, d_scale)
    return Pair(cfg["name"], target, draft, tok, shared_vocab_size(tok, [target, draft]))


def shrink(cfg: dict, hidden: int = 64, layers: int = 2, vocab: int = 512) -> dict:
    """A copy of a shaped_random pair cfg with tiny dims (same model types) for quick CPU runs of the same code."""
    out: dict[str, Any] = copy.deepcopy(cfg)
    tiny = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2,
                head_dim=hidden // 4, vocab_size=vocab, max_position_embeddings=2048)
    for role, n in (("target", layers), ("draft", 1)):
        spec = out[role]
        # weights ~ N(0, r^2): a projection's outputs have std r sqrt(fan_in); r sqrt(H_full / hidden) keeps the full
        # model's (0.02 x 64 = 1.28 at H 4096), where the MLPs, not the context averages of attention, make most of
        # the layers' output: at r = 0.02 and hidden 64 attention dominates and greedy decoding falls into loops
        spec["initializer_range"] = spec.get("initializer_range", 0.02) * math.sqrt(spec["hidden_size"] / hidden)
        spec.update(tiny, num_hidden_layers=n)
    return out
