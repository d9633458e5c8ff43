"""`ultrachat`: the first user turn of UltraChat_200k's test_sft split (the SD2 paper's held-out dialogue set).

Source: hub `HuggingFaceH4/ultrachat_200k` (split test_sft, 23110 rows) only; no local copy exists, so offline it
fails with a message naming that source. The prompt is the set's `prompt` column (the conversation's first user
message); ids are positions in the split (`prompt_id` is kept in the row); not scored.
"""

from __future__ import annotations

from specbench.data.dataset import DATASETS, Evaluator, Example, Source, load_source

SOURCE = Source("UltraChat_200k test_sft", hub="HuggingFaceH4/ultrachat_200k", hub_split="test_sft")


@DATASETS.register("ultrachat")
class UltraChat(Evaluator):
    """UltraChat_200k test_sft first turns; not scored."""

    name = "ultrachat"
    meta_fields = ("prompt_id",)

    def examples(self) -> list[Example]:
        return [Example(id=f"ultrachat-{i:05d}", prompt=r.text("prompt"), meta={"prompt_id": r.get("prompt_id")})
                for i, r in enumerate(load_source(SOURCE, self.data_dir))]
