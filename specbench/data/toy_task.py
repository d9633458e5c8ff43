"""The toy task: arithmetic word problems with step-by-step solutions ending in a GSM8K-style line.

A solution is one line per arithmetic step, each `... a op b = c ...`, then `#### answer`; questions use one-digit
numbers, intermediate results up to two digits. A `random.Random(seed)` draws them, so a seed fixes the whole stream.
The train/test split is decided by a stable hash of the problem's kind and numbers (`is_heldout`), so the toy_arith
dataset only holds number combinations the toy models never saw in training, whatever seeds either side uses.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Callable

NAMES = ["Ava", "Ben", "Cara", "Dan", "Eli", "Finn", "Gia", "Hugo", "Ivy", "Jon", "Kai", "Lea", "Max", "Nia",
         "Omar", "Pia", "Raj", "Sam", "Tia", "Uma"]
ITEMS = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "marbles", "cookies", "stickers",
         "plums", "beads"]
HELDOUT_MOD = 10  # one number combination in HELDOUT_MOD (by hash) is reserved for evaluation


@dataclass(frozen=True)
class Problem:
    """One word problem: the prompt, its step-by-step solution (ending `#### answer`) and the answer."""

    question: str
    solution: str
    answer: int
    key: str  # kind and numbers: the train/test split is decided on this


def _boxes(r: random.Random) -> Problem:
    """a * b - c."""
    n, it = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(2, 9), r.randint(2, 9)
    p = a * b
    c = r.randint(1, min(9, p - 1))
    q = f"{n} has {a} boxes of {b} {it} and gives away {c}. How many {it} are left?"
    sol = f"The boxes hold {a} * {b} = {p}.\nAfter giving away {c}, {p} - {c} = {p - c} are left."
    return Problem(q, f"{sol}\n#### {p - c}", p - c, f"boxes:{a},{b},{c}")


def _bags(r: random.Random) -> Problem:
    """a + b * c - d."""
    n, it = r.choice(NAMES), r.choice(ITEMS)
    a, b, c, d = (r.randint(2, 9) for _ in range(4))
    g = b * c
    q = f"{n} has {a} {it} and buys {b} bags of {c}. Then {n} loses {d}. How many {it} are left?"
    sol = (f"The bags hold {b} * {c} = {g}.\nSo there are {a} + {g} = {a + g}.\n"
           f"After losing {d}, {a + g} - {d} = {a + g - d} are left.")
    return Problem(q, f"{sol}\n#### {a + g - d}", a + g - d, f"bags:{a},{b},{c},{d}")


def _friends(r: random.Random) -> Problem:
    """(a + b - c) * k."""
    n, m, it = *r.sample(NAMES, 2), r.choice(ITEMS)
    a, b, k = r.randint(2, 9), r.randint(2, 9), r.randint(2, 9)
    s = a + b
    c = r.randint(1, s - 1)
    q = (f"{n} has {a} {it} and {m} has {b}. They eat {c}. Then they get {k} times as many as are left. "
         f"How many {it} do they get?")
    sol = (f"Together they have {a} + {b} = {s}.\nAfter eating {c}, {s} - {c} = {s - c} are left.\n"
           f"They get {k} * {s - c} = {k * (s - c)}.")
    return Problem(q, f"{sol}\n#### {k * (s - c)}", k * (s - c), f"friends:{a},{b},{c},{k}")


KINDS: list[Callable[[random.Random], Problem]] = [_boxes, _bags, _friends]


def is_heldout(key: str) -> bool:
    """True for the problems reserved for evaluation: crc32(key) mod HELDOUT_MOD == 0."""
    return zlib.crc32(key.encode()) % HELDOUT_MOD == 0


def problems(seed: int, split: str) -> "ProblemStream":
    """An endless, deterministic stream of problems of `split` ('train' or 'test') from `seed`."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return ProblemStream(random.Random(seed), split == "test")


class ProblemStream:
    """Draws problems of one split: a uniform kind, then uniform numbers; the other split is skipped."""

    def __init__(self, rng: random.Random, heldout: bool) -> None:
        self.rng, self.heldout = rng, heldout

    def __iter__(self) -> "ProblemStream":
        return self

    def __next__(self) -> Problem:
        while True:
            p = self.rng.choice(KINDS)(self.rng)
            if is_heldout(p.key) == self.heldout:
                return p

    def take(self, n: int) -> list[Problem]:
        """The next n problems."""
        return [next(self) for _ in range(n)]


def heldout_set(seed: int, n: int) -> list[Problem]:
    """n distinct held-out problems from `seed`, in a fixed order."""
    unique: dict[str, Problem] = {}  # by key, in order of first draw
    for p in problems(seed, "test"):
        unique.setdefault(p.key, p)
        if len(unique) == n:
            return list(unique.values())
    raise AssertionError("unreachable: the stream is endless")


def answer_text(p: Problem) -> str:
    """What the model is trained to produce after the question: a newline, then the solution."""
    return "\n" + p.solution
