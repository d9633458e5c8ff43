"""The `toy` pair: a target and a much smaller draft trained here, on the toy arithmetic task.

So that a laptop without a GPU or hub access still runs a real speculative decoding benchmark.
First use trains (a BPE tokenizer, then both models, on CPU, deterministic for the seed) and
saves them with `save_pretrained` into a cache folder named by a hash of the training config;
later uses load them through the same `from_pretrained` path as every hub pair.

Cache folder: `pair.cache_dir`, else `$SPECBENCH_TOY_CACHE`, else `<user cache dir>/specbench/toy`
(platformdirs; `~/.cache/specbench/toy` on Linux); inside it, one folder per config hash holding
`target/` and `draft/` (each with the tokenizer) and `toy.json` (config, losses, seconds). Models
are trained into a temporary folder next to it and renamed into place only when complete.

Training text: exactly what the runner feeds and the models emit. The prompt is the question,
encoded as `specbench.data.prompting.encode` does for a tokenizer without a chat template,
`tokenizer(question)` = [<s>] + ids(question); the answer is `ids("\\n" + solution) + [</s>]`,
tokenized on its own. The loss is the next-token cross-entropy on the answer tokens only.
Digits are always single tokens, so numbers are spelled the same way wherever they occur.
Training always runs on the CPU with `train.threads` threads (1 by default: weights are then
bitwise reproducible on one machine, and a shared CPU does not stall OpenMP's spinning threads).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specbench.common.files import atomic_folder
from specbench.common.progress import library_progress, progress_bar
from specbench.models.pairs import BUILDERS, Pair, build_hub
from specbench.data.toy_task import Problem, answer_text, problems

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the task, tokenizer or training code changes what a config produces
ENV_CACHE = "SPECBENCH_TOY_CACHE"
TRAINED_KEYS = ("seed", "tokenizer", "target", "draft", "train")  # the config keys the weights depend on


def config_hash(cfg: dict) -> str:
    """sha256 (first 12 hex digits) of the training-relevant config keys and FORMAT."""
    key = {"format": FORMAT, **{k: cfg.get(k) for k in TRAINED_KEYS}}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def cache_root(cfg: dict) -> Path:
    """The folder holding the trained toy pairs: cfg.cache_dir, $SPECBENCH_TOY_CACHE, or the user cache."""
    if cfg.get("cache_dir"):
        return Path(cfg["cache_dir"]).expanduser()
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("specbench")) / "toy"


def train_tokenizer(seed: int, vocab_size: int, n_problems: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on n training problems; digits split; <s> prepended to every encoding."""
    texts = [p.question + answer_text(p) for p in problems(seed, "train").take(n_problems)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    bos = ("<s>", tok.token_to_id("<s>"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[bos])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def encode_batch(tok: PreTrainedTokenizerFast, batch: list[Problem]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask, labels [B, T]: [<s> question][answer </s>], right-padded; labels on the answer."""
    prompts = tok([p.question for p in batch])["input_ids"]
    answers = tok([answer_text(p) for p in batch], add_special_tokens=False)["input_ids"]
    T = max(len(q) + len(a) + 1 for q, a in zip(prompts, answers))
    ids = torch.full((len(batch), T), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((len(batch), T), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.long)
    for i, (q, a) in enumerate(zip(prompts, answers)):
        seq = q + a + [tok.eos_token_id]
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(q) : len(seq)] = torch.tensor(a + [tok.eos_token_id])
        mask[i, : len(seq)] = 1
    return ids, mask, labels


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up to lr over `warmup` steps, then cosine decay to lr/10 at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@contextmanager
def deterministic(threads: int) -> Iterator[None]:
    """torch.use_deterministic_algorithms and a fixed thread count, restored afterwards."""
    old_det, old_threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old_det)
        torch.set_num_threads(old_threads)


def train_model(role: str, arch: dict, tok: PreTrainedTokenizerFast, train: dict, seed: int
                ) -> tuple[LlamaForCausalLM, list[float]]:
    """A LlamaForCausalLM from `arch`, trained with AdamW on the problem stream of `seed`; also its step losses."""
    steps, bs = int(train["steps"][role]), int(train["batch_size"])
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=True, **arch)
    model = LlamaForCausalLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=float(train["lr"]), betas=(0.9, 0.98),
                            weight_decay=float(train["weight_decay"]))
    stream, losses = problems(seed, "train"), []
    bar = progress_bar(range(steps), library_progress(), desc=f"training toy {role}", unit="step")
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, float(train["lr"]), int(train["warmup_steps"]))
        ids, mask, labels = encode_batch(tok, stream.take(bs))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    return model.eval(), losses


def train_pair(cfg: dict, out: Path) -> dict:
    """Train the tokenizer, target and draft of `cfg` and save them under `out`; returns the training record."""
    seed, train, t0 = int(cfg.get("seed", 0)), dict(cfg["train"]), time.perf_counter()
    record: dict = {"config_hash": config_hash(cfg), "config": {k: cfg.get(k) for k in TRAINED_KEYS}, "format": FORMAT}
    with deterministic(int(train.get("threads", 1))):
        tok = train_tokenizer(seed, int(cfg["tokenizer"]["vocab_size"]), int(cfg["tokenizer"]["train_problems"]))
        for role in ("target", "draft"):
            t1 = time.perf_counter()
            model, losses = train_model(role, dict(cfg[role]), tok, train, seed)
            model.save_pretrained(out / role)
            tok.save_pretrained(out / role)
            n = sum(p.numel() for p in model.parameters())
            record[role] = {"parameters": n, "steps": len(losses), "seconds": time.perf_counter() - t1,
                            "final_loss": sum(losses[-20:]) / len(losses[-20:])}
            log.info("toy %s: %.2fM parameters, %d steps in %.0f s, final loss %.3f", role, n / 1e6,
                     len(losses), record[role]["seconds"], record[role]["final_loss"])
    record["seconds"] = time.perf_counter() - t0
    (out / "toy.json").write_text(json.dumps(record, indent=2))
    return record


def ensure_trained(cfg: dict) -> Path:
    """The cache folder of `cfg`'s trained pair, training it first (into a temp folder, then renamed) if absent."""
    root = cache_root(cfg)
    final = root / config_hash(cfg)
    if (final / "toy.json").exists():
        return final
    log.info("training the toy pair into %s (first use; later runs load it)", final)
    with atomic_folder(final) as tmp:  # another process's finished copy, if first, is kept
        train_pair(cfg, tmp)
    if not (final / "toy.json").exists():
        raise RuntimeError(f"{final} holds no toy.json (an incomplete toy pair folder); delete it to train again")
    return final


@BUILDERS.register("toy")
def build_toy(cfg: dict, device: torch.device) -> Pair:
    """The trained toy pair of `cfg` (training it on first use), loaded with from_pretrained like a hub pair."""
    folder = ensure_trained(cfg)
    spec = {"dtype": cfg.get("dtype", "float32")}
    return build_hub({"name": cfg["name"], "target": {"path": str(folder / "target"), **spec},
                      "draft": {"path": str(folder / "draft"), **spec}}, device)
