"""`toy_arith`: held-out toy arithmetic word problems (specbench.data.toy_task), scored by exact answer.

The prompt is the question alone (the toy pair's training format). The score is 1.0 when the output's first `#### N`
line gives N == the integer answer, else 0.0; rows keep `reference` (the answer) and `extracted` (N, null without the
line; also under its older name `answer`). Generation ends at EOS, which the toy models emit right after the answer
line; the stop string "\\n\\n" (a blank line never occurs in the task) caps a model that runs on.
"""

from __future__ import annotations

import re
from typing import Any

from specbench.data.dataset import DATASETS, Evaluator, Example
from specbench.common.options import integer
from specbench.data.toy_task import heldout_set

ANSWER = re.compile(r"^#### *(-?[\d,]+)", re.MULTILINE)


def extract_answer(output: str) -> int | None:
    """The integer on the first `#### N` line of the output (commas allowed), or None."""
    m = ANSWER.search(output)
    return int(m.group(1).replace(",", "")) if m and m.group(1).replace(",", "").lstrip("-") else None


@DATASETS.register("toy_arith")
class ToyArith(Evaluator):
    """`n` held-out problems drawn from `seed`; ids toy-000, toy-001, ..."""

    name = "toy_arith"
    stop_strings = ("\n\n",)

    def __init__(self, n: int = 200, seed: int = 1234) -> None:
        super().__init__()
        self.n, self.seed = integer(n, "dataset.n", low=1), integer(seed, "dataset.seed")

    def examples(self) -> list[Example]:
        return [Example(id=f"toy-{i:03d}", prompt=p.question, reference=p.answer, meta={"solution": p.solution})
                for i, p in enumerate(heldout_set(self.seed, self.n))]

    def score(self, example: Example, output: str) -> dict[str, Any]:
        got = extract_answer(output)
        return {"score": float(got is not None and got == example.reference), "answer": got,
                "reference": example.reference, "extracted": got}

    def reference(self, example: Example) -> str:
        """The problem's step-by-step solution, ending in its `#### N` line."""
        return example.meta["solution"]

    def answer_complete(self, example: Example, output: str) -> bool:
        """The answer line `#### N` is written."""
        return extract_answer(output) is not None
