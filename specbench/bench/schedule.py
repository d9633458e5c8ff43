"""`bench gpu --budget MINUTES`: each section's estimated seconds, from the machine's measured pace.

Each model's cost model, measured right after its pair is built (`probe`): one forward of n tokens (rows x tokens
per row) after a cached prompt costs

    T(n) = t1 + (n - 1) * slope        (t1: one token; slope from one forward of 4 rows x 64 tokens)

flat where a forward is bound by reading the weights (a GPU at small n), linear where bound by arithmetic. A section's
estimate sums T over the forwards it plans, times OVERHEAD (the engine's and Python's share), plus COMPILE_S per
compiled graph; a pair not built yet is scaled from the last pair's pace by parameter counts. gpu.corrected then
multiplies it by the run's median ratio taken / estimated, which learns what the model does not count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from transformers import PreTrainedModel

from specbench.bench.profile import forward_seconds

OVERHEAD = 1.3  # measured decode time / summed forward time, a generous engine + Python share
COMPILE_S = {"cuda": 20.0, "cpu": 4.0}  # seconds per compiled graph (torch.compile), a prior: H200, 8B shapes, 14 graphs in about 280 s
BUILD_S_PER_B = {"cuda": 6.0, "cpu": 30.0}  # seconds to build and calibrate a shaped pair, per billion parameters
LANE_S = {"cuda": 150.0, "cpu": 30.0}  # the test lane (the CUDA lane's modules; --quick: one module), a prior
TAU = 3.5  # tokens per vanilla iteration before one is measured (α 0.88, γ 5 gives about 4.4)


class OutOfTime(Exception):
    """Raised between a section's steps when the budget's deadline has passed (the section is cut short)."""


@dataclass
class Budget:
    """The time a run may take: seconds from its start, or None for no limit."""

    seconds: float | None
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        """Seconds left (inf without a budget)."""
        return float("inf") if self.seconds is None else self.seconds - (time.monotonic() - self.start)

    def check(self) -> None:
        """OutOfTime once the deadline has passed."""
        if self.seconds is not None and self.left() <= 0:  # without a budget no time runs out
            raise OutOfTime(f"the budget of {self.seconds / 60:.1f} min ran out")


@dataclass
class Model:
    """One model's cost model: T(n) = t1 + (n - 1) * slope seconds for a forward of n tokens."""

    t1: float
    slope: float

    def __call__(self, n: int) -> float:
        return self.t1 + max(n - 1, 0) * self.slope

    def scaled(self, factor: float) -> "Model":
        return Model(self.t1 * factor, self.slope * factor)


def probe(model: PreTrainedModel, prompt: list[int]) -> Model:
    """The cost model of `model`, from a one-token forward and a forward of 4 rows x 64 tokens (3 steps each)."""
    t1 = forward_seconds(model, prompt, 1, 1, steps=3)
    wide = forward_seconds(model, prompt, 64, 4, steps=3)
    return Model(t1, max(wide - t1, 0.0) / 255)


@dataclass
class Pace:
    """What the estimates know: both models' cost models, the device kind, the pair's parameters, tokens per step."""

    device: str
    target: Model
    draft: Model
    params: float = 0.0  # billions, of the pair the models belong to
    tau: float = TAU

    def for_pair(self, params: float) -> "Pace":
        """The pace of another pair of `params` billion parameters, scaled from this one's (a prior)."""
        if not self.params:
            return self
        f = params / self.params
        return Pace(self.device, self.target.scaled(f), self.draft.scaled(f), params, self.tau)

    def vanilla(self, rows: int, gamma: int, tokens: int) -> float:
        """Seconds of a vanilla generation of `tokens` new tokens at B rows: tokens / τ iterations of γ draft
        forwards and one verify of γ + 1 tokens per row."""
        return tokens / self.tau * (gamma * self.draft(rows) + self.target(rows * (gamma + 1)))

    def ar(self, rows: int, tokens: int) -> float:
        """Seconds of an ar generation: one one-token forward per row and token."""
        return tokens * self.target(rows)

    def compile_s(self, graphs: int) -> float:
        """Seconds to build `graphs` compiled graphs (the prior COMPILE_S each)."""
        return graphs * COMPILE_S.get(self.device, COMPILE_S["cuda"])
