"""`spec_bench`: Spec-Bench's 480 questions in 13 categories (Xia et al., 2024); no accuracy, results per category.

Source: the benchmark's own file, hemingkx/Spec-Bench data/spec_bench/question.jsonl, downloaded as is from GitHub
(not on the hub; its `reference` column mixes strings and lists, which datasets' json builder rejects), or
`spec_bench/question.jsonl` under the local data folder. The first 80 questions are MT-bench's, two turns each
(`Example.turns`); the other 400 single-turn. Rows carry `category` (13 values, GammaTune's Figure 1 groups) and
`task` (Spec-Bench's 6: mt_bench, translation, summarization, qa, math_reasoning, rag).
"""

from __future__ import annotations

from typing import Any

from specbench.data.dataset import DATASETS, Evaluator, Example, Source, load_source

URL = "https://raw.githubusercontent.com/hemingkx/Spec-Bench/main/data/spec_bench/question.jsonl"
SOURCE = Source("Spec-Bench", url=URL, local="spec_bench/question.jsonl")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def multi_turn_example(qid: Any, category: str, turns: list[str], reference: Any = None) -> Example:
    """An MT-bench-style item: `prompt` is the first turn, `turns` all of them when there are several."""
    turns = [str(t) for t in turns]
    return Example(id=str(qid), prompt=turns[0], turns=turns if len(turns) > 1 else None, reference=reference,
                   meta={"category": category})


@DATASETS.register("spec_bench")
class SpecBench(Evaluator):
    """Spec-Bench questions; not scored (speed per category)."""

    name = "spec_bench"

    def examples(self) -> list[Example]:
        return [multi_turn_example(r["question_id"], r.text("category"), r.texts("turns"), r.get("reference"))
                for r in load_source(SOURCE, self.data_dir)]

    def score(self, example: Example, output: str) -> dict[str, Any]:
        cat = example.meta["category"]
        return {"score": None, "category": cat, "task": "mt_bench" if cat in MT_BENCH_CATEGORIES else cat}
