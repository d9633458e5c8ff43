"""`python -m specbench.bench engine --trace DIR`: where an engine's time goes outside the models' forwards, from a
torch.profiler trace of its generations.

Each model's forward is marked by a `record_function` opened and closed by module hooks (nn.Module's public forward
pre-hooks and hooks). An iteration's wall time then splits into
    forward   the marked forwards (the models' own time, what `engine_overhead` counts as model time),
    ops       top-level aten ops outside them (the engine's tensor work: sampling, acceptance, writes, margins),
    python    the rest (the loop's Python between them),
so engine_overhead = (ops + python) / wall. The table lists the ops outside forwards per iteration by name and
DIR/<label>.json keeps each chrome trace (chrome://tracing, perfetto.dev).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from specbench.decoding.decoders import Decoder

MARK = "model forward"


@contextmanager
def marked(models: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Each forward of `models` inside a record_function named MARK (hooks removed on exit)."""
    open_: list[record_function] = []

    def enter(module: torch.nn.Module, args: object) -> None:
        open_.append(record_function(MARK))
        open_[-1].__enter__()

    def leave(module: torch.nn.Module, args: object, out: object) -> None:
        open_.pop().__exit__(None, None, None)

    handles = [h for m in models for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@dataclass
class Trace:
    """One profiled run: its iterations and model forwards, and µs of wall, forwards and top-level ops outside them."""

    iterations: int
    forwards: int  # MARK spans: the models' forward calls
    wall: float
    forward: float
    ops: dict[str, tuple[int, float]]  # op name -> (calls, µs) outside the forwards

    def summary(self) -> str:
        """Markdown: per iteration wall, forward, ops and python µs, then the ops outside forwards by time."""
        n, ops = max(self.iterations, 1), sum(us for _, us in self.ops.values())
        calls = sum(c for c, _ in self.ops.values())
        lines = [f"{self.iterations} iterations, {self.forwards} model forwards; per iteration (µs): wall "
                 f"{self.wall / n:.1f}, forward {self.forward / n:.1f}, ops outside forwards {ops / n:.1f} "
                 f"({calls / n:.1f} calls), python {(self.wall - self.forward - ops) / n:.1f}; host share "
                 f"(ops + python) / wall {(self.wall - self.forward) / self.wall:.2%} (under the profiler)",
                 "", "| op outside forwards | calls / iteration | µs / iteration |", "|---|---|---|"]
        for name, (c, us) in sorted(self.ops.items(), key=lambda kv: -kv[1][1])[:15]:
            lines.append(f"| {name} | {c / n:.2f} | {us / n:.1f} |")
        return "\n".join(lines)


def trace(engine: Decoder, prompts: list[list[int]], max_new: int, models: Sequence[torch.nn.Module], path: Path
          ) -> Trace:
    """Profile `engine` on `prompts` (warmed up by the caller) and write its chrome trace to path."""
    with marked(models), profile(activities=[ProfilerActivity.CPU]) as prof:
        iterations = sum(len(engine.generate(p, max_new).records) for p in prompts)
    prof.export_chrome_trace(str(path))
    events = list(prof.events())
    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == MARK)
    ops: dict[str, tuple[int, float]] = {}
    for e in events:  # top-level ops: one inside a marked forward has the mark as its parent
        if e.cpu_parent is None and e.name != MARK:
            c, us = ops.get(e.name, (0, 0.0))
            ops[e.name] = (c + 1, us + e.time_range.end - e.time_range.start)
    wall = max(e.time_range.end for e in events) - min(e.time_range.start for e in events)
    return Trace(iterations, len(spans), wall, sum(b - a for a, b in spans), ops)
