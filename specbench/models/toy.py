"""The `toy` pair: a target and a much smaller draft trained here on the toy arithmetic task, so that a laptop
without a GPU or hub access still runs a real speculative decoding benchmark.

First use trains a BPE tokenizer and both models on the CPU and saves them with `save_pretrained` into a folder
named by a hash of the training config (cache_root; the default config's pair ships in `toy_weights/<hash>/`);
they load through the same `from_pretrained` path as every hub pair.

Training text is exactly what the runner feeds and the models emit (encode_batch: the prompt tokenized as
specbench.data.prompting.encode does without a chat template, the answer on its own). Digits are always single
tokens, so numbers are spelled the same way wherever they occur.

Reproducibility: float sums depend on their order, and after a thousand AdamW steps a last-bit difference becomes
a different model. On the CPU that order is set by the number of intra-op threads and the instruction set of the
kernels (AVX-512 or AVX2 paths of ATen and MKL), so training runs in a child process with one thread and
PINNED_ENV: the same weights on any x86-64 CPU with AVX2, for any thread count of the caller (ARM trains
deterministically but differently). toy.json records the weights' sha256 (`weights_sha256`), and the loaded
models carry theirs as `model.config.weights_sha256`; tests/test_toy.py checks the shipped files against them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specbench.common.files import atomic_folder
from specbench.common.progress import library_progress, progress_bar, switch_progress
from specbench.models.pairs import BUILDERS, Pair, build_hub
from specbench.data.toy_task import Problem, answer_text, problems

log = logging.getLogger(__name__)

FORMAT = 2  # bump when the task, tokenizer or training code changes what a config produces
ENV_CACHE = "SPECBENCH_TOY_CACHE"
TRAINED_KEYS = ("seed", "tokenizer", "target", "draft", "train")  # the config keys the weights depend on
SHIPPED = Path(__file__).resolve().parent / "toy_weights"  # trained pairs shipped with the package, by config hash
# The training process's numerical environment, read by ATen and MKL when they start: one thread,
# AVX2 code paths (a CPU without AVX2 falls back to its own), MKL's reproducible AVX2 branch.
PINNED_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def config_hash(cfg: dict) -> str:
    """sha256 (first 12 hex digits) of the training-relevant config keys and FORMAT."""
    key = {"format": FORMAT, **{k: cfg.get(k) for k in TRAINED_KEYS}}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def cache_root(cfg: dict) -> Path:
    """The folder holding the trained toy pairs: cfg.cache_dir, $SPECBENCH_TOY_CACHE, or the user cache."""
    root = cfg.get("cache_dir") or os.environ.get(ENV_CACHE)
    if root:
        return Path(root).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("specbench")) / "toy"


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over each tensor's name, dtype, shape and bytes, in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def weights_sha256(folder: Path) -> dict[str, str]:
    """sha256 of a trained pair folder's target and draft tensors, its tokenizer, and of the three ("pair")."""
    out = {role: tensors_sha256(load_file(folder / role / "model.safetensors")) for role in ("target", "draft")}
    tokenizer = json.loads((folder / "target" / "tokenizer.json").read_text())["model"]  # vocabulary and merges
    out["tokenizer"] = hashlib.sha256(json.dumps(tokenizer, sort_keys=True).encode()).hexdigest()
    out["pair"] = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()
    return out


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
def deterministic() -> Iterator[None]:
    """torch.use_deterministic_algorithms and one intra-op thread, restored afterwards."""
    old_det, old_threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
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
    """Train the tokenizer, target and draft of `cfg` in this process and save them under `out`; returns the
    training record (toy.json). Reproducible across machines only under PINNED_ENV (train_isolated)."""
    seed, train, t0 = int(cfg.get("seed", 0)), dict(cfg["train"]), time.perf_counter()
    record: dict = {"config_hash": config_hash(cfg), "config": {k: cfg.get(k) for k in TRAINED_KEYS}, "format": FORMAT}
    with deterministic():
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
    record["weights_sha256"] = weights_sha256(out)
    record["numerics"] = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                          **{k: os.environ.get(k) for k in PINNED_ENV}}
    (out / "toy.json").write_text(json.dumps(record, indent=2))
    log.info("toy pair weights sha256 %s", record["weights_sha256"]["pair"])
    return record


def train_isolated(cfg: dict, out: Path) -> None:
    """train_pair(cfg, out) in a child Python process under PINNED_ENV (see the module docstring)."""
    package_root = str(Path(__file__).resolve().parents[2])  # the folder this specbench is imported from
    env = {**os.environ, **PINNED_ENV, "PYTHONPATH": os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    code = "import sys; from specbench.models.toy import main; main(sys.argv[1:])"
    args = [json.dumps(cfg, default=str), str(Path(out).resolve()), json.dumps(library_progress())]
    done = subprocess.run([sys.executable, "-c", code, *args], env=env)
    if done.returncode != 0:
        raise RuntimeError(f"training the toy pair into {out} failed in its child process (exit code "
                           f"{done.returncode}); its error is printed above")


def main(argv: list[str]) -> None:
    """The child process of train_isolated: argv = [config JSON, output folder, progress JSON]."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    switch_progress(json.loads(argv[2]))
    train_pair(json.loads(argv[0]), Path(argv[1]))


def ensure_trained(cfg: dict) -> Path:
    """The folder of `cfg`'s trained pair: the shipped one, else the cache's, training it first if absent."""
    shipped = SHIPPED / config_hash(cfg)
    if (shipped / "toy.json").exists():
        return shipped
    final = cache_root(cfg) / config_hash(cfg)
    if (final / "toy.json").exists():
        return final
    log.info("training the toy pair into %s (first use; later runs load it)", final)
    with atomic_folder(final) as tmp:  # another process's finished copy, if first, is kept
        train_isolated(cfg, tmp)
    if not (final / "toy.json").exists():
        raise RuntimeError(f"{final} holds no toy.json (an incomplete toy pair folder); delete it to train again")
    return final


@BUILDERS.register("toy")
def build_toy(cfg: dict, device: torch.device) -> Pair:
    """The trained toy pair of `cfg` (training it on first use), loaded with from_pretrained like a hub pair;
    each model's config.weights_sha256 is its recorded hash, checked against the files."""
    folder = ensure_trained(cfg)
    recorded = json.loads((folder / "toy.json").read_text())["weights_sha256"]
    if weights_sha256(folder) != recorded:
        raise RuntimeError(f"the toy pair in {folder} does not match the weights_sha256 of its toy.json "
                           f"(modified or corrupted files); delete a cached folder to train it again, or "
                           f"restore a shipped one from the repository")
    spec = {"dtype": cfg.get("dtype", "float32")}
    pair = build_hub({"name": cfg["name"], "target": {"path": str(folder / "target"), **spec},
                      "draft": {"path": str(folder / "draft"), **spec}}, device)
    for role in ("target", "draft"):
        pair.model(role).config.weights_sha256 = recorded[role]
    return pair
