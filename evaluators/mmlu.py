"""`mmlu`: 57-subject multiple choice, scored by the accuracy of the answer letter extracted from the output.

Splits: `validation` (1531 questions, the AdaSD paper's: hub `cais/mmlu`, config all) is the default; `test` (14042)
is also on the hub and is the only split with a local copy (`mmlu/test.jsonl`); `dev` (285) gives the few-shot
examples. A split the chosen source lacks fails naming it; every row records its split. Examples are ordered by
subject (a stable sort), so the hub's `all` config and the local copy (another subject order) give the same examples
and ids (`<subject>-<index in subject>`). Prompt as lm-eval's generative MMLU: "The following are multiple choice
questions (with answers) about <subject>.", then, with `num_fewshot` (0..5), the subject's first dev questions with
their letters, then "<question>\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer:".
"""

from __future__ import annotations

import re
from typing import Any

from specbench.data.dataset import DATASETS, Evaluator, Example, NoLocalCopyError, Row, Source, load_source
from specbench.common.options import choice, integer
from specbench.data.prompting import fewshot_example

LETTERS = "ABCD"
SPLITS = {"validation": None, "test": "mmlu/test.jsonl", "dev": None}  # split -> local file (None: hub only)


def source(split: str) -> Source:
    """The MMLU `split` on the hub (cais/mmlu, all) and its local file, if any."""
    return Source(f"MMLU {split}", hub="cais/mmlu", hub_config="all", hub_split=split, local=SPLITS[split])


def question_text(row: dict[str, Any]) -> str:
    """lm-eval's doc_to_text."""
    options = "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(row["choices"]))
    return f"{row['question'].strip()}{options}\nAnswer:"


def check_row(row: Row) -> Row:
    """A usable MMLU row: text subject and question, 1 to 4 choices, an answer index into them."""
    row.text("subject")
    row.text("question")
    choices, answer = row["choices"], row["answer"]
    if not isinstance(choices, list) or not 1 <= len(choices) <= len(LETTERS):
        raise row.error(f"field 'choices' must be a list of 1 to {len(LETTERS)} options, got {choices!r}")
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise row.error(f"field 'answer' must be the index of the right choice (0 to {len(choices) - 1}), "
                        f"got {answer!r}")
    return row


# The letter after optional spaces, asterisks, brackets; not the start of a word ("A new ...").
_LETTER = r"[\s*(\[]*([A-D])(?![A-Za-z0-9'])"
PATTERNS = [  # tried in order; the first match of the first pattern that matches gives the letter
    re.compile(r"\\boxed\{\s*(?:\\text\{)?([A-D])"),
    re.compile(r"(?:answer|option|choice)\**\s*(?:is|would be|should be|=|:)\**\s*(?:option|choice)?\s*:?"
               + _LETTER, re.I),
    re.compile(r"^[\s*(\[]*([A-D])(?:[.):\]]|\*\*|\s*$|\s+[-\u2013:]|\s+is\b)", re.M),
    re.compile(r"\(([A-D])\)"),
    re.compile(r"\*\*([A-D])[.)]?\*\*"),
]
LONE = re.compile(r"(?<![A-Za-z0-9'])([B-D])(?![A-Za-z0-9'])")


def extract_letter(output: str, choices: list[str] | None = None) -> str | None:
    """The answer letter in a model output, or None.

    In order: a boxed letter; an explicit statement ("The answer is (B)", "**Answer:** C",
    "the correct option is D"); a letter opening a line ("B", "B.", "(B) text", "**C**", "D is
    correct"); a parenthesised letter "(C)"; a bold letter; the text of exactly one of the choices;
    a lone B, C or D (a lone "A" is too often the article). A bare lower-case letter is accepted.
    """
    text = output.strip()
    if re.fullmatch(r"\(?[a-d]\)?\.?", text):
        return text.strip("().").upper()
    for pat in PATTERNS:
        for m in pat.finditer(text):
            if m.group(1) in LETTERS:  # re.I lets 'a' (the article) match: skip it
                return m.group(1)
    if choices:
        # the choices whose text appears in the output as a whole phrase (case-insensitive)
        hits = [LETTERS[j] for j, c in enumerate(choices)
                if str(c).strip() and re.search(rf"(?<!\w){re.escape(str(c).strip())}(?!\w)", text, re.I)]
        if len(hits) == 1:
            return hits[0]
    m = LONE.search(text)
    return m.group(1) if m else None


@DATASETS.register("mmlu")
class MMLU(Evaluator):
    """MMLU questions; score = 1 if the extracted letter is the answer."""

    name = "mmlu"

    def __init__(self, data_dir: str | None = None, split: str = "validation", num_fewshot: int = 0,
                 stop_strings: list[str] | None = None, **options: Any) -> None:
        super().__init__(data_dir, **options)
        self.split = choice(split, "dataset.split", SPLITS)
        self.num_fewshot = integer(num_fewshot, "dataset.num_fewshot", low=0, high=5)  # 5 dev questions a subject
        self.stop_strings = self.stop_strings if stop_strings is None else tuple(stop_strings)

    def rows(self, split: str) -> list[Row]:
        """The usable rows of `split` by subject (a stable sort); a clear error if the source does not have it."""
        if self.data_dir and SPLITS[split] is None:
            raise NoLocalCopyError(
                f"MMLU {split}: no local copy exists (only the test split, {SPLITS['test']}, under "
                f"data_dir={self.data_dir}); run with dataset.split=test"
                + (" dataset.num_fewshot=0" if split == "dev" else "") + f", or unset data_dir to load cais/mmlu "
                f"({split}) from the hub")
        return sorted((check_row(r) for r in load_source(source(split), self.data_dir)), key=lambda r: r["subject"])

    def shots(self) -> dict[str, list[dict[str, str]]]:
        """Few-shot chat turns per subject: its first num_fewshot dev questions and their letters."""
        if not self.num_fewshot:
            return {}
        out: dict[str, list[dict[str, str]]] = {}
        for r in self.rows("dev"):
            turns = out.setdefault(r["subject"], [])
            if len(turns) < 2 * self.num_fewshot:
                turns += [{"role": "user", "content": question_text(r)},
                          {"role": "assistant", "content": LETTERS[r["answer"]]}]
        return out

    def examples(self) -> list[Example]:
        rows, shots, seen = self.rows(self.split), self.shots(), {}
        out = []
        for r in rows:
            subject = r["subject"]
            i = seen[subject] = seen.get(subject, -1) + 1
            head = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
            out.append(fewshot_example(f"{subject}-{i:03d}", head, shots.get(subject, []), question_text(r),
                                       LETTERS[r["answer"]], {"subject": subject, "choices": r["choices"]}))
        return out

    def score(self, example: Example, output: str) -> dict[str, Any]:
        pred = extract_letter(output, example.meta["choices"])
        return {"score": float(pred == example.reference), "pred": pred, "answer": example.reference,
                "reference": example.reference, "extracted": pred, "subject": example.meta["subject"],
                "split": self.split}

    def reference(self, example: Example) -> str:
        """The right answer's letter."""
        return example.reference

    def answer_complete(self, example: Example, output: str) -> bool:
        """An answer letter can be read from the output."""
        return extract_letter(output, example.meta["choices"]) is not None
