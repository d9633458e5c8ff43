"""The toy task: arithmetic word problems with step-by-step solutions ending in a GSM8K-style line.

A problem is a question (the prompt) and a solution: one line per arithmetic step, each
`... a op b = c ...`, then `#### answer`. Problems are drawn from a `random.Random(seed)`, so
a seed fixes the whole stream. The train/test split is a property of the question text itself
(`is_heldout`: a stable hash of the question), so the toy_arith dataset never contains a
question the toy models were trained on, whatever seeds either side uses.
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
HELDOUT_MOD = 10  # one question in HELDOUT_MOD (by hash) is reserved for evaluation


@dataclass(frozen=True)
class Problem:
    """One word problem: the prompt, its step-by-step solution (ending `#### answer`) and the answer."""

    question: str
    solution: str
    answer: int


def _buy_give(r: random.Random) -> Problem:
    """n = a + b - c."""
    n, it = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(10, 99), r.randint(10, 99)
    c = r.randint(1, a + b)
    s = a + b
    q = f"{n} has {a} {it} and buys {b} more. Then {n} gives away {c}. How many {it} are left?"
    sol = f"{n} has {a} + {b} = {s} {it}.\nAfter giving away {c}, {s} - {c} = {s - c}."
    return Problem(q, f"{sol}\n#### {s - c}", s - c)


def _boxes(r: random.Random) -> Problem:
    """n = a * b + c."""
    n, it = r.choice(NAMES), r.choice(ITEMS)
    a, b, c = r.randint(2, 9), r.randint(2, 12), r.randint(1, 99)
    p = a * b
    q = f"{n} has {a} boxes of {b} {it} and finds {c} more. How many {it} does {n} have?"
    sol = f"The boxes hold {a} * {b} = {p} {it}.\nWith {c} more, {p} + {c} = {p + c}."
    return Problem(q, f"{sol}\n#### {p + c}", p + c)


def _eat_get(r: random.Random) -> Problem:
    """n = a - b + c."""
    n, m, it = *r.sample(NAMES, 2), r.choice(ITEMS)
    a = r.randint(20, 99)
    b, c = r.randint(1, a), r.randint(10, 99)
    d = a - b
    q = f"{n} had {a} {it} and lost {b}. Then {m} gave {n} {c} more. How many {it} does {n} have now?"
    sol = f"After losing {b}, {n} has {a} - {b} = {d} {it}.\nWith {c} more, {d} + {c} = {d + c}."
    return Problem(q, f"{sol}\n#### {d + c}", d + c)


def _share(r: random.Random) -> Problem:
    """n = a + b - k * c, with k * c <= a + b."""
    n, m, it = *r.sample(NAMES, 2), r.choice(ITEMS)
    a, b = r.randint(10, 99), r.randint(10, 99)
    k = r.randint(2, 5)
    c = r.randint(1, min(20, (a + b) // k))
    s, g = a + b, k * c
    q = f"{n} has {a} {it} and {m} has {b}. They give {c} to each of {k} friends. How many {it} are left?"
    sol = f"Together they have {a} + {b} = {s} {it}.\nThey give away {k} * {c} = {g}.\nSo {s} - {g} = {s - g} are left."
    return Problem(q, f"{sol}\n#### {s - g}", s - g)


KINDS: list[Callable[[random.Random], Problem]] = [_buy_give, _boxes, _eat_get, _share]


def is_heldout(question: str) -> bool:
    """True for the questions reserved for evaluation: crc32(question) mod HELDOUT_MOD == 0."""
    return zlib.crc32(question.encode()) % HELDOUT_MOD == 0


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
            if is_heldout(p.question) == self.heldout:
                return p

    def take(self, n: int) -> list[Problem]:
        """The next n problems."""
        return [next(self) for _ in range(n)]


def heldout_set(seed: int, n: int) -> list[Problem]:
    """n distinct held-out problems from `seed`, in a fixed order."""
    seen: set[str] = set()
    out: list[Problem] = []
    for p in problems(seed, "test"):
        if p.question not in seen:
            seen.add(p.question)
            out.append(p)
        if len(out) == n:
            return out
    raise AssertionError("unreachable: the stream is endless")


def answer_text(p: Problem) -> str:
    """What the model is trained to produce after the question: a newline, then the solution."""
    return "\n" + p.solution
