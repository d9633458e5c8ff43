"""The one training loop of task=distill (drafters and heads), on accelerate: the same command trains on one process
or many (`torchrun --nproc_per_node N run.py task=distill ...`, `accelerate launch`, a SLURM node's tasks), CPU
processes over gloo, GPUs over NCCL; mixed precision from `task.autocast` (accelerate's autocast of every forward).

Equal on 1 or N processes: step s's global batch (batch_indices(n, task.batch_size, s, seed)) is split round-robin,
process r taking rows r, r + N, ..., and with gradient accumulation (task.accumulate = A) each process's rows again
into A micro-batches (its rows m, m + A, ...). Each micro-batch's loss is N x (its sum of loss terms) / (loss
positions of the whole global batch, known from the data before any forward), its gradients add up over the A
backwards (DDP synchronises the last), and DDP's mean over the processes is the gradient of the whole batch's loss
per position, as one process computes it. Gradients are clipped after the all-reduce (the same norm everywhere) and
every process steps the same AdamW: the weights stay equal across processes and equal a 1-process run's with the same
N x A micro-batches, up to float rounding (each micro-batch is padded to its own longest sequence).

Checkpoints: the step is the data position (a step's rows and offsets are functions of (seed, step)); the main
process writes the weights, optimiser, scheduler, log and every process's RNG states (torch's, CUDA's, Python's;
numpy's is not used) atomically, and a resume on as many processes restores all of them.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.utils import gather_object

from specbench.common.errors import InputError
from specbench.common.progress import progress_bar

log = logging.getLogger(__name__)

PRECISION = {None: "no", "bfloat16": "bf16", "float16": "fp16"}  # task.autocast -> accelerate's mixed_precision
Micro = tuple[torch.Tensor, ...]  # ids, attention mask, loss mask [b, T]; P, δ, row indices [b]


class Objective(torch.nn.Module):
    """What DDP wraps: the trained modules, and as forward the trainer's per-position loss of a batch (the frozen
    verifier stays outside, unsynchronised)."""

    def __init__(self, modules: list[torch.nn.Module], loss: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(modules)
        self.loss = loss

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor, P: torch.Tensor,
                delta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.loss(ids, mask, where, P, delta, rows)


def accelerator(autocast: str | None, device: torch.device) -> Accelerator:
    """The run's Accelerator: its processes (from torchrun / accelerate launch, else one) and mixed precision."""
    if autocast not in PRECISION:
        raise InputError(f"task.autocast must be one of {list(PRECISION)}, got {autocast!r}")
    return Accelerator(mixed_precision=PRECISION[autocast], cpu=device.type == "cpu",
                       kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])


def check_split(batch_size: int, rows: int, processes: int, accumulate: int) -> None:
    """Every micro-batch needs rows of every step: the global batch splits evenly and the data fills one batch."""
    if accumulate < 1:
        raise InputError(f"task.accumulate must be a whole number >= 1 (micro-batches a step), got {accumulate}")
    if batch_size % (processes * accumulate):
        raise InputError(f"task.batch_size {batch_size} does not split over {processes} process(es) x "
                         f"task.accumulate {accumulate} micro-batches; make it a multiple of {processes * accumulate}")
    if rows < batch_size:
        raise InputError(f"the training data has {rows} rows, fewer than one batch (task.batch_size {batch_size}); "
                         "lower task.batch_size or sample more rows with task=synth")


@dataclass
class Progress:
    """Where a run is: the next step, the log so far, the seconds trained before this process started."""

    step: int = 0
    history: list[dict[str, float | list[float]]] = field(default_factory=list)  # one log entry a step
    seconds: float = 0.0


def split(acc: Accelerator, rows: int, accumulate: int) -> list[list[int]]:
    """This process's micro-batches of a global batch of `rows`: its rows r, r + N, ..., then every A-th of them."""
    mine = list(range(acc.process_index, rows, acc.num_processes))
    return [mine[m::accumulate] for m in range(accumulate)]


def rng_states() -> dict[str, object]:
    """This process's random states."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate()}


def set_rng_states(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])


def step_loss(acc: Accelerator, model: torch.nn.Module, micros: list[Micro], positions: int) -> float:
    """Forward and backward of this process's micro-batches (DDP synchronises on the last); returns the global
    batch's loss per position (Σ of every process's loss terms / positions)."""
    total = torch.zeros((), dtype=torch.float64, device=acc.device)
    for m, micro in enumerate(micros):
        with acc.no_sync(model) if m < len(micros) - 1 else contextlib.nullcontext():
            kl = model(*micro)
            acc.backward(kl.sum() * acc.num_processes / positions)
        total += kl.detach().double().sum()
    return float(acc.reduce(total, "sum")) / positions


@dataclass
class Schedule:
    """When to measure and save: `steps` in all, the held-out KL every `every`, a checkpoint every `save_every`."""

    steps: int
    every: int
    save_every: int


def fit(acc: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer,
        sched: torch.optim.lr_scheduler.LRScheduler, params: list[torch.nn.Parameter],
        batch_of: Callable[[int], tuple[list[Micro], int]], held_out: Callable[[], dict[str, float | list[float]]],
        save: Callable[[Progress, list], None], at: Progress, when: Schedule, progress: str | bool | None,
        desc: str) -> Progress:
    """Train from `at.step` to `when.steps`: each step this process's micro-batches and the global batch's loss
    positions (`batch_of`), step_loss, clipping at 0.5 (SD² A.3), AdamW and the lr schedule; the held-out KL and the
    checkpoint (`save` with every process's RNG states, on the main process; all wait for it) on `when`'s steps. The
    bar shows the loss, loss tokens per second and the ETA."""
    bar = progress_bar(range(at.step, when.steps), progress if acc.is_main_process else False, desc=desc,
                       unit="step", initial=at.step, total=when.steps)
    t0, positions = time.perf_counter(), 0.0
    for step in bar:
        micros, n = batch_of(step)
        mean = step_loss(acc, model, micros, n)
        norm = acc.clip_grad_norm_(params, 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)
        entry = {"step": step + 1, "loss": mean, "lr": opt.param_groups[0]["lr"], "grad_norm": float(norm)}
        sched.step()
        positions += n
        bar.set_postfix(loss=f"{mean:.4f}", tok_s=f"{positions / (time.perf_counter() - t0):.0f}")
        if (step + 1) % when.every == 0 or step + 1 == when.steps:
            entry.update(held_out())
        at = Progress(step + 1, [*at.history, entry], at.seconds)
        if (step + 1) % when.save_every == 0 and step + 1 < when.steps:
            rngs = gather_object([rng_states()])  # every process's, in process order
            if acc.is_main_process:
                save(Progress(at.step, at.history, at.seconds + time.perf_counter() - t0), rngs)
            acc.wait_for_everyone()
    return Progress(at.step, at.history, at.seconds + time.perf_counter() - t0)
