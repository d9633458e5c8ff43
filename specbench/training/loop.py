"""The one training loop of task=distill (drafters and heads), on accelerate: the same command trains on one process
or many (`torchrun --nproc_per_node N run.py task=distill ...`, `accelerate launch`, a SLURM node's tasks), CPU
processes over gloo, GPUs over NCCL; mixed precision from `task.autocast` (accelerate's autocast of every forward).

Equal on 1 or N processes: step s's global batch (batch_indices(n, task.batch_size, s, seed)) is split round-robin,
process r taking rows r, r + N, ...; each process's loss is N x (its sum of per-position KL) / (positions of the
whole batch), so DDP's mean of the processes' gradients is the gradient of the whole batch's mean KL, as one process
computes it. Gradients are clipped after DDP's all-reduce (the same norm everywhere) and every process steps the
same AdamW: the weights stay equal across processes and equal a 1-process run's, up to float rounding (each process
pads its rows to its own longest sequence). The main process alone writes checkpoints and logs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs

from specbench.common.errors import InputError
from specbench.common.progress import progress_bar

log = logging.getLogger(__name__)

PRECISION = {None: "no", "bfloat16": "bf16", "float16": "fp16"}  # task.autocast -> accelerate's mixed_precision
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # ids, attention mask, loss mask [B, T]; P [B]


class Objective(torch.nn.Module):
    """What DDP wraps: the trained modules, and as forward the trainer's per-position loss of a batch (the frozen
    verifier stays outside, unsynchronised)."""

    def __init__(self, modules: list[torch.nn.Module], loss: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(modules)
        self.loss = loss

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor, P: torch.Tensor,
                delta: torch.Tensor) -> torch.Tensor:
        return self.loss(ids, mask, where, P, delta)


def accelerator(autocast: str | None, device: torch.device) -> Accelerator:
    """The run's Accelerator: its processes (from torchrun / accelerate launch, else one) and mixed precision."""
    if autocast not in PRECISION:
        raise InputError(f"task.autocast must be one of {list(PRECISION)}, got {autocast!r}")
    return Accelerator(mixed_precision=PRECISION[autocast], cpu=device.type == "cpu",
                       kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])


def check_split(batch_size: int, rows: int, processes: int) -> None:
    """Every process needs rows of every step: the global batch splits evenly and the data fills one batch."""
    if batch_size % processes:
        raise InputError(f"task.batch_size {batch_size} does not split over {processes} processes; make it a "
                         f"multiple of {processes}")
    if rows < batch_size:
        raise InputError(f"the training data has {rows} rows, fewer than one batch (task.batch_size {batch_size}); "
                         "lower task.batch_size or sample more rows with task=synth")


@dataclass
class Progress:
    """Where a run is: the next step, the log so far, the seconds trained before this process started."""

    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)  # one log entry a step
    seconds: float = 0.0


T = TypeVar("T")


def mine(acc: Accelerator, items: list[T]) -> list[T]:
    """This process's share of a global batch: items r, r + N, ..."""
    return items[acc.process_index :: acc.num_processes]


def global_mean(acc: Accelerator, kl: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """(this process's loss, the whole batch's mean KL, n): N x Σ kl / n over the n positions of all processes."""
    n = acc.reduce(torch.tensor(float(kl.numel()), device=kl.device), "sum").clamp_min(1)
    total = acc.reduce(kl.detach().double().sum(), "sum")
    return kl.sum() * acc.num_processes / n, float(total / n), float(n)


@dataclass
class Schedule:
    """When to measure and save: `steps` in all, the held-out KL every `every`, a checkpoint every `save_every`."""

    steps: int
    every: int
    save_every: int


def fit(acc: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer,
        sched: torch.optim.lr_scheduler.LRScheduler, params: list[torch.nn.Parameter],
        batch_of: Callable[[int], tuple[torch.Tensor, ...]], held_out: Callable[[], float],
        save: Callable[[Progress], None], at: Progress, when: Schedule, progress: str | bool | None,
        desc: str) -> Progress:
    """Train from `at.step` to `when.steps`: each step this process's share of the global batch (`batch_of`), the
    loss of global_mean, DDP's gradient mean, clipping at 0.5 (SD² A.3), AdamW and the lr schedule; the held-out KL
    and the checkpoint (`save`, the main process; every process waits for it) on `when`'s steps. The bar shows the
    loss, positions per second and the ETA."""
    bar = progress_bar(range(at.step, when.steps), progress if acc.is_main_process else False, desc=desc,
                       unit="step", initial=at.step, total=when.steps)
    t0, positions = time.perf_counter(), 0.0
    for step in bar:
        kl = model(*batch_of(step))
        loss, mean, n = global_mean(acc, kl)
        acc.backward(loss)
        norm = acc.clip_grad_norm_(params, 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)
        entry = {"step": step + 1, "loss": mean, "lr": opt.param_groups[0]["lr"], "grad_norm": float(norm)}
        sched.step()
        positions += n
        bar.set_postfix(loss=f"{mean:.4f}", positions_s=f"{positions / (time.perf_counter() - t0):.0f}")
        if (step + 1) % when.every == 0 or step + 1 == when.steps:
            entry["val_kl"] = held_out()
        at = Progress(step + 1, [*at.history, entry], at.seconds)
        if (step + 1) % when.save_every == 0 and step + 1 < when.steps:
            if acc.is_main_process:
                save(Progress(at.step, at.history, at.seconds + time.perf_counter() - t0))
            acc.wait_for_everyone()
    return Progress(at.step, at.history, at.seconds + time.perf_counter() - t0)
