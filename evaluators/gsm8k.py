"""`gsm8k`: grade-school math word problems (test split, 1319), scored by exact match of the final number.

Source: hub `openai/gsm8k` (config main), or `gsm8k/test.jsonl` (few-shot: `train.jsonl`) under the local data
folder. Prompt as lm-eval's `gsm8k` task, "Question: {question}\\nAnswer:"; `num_fewshot` > 0 puts the first n
training problems with their worked answers before it (lm-eval samples them at random; the first n keep prompts
fixed across runs). Scoring records lm-eval's two filters, `pred_strict` (the number after "####", the set's answer
format) and `pred_flexible` (the last number); the headline `score` takes the strict one when there is one. Rows
keep `reference` (the set's own "####" number) and `extracted` (= `pred`). Numbers are compared as values after
removing ",", "$" and a trailing "." (so "18.00" == "18"; lm-eval compares strings).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from specbench.data.dataset import DATASETS, Evaluator, Example, Row, Source, load_source
from specbench.common.options import integer
from specbench.data.prompting import fewshot_example

TEST = Source("GSM8K test", hub="openai/gsm8k", hub_config="main", hub_split="test", local="gsm8k/test.jsonl")
TRAIN = Source("GSM8K train", hub="openai/gsm8k", hub_config="main", hub_split="train", local="gsm8k/train.jsonl")
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-eval gsm8k "strict-match"
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # lm-eval gsm8k "flexible-extract" (last match)
BOXED = re.compile(r"\\boxed\{\s*-?[$0-9.,]+\s*\}")  # a final answer as chat models write it: \boxed{18}


def question_text(question: str) -> str:
    """lm-eval's doc_to_text."""
    return f"Question: {question}\nAnswer:"


def to_number(text: str | None) -> Decimal | None:
    """'$1,234.' -> Decimal('1234'); None if it is not a number."""
    if text is None:
        return None
    s = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        return Decimal(s)
    except InvalidOperation:
        return None


def strict_answer(output: str) -> str | None:
    """The number after the first '#### ', as written."""
    m = STRICT.search(output)
    return m.group(1) if m else None


def flexible_answer(output: str) -> str | None:
    """The last number-like span in the output, as written."""
    found = [a or b for a, b in FLEXIBLE.findall(output)]
    return found[-1] if found else None


def row_reference(row: Row) -> str:
    """The final number of a GSM8K row's solution ('... #### 1,600' -> '1600'); no '#### N' line fails, naming it."""
    answer = row.text("answer")
    if "####" not in answer:
        raise row.error("field 'answer' has no final '#### <number>' line, so the row cannot be scored")
    return answer.split("####")[-1].strip().replace(",", "")


def match(pred: str | None, reference: str) -> float:
    """1.0 if pred equals reference as a number."""
    p = to_number(pred)
    return float(p is not None and p == to_number(reference))


@DATASETS.register("gsm8k")
class GSM8K(Evaluator):
    """GSM8K test problems; score = exact match of the final number."""

    name = "gsm8k"
    stop_strings = ("Question:",)  # lm-eval's `until` (EOS is always a stop)

    def __init__(self, data_dir: str | None = None, num_fewshot: int = 0, instruction: str | None = None,
                 stop_strings: list[str] | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.num_fewshot = integer(num_fewshot, "dataset.num_fewshot", low=0, high=8)
        self.data_dir, self.instruction = data_dir, instruction
        self.stop_strings = self.stop_strings if stop_strings is None else tuple(stop_strings)

    def shots(self) -> list[dict[str, str]]:
        """The few-shot turns: the first num_fewshot training problems and their answers."""
        if not self.num_fewshot:
            return []
        rows = load_source(TRAIN, self.data_dir)[: self.num_fewshot]
        return [m for r in rows for m in ({"role": "user", "content": question_text(r.text("question"))},
                                          {"role": "assistant", "content": r.text("answer")})]

    def examples(self) -> list[Example]:
        rows, shots = load_source(TEST, self.data_dir), self.shots()
        head = f"{self.instruction}\n\n" if self.instruction else ""
        return [fewshot_example(f"gsm8k-{i:04d}", head, shots, question_text(r.text("question")), row_reference(r))
                for i, r in enumerate(rows)]

    def score(self, example: Example, output: str) -> dict[str, Any]:
        strict, flexible = strict_answer(output), flexible_answer(output)
        pred = strict if strict is not None else flexible
        return {"score": match(pred, example.reference), "pred": pred, "pred_strict": strict,
                "pred_flexible": flexible, "exact_match_strict": match(strict, example.reference),
                "exact_match_flexible": match(flexible, example.reference), "reference": example.reference,
                "extracted": pred}

    def reference(self, example: Example) -> str:
        """The final answer in the set's own format, '#### <number>' (both filters read it)."""
        return f"#### {example.reference}"

    def answer_complete(self, example: Example, output: str) -> bool:
        """A final answer is written: the set's '#### N' line or a boxed number (a last number alone may be a
        step of unfinished work)."""
        return strict_answer(output) is not None or BOXED.search(output) is not None
