"""`speed_bench`: SPEED-Bench (NVIDIA, 2026), its quality split by category and its throughput split by input length.

Configs (option `config`, the benchmark's own config names): `qualitative`, 880 prompts, 80 in each of 11 categories
(some multi-turn); `throughput_1k` .. `throughput_32k`, 1536 prompts of about that many input tokens (1k = 1000 tokens
of tiktoken o200k_base), 512 in each of three entropy tiers, which the rows' `category` holds (low_entropy, mixed,
high_entropy).

Format (the hub dataset nvidia/SPEED-Bench, and the file its preparation script writes): Parquet rows of question_id
(32 characters), category, sub_category, turns (the user turns, a list of strings), source, src_id, difficulty,
multiturn. NVIDIA Model-Optimizer's examples/specdec_bench/prepare_data.py writes one file per config,
`data/speed/<config>/test.parquet`: set dataset.data_dir to that `data/` folder (or dataset.path to a file or folder of
such files). NeMo-Skills' preparation writes `<config>.jsonl` rows with `messages` ([{role, content}]) in place of
`turns`; both are read. The hub copy's placeholder rows (PLACEHOLDER, where it cannot redistribute a prompt) are
refused, naming the row and the command that fills them. `limit` and `shard` select per category or tier (`stratum`).
Rows carry `category` and `bucket` (the config); no accuracy.
"""

from __future__ import annotations

from pathlib import Path

from specbench.common.options import choice
from specbench.data.dataset import DATASETS, DataSourceError, Evaluator, Example, Row, Source, load_source, read_local
from specbench.evaluators.spec_bench import multi_turn_example

CONFIGS = ("qualitative", "throughput_1k", "throughput_2k", "throughput_8k", "throughput_16k", "throughput_32k")
PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
PREPARE = ("prepare the real prompts with NVIDIA Model-Optimizer's examples/specdec_bench: `python3 prepare_data.py "
           "--dataset speed --config {config}` (it writes data/speed/{config}/test.parquet), then set "
           "dataset.data_dir to that data/ folder")


def source(config: str) -> Source:
    return Source(f"SPEED-Bench {config}", hub="nvidia/SPEED-Bench", hub_config=config, hub_split="test",
                  local=f"speed/{config}/test.parquet")


def turns_of(row: Row) -> list[str]:
    """The user turns of a row: `turns` (specdec_bench's files, the hub), else the user `messages` (NeMo-Skills')."""
    if "turns" in row or "messages" not in row:
        return row.texts("turns")
    msgs = row["messages"]
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and "content" in m for m in msgs):
        raise row.error("messages must be a list of {role, content} objects")
    return [str(m["content"]) for m in msgs if m.get("role", "user") == "user"]


@DATASETS.register("speed_bench")
class SpeedBench(Evaluator):
    """SPEED-Bench prompts of one config; not scored (speed and acceptance per category or tier)."""

    name = "speed_bench"
    meta_fields = ("category", "bucket")

    def __init__(self, data_dir: str | None = None, config: str = "qualitative", path: str | None = None) -> None:
        super().__init__(data_dir)
        self.config = choice(config, "dataset.config", CONFIGS)
        self.path = path

    def rows(self) -> list[Row]:
        """The config's rows, or with dataset.path those of a file or of every .parquet / .jsonl file under a folder
        (sorted by path)."""
        if not self.path:
            return load_source(source(self.config), self.data_dir)
        path = Path(self.path).expanduser()
        if path.is_file():
            return read_local(path)
        if not path.is_dir():
            raise DataSourceError(f"dataset.path={path}: no such file or folder")
        files = sorted(p for p in path.rglob("*") if p.name.endswith((".parquet", ".jsonl")))
        if not files:
            raise DataSourceError(f"dataset.path={path}: the folder holds no .parquet or .jsonl file")
        return [r for f in files for r in read_local(f)]

    def examples(self) -> list[Example]:
        out, held = [], []
        for r in self.rows():
            turns = turns_of(r)
            if not turns:
                raise r.error("no user turn")
            if any(t.startswith(PLACEHOLDER) for t in turns):
                held.append(r)
                continue
            ex = multi_turn_example(r.text("question_id"), r.text("category"), turns)
            ex.meta.update({"bucket": self.config, **{k: r.get(k) for k in ("sub_category", "source", "difficulty")}})
            out.append(ex)
        if held:
            raise held[0].error(f"question_id {held[0].get('question_id')} (and {len(held) - 1} more rows) holds "
                                "SPEED-Bench's placeholder, not its prompt: the hub copy leaves out the prompts of "
                                f"sources it cannot redistribute; {PREPARE.format(config=self.config)}")
        return out

    def stratum(self, example: Example) -> str:
        """limit and shard select within each category (quality split) or entropy tier (throughput split)."""
        return example.meta["category"]
