"""What the bench subcommands share: pairs and prompts, our engines and transformers' assisted generation, and
Leviathan et al.'s expected speedup."""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from typing import Iterator, cast

import torch
from transformers import GenerationMixin, PreTrainedModel

from specbench.common.configs import compose_config, plain
from specbench.data.dataset import Example, build_dataset
from specbench.data.prompting import encode
from specbench.decoding.decoders import Decoder
from specbench.common.near_ties import first_difference, near_tie_limit
from specbench.bench.profile import forward_seconds
from specbench.decoding.state import sync
from specbench.models.pairs import Pair, load_pair
from specbench.runs.binding import build_method, make_engine
from specbench.runs.validation import sampling_params


def load_cfg(name: str) -> dict:
    """The resolved config conf/pair/<name>.yaml, composed through Hydra as the runner does."""
    return plain(compose_config([f"pair={name}"]).pair)


def load(name: str, device: torch.device) -> Pair:
    """The pair conf/pair/<name>.yaml on `device`."""
    return load_pair(load_cfg(name), device)


def smoke_prompts(pair: Pair, n: int) -> list[list[int]]:
    """Token ids of the first n smoke prompts."""
    return dataset_prompts(pair, "smoke", n)

def dataset_prompts(pair: Pair, dataset: str, n: int) -> list[list[int]]:
    """Token ids of the first n prompts of conf/dataset/<dataset>.yaml."""
    cfg = compose_config([f"dataset={dataset}"])
    examples: list[Example] = build_dataset(plain(cfg.dataset)).examples()[:n]
    return [encode(pair.tokenizer, ex) for ex in examples]

@contextmanager
def assistant_settings(draft: PreTrainedModel, gamma: int) -> Iterator[None]:
    """Constant schedule of γ drafts, confidence stop off (0 disables both the stop and the ROC update)."""
    gc = draft.generation_config
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {k: getattr(gc, k) for k in keys}
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = gamma, "constant"
    gc.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(gc, k, v)

@torch.inference_mode()
def run_theirs(pair: Pair, ids: list[int], max_new: int, assisted: bool = True, static: bool = False
               ) -> tuple[list[int], float, list[int]]:
    """transformers' greedy assisted (or plain greedy) generation: new ids, wall seconds, [target, draft] calls. With
    `static` its compiled generation: a static cache, whose forward transformers compiles itself on a GPU (its
    auto-compile criteria; on a CPU it runs the static cache eagerly)."""
    device = pair.target.device
    x = torch.tensor([ids], dtype=torch.long, device=device)
    calls = [0, 0]
    hooks = [m.register_forward_pre_hook(lambda *_, k=k: calls.__setitem__(k, calls[k] + 1))
             for k, m in enumerate((pair.target, pair.model("draft")))]
    try:
        sync(device)
        t0 = time.perf_counter()
        # every causal LM a pair loads (AutoModelForCausalLM) is a GenerationMixin; PreTrainedModel's type does not say
        out = cast(GenerationMixin, pair.target).generate(
            x, attention_mask=torch.ones_like(x), assistant_model=pair.draft if assisted else None, do_sample=False,
            max_new_tokens=max_new, pad_token_id=pair.tokenizer.pad_token_id,
            **({"cache_implementation": "static"} if static else {}))
        sync(device)
        seconds = time.perf_counter() - t0
    finally:
        for h in hooks:
            h.remove()
    return out[0, len(ids):].tolist(), seconds, calls

def call_ms(model: PreTrainedModel, prompt: list[int], width: int, compile: bool = False, steps: int = 15) -> float:
    """Median ms of one forward of `width` new tokens after a cached prompt (profile.forward_seconds, one row)."""
    return 1e3 * forward_seconds(model, prompt, width, 1, compile, steps)

def mismatch(i: int, ours: list[int], theirs: list[int], why: str = "") -> str:
    """A one-paragraph report of where two token sequences first differ (and `why`: its class)."""
    k = first_difference(ours, theirs)
    return (f"MISMATCH prompt {i}: ours {len(ours)} tokens, transformers {len(theirs)}; first difference at "
            f"position {k}: ours {ours[k:k + 5]} vs transformers {theirs[k:k + 5]} "
            f"(after {ours[max(0, k - 5):k]})" + (f"; {why}" if why else ""))


@torch.no_grad()
def divergence_class(target: PreTrainedModel, prompt: list[int], ours: list[int], theirs: list[int],
                     limit: float | None = None) -> str:
    """Why two greedy generations of one target part, by its top-2 logit margin where they first differ, from one
    cache-free forward of the prompt and their common prefix: 'near-tie' when the margin is below `limit`
    (near_ties.NEAR_TIE of the target's dtype) and both tokens are its top two, else 'suspect' (so are equal tokens
    of other lengths: a stop handled otherwise)."""
    k = first_difference(ours, theirs)
    if k >= min(len(ours), len(theirs)):
        return "suspect: the same tokens, another length"
    x = torch.tensor([prompt + ours[:k]], device=target.device)
    z = target(input_ids=x).logits[0, -1, : target.config.get_text_config().vocab_size].float()
    top = z.topk(2)
    margin = float(top.values[0] - top.values[1])
    limit = near_tie_limit(target.dtype) if limit is None else limit
    tie = margin < limit and {ours[k], theirs[k]} <= set(top.indices.tolist())
    return f"{'near-tie' if tie else 'suspect'}: the target's top-2 margin there {margin:.4f} (near-tie below {limit})"

def engines(pair: Pair, gamma: int, max_new: int, paths: tuple[str, ...]) -> dict[str, Decoder]:
    """Our engines by label ("vanilla eager", ...): vanilla (γ, rejection: argmax acceptance at temperature 0) and ar
    on each path of `paths` (eager, compiled)."""
    params = sampling_params({"temperature": 0.0, "max_new_tokens": max_new})
    out = {}
    for path in paths:
        for name, cfg in (("vanilla", {"name": "vanilla", "gamma": gamma, "parts": {"rule": "rejection"}}), ("ar", {"name": "ar"})):
            out[f"{name} {path}"] = make_engine(pair, build_method(cfg), params, (), path == "compiled")
    return out

def leviathan(alpha: float, gamma: int, c: float) -> float:
    """Expected speedup of speculative decoding over ar (Leviathan et al. 2023, Theorem 3.8) with acceptance rate
    alpha, γ drafts and cost ratio c = draft forward / target forward: (1 - α^(γ+1)) / ((1 - α)(γc + 1))."""
    tau = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tau / (gamma * c + 1)

def batch_sizes(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique); argparse's error for anything but integers >= 1."""
    try:
        sizes = sorted({int(x) for x in text.split(",")})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers >= 1, e.g. 1,2,4,8")
    return sizes
