"""What distill's trainers read from the frozen target: its hidden states at named layers and its final hidden state,
from which π_V's logits are lm_head(final) (checked against the model's own logits before training).

    task.features: <folder>   the target runs once over the data; its states are stored and memory-mapped, and the
                              target is released before training (EAGLE's and speculators' offline hidden states)
    task.features: null       the target runs on every batch (Live)

A cache folder holds shard-NNNNN.safetensors files (rows of the sequences, each row's states [len, S + 1, H] in the
target's dtype, S named layers then the final state; "offsets" [rows + 1] into them) and meta.json, written last:
its presence marks a complete cache. Its key (the layers, the sequences' sha256) names a subfolder, so other data or
layers get a cache of their own, except that a complete cache of the same sequences whose layers include the run's
serves it (a drafter's run reuses an EAGLE-3 head's cache); a cache from another target (its weights hash) is
refused. Shard k is written by process k mod N; each is written atomically, so a killed write keeps its finished
shards and a rerun writes the rest. safetensors rather than numpy.memmap: bfloat16, and a documented file format.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from accelerate import Accelerator
from transformers import PreTrainedModel

from specbench.common.errors import InputError
from specbench.common.files import atomic_path, write_json_atomic
from specbench.common.progress import progress_bar
from specbench.models.drafters import verifier_identity
from specbench.models.pairs import Pair
from specbench.models.toy import tensors_sha256

log = logging.getLogger(__name__)

META, SHARD_ROWS = "meta.json", 64
Seqs = list[tuple[list[int], int]]  # (token ids, prompt length) per row


@dataclass(frozen=True)
class TargetOut:
    """The target on a batch: states [B, T, S, H] at the named layers (in order), final [B, T, H] (after its norm)."""

    states: torch.Tensor
    final: torch.Tensor


def make_batch(seqs: Seqs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T], attention mask [B, T], loss mask [B, T] (positions P-1 .. len-2), P [B]."""
    T = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    loss = torch.zeros((len(seqs), T), dtype=torch.bool)
    for i, (s, P) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        loss[i, P - 1 : len(s) - 1] = True
    return ids, mask, loss, torch.tensor([P for _, P in seqs])


class Features(Protocol):
    """The target's features of a batch: ids, attention mask [B, T] and the rows' indices [B] in the data."""

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> TargetOut: ...
    def logits(self, final: torch.Tensor) -> torch.Tensor: ...  # [..., H] -> [..., vocab]


class Head:
    """π_V's logits from final states: lm_head(final) over the shared vocabulary range (the target's weight)."""

    def __init__(self, target: PreTrainedModel, vocab: int) -> None:
        self.weight = target.get_output_embeddings().weight.detach()[:vocab]

    def logits(self, final: torch.Tensor) -> torch.Tensor:
        return F.linear(final.to(self.weight.dtype), self.weight)


def forward(target: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, layers: tuple[int, ...]) -> TargetOut:
    """One no-grad forward: hidden_states at `layers` and the last one; logits of the last position only."""
    with torch.no_grad():
        out = target(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                     output_hidden_states=True, logits_to_keep=1)
    hs, last = out.hidden_states, out.hidden_states[-1]
    return TargetOut(torch.stack([hs[k] for k in layers], -2) if layers else last.new_zeros((*last.shape[:2], 0,
                                                                                               last.shape[-1])), last)


class Live(Head):
    """The target on every batch."""

    def __init__(self, target: PreTrainedModel, vocab: int, layers: tuple[int, ...]) -> None:
        super().__init__(target, vocab)
        self.target, self.layers = target, layers

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> TargetOut:
        return forward(self.target, ids, mask, self.layers)


def check_logits(target: PreTrainedModel, vocab: int) -> None:
    """lm_head(final) must be the model's logits (no soft-capping or scaling after the head)."""
    head = Head(target, vocab)
    ids = torch.arange(min(8, vocab))[None]
    with torch.no_grad():
        out = target(input_ids=ids.to(target.device), output_hidden_states=True)
    got, want = head.logits(out.hidden_states[-1]), out.logits[..., :vocab]
    if not torch.allclose(got.float(), want.float(), rtol=1e-3, atol=1e-3):
        raise InputError(f"{target.name_or_path}: its logits are not lm_head(last hidden state) (it post-processes "
                         "them), so its features cannot stand in for it; set task.features=null")


def cache_key(seqs: Seqs, layers: tuple[int, ...]) -> str:
    """The subfolder of a cache: the layers and the sha256 of the sequences."""
    digest = hashlib.sha256(json.dumps(seqs).encode()).hexdigest()[:16]
    return f"layers-{'-'.join(map(str, layers)) or 'none'}-{digest}"


def target_identity(target: PreTrainedModel) -> dict[str, str]:
    """What must match for a cache to stand in for the target: its weights' sha256 (and, to name it, its name)."""
    return {"target": verifier_identity(target), "weights_sha256": tensors_sha256(target.state_dict())}


def check_meta(folder: Path, who: dict[str, str]) -> dict:
    """A complete cache's meta.json, refused when another target wrote it."""
    meta = json.loads((folder / META).read_text())
    if meta["identity"]["weights_sha256"] != who["weights_sha256"]:
        raise InputError(f"features cache {folder} was computed by target {meta['identity']}, not this run's {who}; "
                         "delete it or point task.features at another folder")
    return meta


def write_shard(path: Path, target: PreTrainedModel, seqs: Seqs, layers: tuple[int, ...], pad: int, bs: int,
                who: dict[str, str]) -> None:
    """One shard: each row's states [len, S + 1, H] (named layers, then the final state) and the offsets."""
    parts, offsets = [], [0]
    for b in range(0, len(seqs), bs):
        chunk = seqs[b : b + bs]
        ids, mask, _, _ = make_batch(chunk, pad)
        out = forward(target, ids, mask, layers)
        both = torch.cat([out.states, out.final[..., None, :]], -2).cpu()  # [B, T, S + 1, H]
        for i, (s, _) in enumerate(chunk):
            parts.append(both[i, : len(s)])
            offsets.append(offsets[-1] + len(s))
    with atomic_path(path) as tmp:
        save_file({"states": torch.cat(parts).contiguous(), "offsets": torch.tensor(offsets)}, tmp,
                  metadata={"identity": json.dumps(who)})


def write_cache(folder: Path, target: PreTrainedModel, who: dict[str, str], seqs: Seqs, layers: tuple[int, ...],
                pad: int, bs: int, process: int, processes: int, progress: str | bool | None = False) -> None:
    """This process's missing shards (k mod processes == process); a shard of another target (`who`) is refused."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = range(process, -(-len(seqs) // SHARD_ROWS), processes)
    t0, kept = time.perf_counter(), 0
    for k in progress_bar(shards, progress if process == 0 else False, desc="target features", unit="shard"):
        path = folder / f"shard-{k:05d}.safetensors"
        if path.exists():
            with safe_open(path, framework="pt") as f:
                theirs = json.loads((f.metadata() or {}).get("identity", "{}"))
                if theirs.get("weights_sha256") != who["weights_sha256"]:
                    raise InputError(f"features cache shard {path} was computed by another target than this run's "
                                     f"{who}; delete {folder}")
            kept += 1
            continue
        write_shard(path, target, seqs[k * SHARD_ROWS : (k + 1) * SHARD_ROWS], layers, pad, bs, who)  # atomic
    log.info("features: process %d wrote %d of its shards of %s in %.1f s (%d written by an earlier run)", process,
             len(shards) - kept, folder, time.perf_counter() - t0, kept)


def finish_cache(folder: Path, who: dict[str, str], seqs: Seqs, layers: tuple[int, ...], seconds: float) -> dict:
    """meta.json, last (the main process, once every shard is written); logs the size and the time taken."""
    size = sum(p.stat().st_size for p in folder.glob("shard-*.safetensors"))
    meta = {"identity": who, "layers": list(layers), "rows": len(seqs), "tokens": sum(len(s) for s, _ in seqs),
            "bytes": size, "seconds": round(seconds, 3), "shard_rows": SHARD_ROWS}
    write_json_atomic(folder / META, meta)
    log.info("features: %d rows, %d tokens, %.1f MB written to %s in %.1f s", meta["rows"], meta["tokens"],
             size / 1e6, folder, seconds)
    return meta


class Cached(Head):
    """The target's states read from a complete cache (memory-mapped shards); the target itself is not needed.
    `pick`: the places of the run's layers among the cache's (a cache of more layers serves fewer), None: all."""

    def __init__(self, folder: Path, target: PreTrainedModel, vocab: int, who: dict[str, str],
                 pick: list[int] | None = None) -> None:
        super().__init__(target, vocab)
        self.weight = self.weight.clone()  # a copy of its own: the target is released
        self.pick = pick
        self.meta = check_meta(folder, who)
        self.shards = [safe_open(p, framework="pt") for p in sorted(folder.glob("shard-*.safetensors"))]
        self.offsets = [f.get_tensor("offsets") for f in self.shards]

    def row(self, i: int) -> torch.Tensor:
        """Row i's states [len, S + 1, H]."""
        k, j = divmod(i, self.meta["shard_rows"])
        a, b = self.offsets[k][j : j + 2].tolist()
        return self.shards[k].get_slice("states")[a:b]

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> TargetOut:
        """Rows right-padded with zeros to the batch's T (what the padded positions hold does not enter any loss)."""
        got = [self.row(int(i)) for i in rows]
        both = got[0].new_zeros((len(got), ids.shape[1], *got[0].shape[1:]))
        for b, g in enumerate(got):
            both[b, : len(g)] = g
        both = both.to(self.weight.device)
        states = both[:, :, :-1] if self.pick is None else both[:, :, self.pick]
        return TargetOut(states, both[:, :, -1])


def shell(target: PreTrainedModel) -> PreTrainedModel:
    """An empty (meta-device) model of the target's class and config: what is named and saved of it, no weights."""
    with torch.device("meta"):
        empty = type(target)(target.config)
    empty.name_or_path = target.name_or_path
    return empty


def check_folder(folder: str) -> Path:
    """task.features' folder, made where missing; an InputError naming it where it cannot be."""
    path, why = Path(folder), "a file, not a folder"
    if not path.is_file():
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError as e:
            why = e.strerror or str(e)
    raise InputError(f"task.features {folder}: cannot hold the target's features ({why}); give a writable folder, "
                     "or null to run the target on every batch")


def wider_cache(folder: Path, who: dict[str, str], seqs: Seqs, layers: tuple[int, ...]
                ) -> tuple[Path, list[int]] | None:
    """A complete cache under `folder` by this target (`who`) of the same sequences whose layers include `layers`
    (the first by name), and the places of `layers` among its own; None if there is none."""
    digest = cache_key(seqs, layers).rsplit("-", 1)[1]
    for path in sorted(folder.glob(f"layers-*-{digest}/{META}")):
        meta = json.loads(path.read_text())
        if set(layers) <= set(meta["layers"]) and meta["identity"]["weights_sha256"] == who["weights_sha256"]:
            return path.parent, [meta["layers"].index(k) for k in layers]
    return None


def target_features(acc: Accelerator, pair: Pair, folder: str | None, seqs: Seqs, layers: tuple[int, ...], pad: int,
                    bs: int, progress: str | bool | None) -> Live | Cached:
    """Live when `folder` is None; else the cache of (layers, seqs) under it, written first where it is missing (each
    process its shards, then the main process meta.json)."""
    if folder is None:
        return Live(pair.target, pair.vocab_size, layers)
    check_logits(pair.target, pair.vocab_size)
    path, who = Path(folder) / cache_key(seqs, layers), target_identity(pair.target)  # run_distill: check_folder
    wider = None if (path / META).exists() else wider_cache(Path(folder), who, seqs, layers)
    if wider is not None:
        log.info("features: reusing %s, whose layers include %s", wider[0], list(layers))
        return Cached(wider[0], pair.target, pair.vocab_size, who, wider[1])
    if not (path / META).exists():
        t0 = time.perf_counter()
        write_cache(path, pair.target, who, seqs, layers, pad, bs, acc.process_index, acc.num_processes, progress)
        acc.wait_for_everyone()
        if acc.is_main_process:
            finish_cache(path, who, seqs, layers, time.perf_counter() - t0)
        acc.wait_for_everyone()
    else:
        log.info("features: reusing %s", path)
    return Cached(path, pair.target, pair.vocab_size, who)
