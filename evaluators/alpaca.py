"""`alpaca` (Stanford Alpaca's 52k instructions) and `alpaca_eval` (AlpacaEval's 805); no accuracy.

`alpaca`: hub `tatsu-lab/alpaca` (split train; the SD2 paper's Alpaca) only: offline it fails naming it. `alpaca_eval`:
hub `tatsu-lab/alpaca_eval` (its alpaca_eval.json through datasets' json builder: datasets >= 4 does not run the
repo's loading script), or `alpaca_eval/instructions_805.json` under the local data folder; rows carry the
instruction's origin (`subset`: helpful_base, koala, oasst, selfinstruct, vicuna).
"""

from __future__ import annotations

from specbench.data.dataset import DATASETS, DataSourceError, Evaluator, Example, Row, Source, load_source

ALPACA = Source("Alpaca", hub="tatsu-lab/alpaca", hub_split="train")
ALPACA_EVAL = Source("AlpacaEval", hub="json", hub_files="hf://datasets/tatsu-lab/alpaca_eval/alpaca_eval.json",
                     hub_split="train", local="alpaca_eval/instructions_805.json")


def instruction_prompt(row: Row) -> str:
    """The instruction, then its input (if any) after a blank line."""
    extra = (row.text("input", optional=True) or "").strip()
    return row.text("instruction").strip() + (f"\n\n{extra}" if extra else "")


@DATASETS.register("alpaca")
class Alpaca(Evaluator):
    """Alpaca instructions (hub only); not scored."""

    name = "alpaca"

    def examples(self) -> list[Example]:
        try:
            rows = load_source(ALPACA, self.data_dir)
        except DataSourceError as err:
            raise type(err)(f"{err}. (AlpacaEval's 805 instructions, a different set, have a local copy: "
                            "dataset=alpaca_eval)") from err
        return [Example(id=f"alpaca-{i:05d}", prompt=instruction_prompt(r), reference=r.get("output"))
                for i, r in enumerate(rows)]


@DATASETS.register("alpaca_eval")
class AlpacaEval(Evaluator):
    """AlpacaEval's 805 instructions; not scored."""

    name = "alpaca_eval"
    meta_fields = ("subset",)

    def examples(self) -> list[Example]:
        return [Example(id=f"alpaca_eval-{i:03d}", prompt=instruction_prompt(r), meta={"subset": r.get("dataset")})
                for i, r in enumerate(load_source(ALPACA_EVAL, self.data_dir))]
