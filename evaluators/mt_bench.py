"""`mt_bench`: MT-bench's 80 two-turn questions (Zheng et al., 2023); no accuracy here (it needs a judge).

Source: hub `HuggingFaceH4/mt_bench_prompts` (split train: `prompt` = the two turns, `category`, `reference`, and a
`prompt_id` hash), or FastChat's `mt_bench/question.jsonl` under the local data folder (`turns`, `question_id`
81..160). Hub rows take FastChat's ids by position (the hub set is FastChat's file in its order); every row carries
`prompt_id`, the hub's hash computed from the text, so rows from either source match by content. The second turn is
asked after the model's own first answer (`Example.turns`).
"""

from __future__ import annotations

import hashlib

from specbench.evaluators.spec_bench import multi_turn_example
from specbench.data.dataset import DATASETS, Evaluator, Example, Row, Source, load_source

SOURCE = Source("MT-bench", hub="HuggingFaceH4/mt_bench_prompts", hub_split="train", local="mt_bench/question.jsonl")
FIRST_ID = 81


def prompt_id(turns: list[str]) -> int:
    """HuggingFaceH4/mt_bench_prompts' prompt_id: sha256 of the joined turns, mod 10^8."""
    return int(hashlib.sha256("".join(turns).encode("utf-8")).hexdigest(), 16) % 10**8


def normalize(row: Row, index: int) -> Row:
    """A row of either schema as FastChat's (question_id, category, turns, reference), keeping its origin."""
    if "turns" in row:
        return row
    return Row({"question_id": FIRST_ID + index, "category": row["category"], "turns": row["prompt"],
                "reference": row.get("reference") or None}, row.origin)


@DATASETS.register("mt_bench")
class MTBench(Evaluator):
    """MT-bench questions, two turns each; not scored."""

    name = "mt_bench"
    meta_fields = ("category", "prompt_id")

    def examples(self) -> list[Example]:
        rows = [normalize(r, i) for i, r in enumerate(load_source(SOURCE, self.data_dir))]
        out = []
        for r in rows:
            ex = multi_turn_example(r["question_id"], r.text("category"), r.texts("turns"), r.get("reference"))
            ex.meta["prompt_id"] = prompt_id(ex.turns or [ex.prompt])
            out.append(ex)
        return out
