"""SPEED-Bench (`dataset=speed_bench`): its files in the exact format (tests/data/synthetic/speed, Parquet as
prepare_data.py writes it; NeMo-Skills' JSON Lines), placeholders refused with the command that fills them, limit and
shard per category, and a run's rows grouped per category in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import SYNTHETIC, compose_cfg, small
from specbench.analysis import load, report
from specbench.common.options import OptionError
from specbench.data.dataset import DataSourceError, build_dataset, select
from specbench.evaluators.speed_bench import PLACEHOLDER
from specbench.runs.runner import run
from omegaconf import OmegaConf


def dataset(*overrides: str, data_dir: Path | None = SYNTHETIC):
    node = OmegaConf.to_container(compose_cfg("dataset=speed_bench", *overrides).dataset, resolve=True)
    node["data_dir"] = None if data_dir is None else str(data_dir)
    return build_dataset(node)


def test_the_quality_split_loads_with_its_categories_and_turns():
    ev = dataset()
    ex = ev.examples()
    assert len(ex) == 12 and [e.meta["category"] for e in ex[:3]] == ["coding", "math", "writing"]
    assert all(len(e.id) == 32 for e in ex)  # the real question_id's length
    writing = [e for e in ex if e.meta["category"] == "writing"]
    assert writing[0].turns == [writing[0].prompt, "Now make it half as long."]  # a multi-turn row
    assert writing[1].turns is None
    assert ev.score(ex[0], "anything") == {"score": None, "category": "coding", "bucket": "qualitative"}


def test_limit_and_shard_select_per_category():
    ev = dataset()
    ex = ev.examples()
    two = select(ex, 2, None, ev.stratum)
    assert [e.meta["category"] for e in two] == ["coding", "coding", "math", "math", "writing", "writing"]
    assert two[0].id == ex[0].id and two[1].id == ex[3].id  # each category's first two, in the file's order
    odd = select(ex, None, "1/2", ev.stratum)
    assert [e.id for e in odd if e.meta["category"] == "math"] == [e.id for e in ex if e.meta["category"] == "math"][1::2]
    with pytest.raises(OptionError, match="stratum 'coding'"):
        select(ex, 2, "2/3", ev.stratum)  # 2 per category cannot make 3 shards
    # a dataset without strata: the first `limit` of the whole set, as before
    assert select(ex, 2, None) == ex[:2]


def test_a_throughput_bucket_has_three_entropy_tiers():
    ev = dataset("dataset.config=throughput_1k")
    ex = select(ev.examples(), 1, None, ev.stratum)
    assert [e.meta["category"] for e in ex] == ["low_entropy", "mixed", "high_entropy"]
    assert ev.score(ex[0], "")["bucket"] == "throughput_1k"


def test_placeholders_are_refused_with_the_preparation_command(tmp_path):
    rows = pq.read_table(SYNTHETIC / "speed" / "qualitative" / "test.parquet").to_pylist()
    rows[4]["turns"] = [PLACEHOLDER + "\n\nSummarize: {article}"]
    rows[7]["turns"] = [PLACEHOLDER]
    (tmp_path / "speed" / "qualitative").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "speed" / "qualitative" / "test.parquet")
    with pytest.raises(DataSourceError) as err:
        dataset(data_dir=tmp_path).examples()
    msg = str(err.value)
    assert rows[4]["question_id"] in msg and "1 more rows" in msg and "row 5" in msg
    assert "python3 prepare_data.py --dataset speed --config qualitative" in msg


def test_nemo_skills_jsonl_and_a_folder_path_read_the_same_prompts(tmp_path):
    rows = pq.read_table(SYNTHETIC / "speed" / "qualitative" / "test.parquet").to_pylist()
    nemo = [{**{k: v for k, v in r.items() if k != "turns"},
             "messages": [{"role": "user", "content": t} for t in r["turns"]]} for r in rows]
    (tmp_path / "qualitative.jsonl").write_text("".join(json.dumps(r) + "\n" for r in nemo))
    want = [(e.id, e.prompt, e.turns) for e in dataset().examples()]
    assert [(e.id, e.prompt, e.turns) for e in dataset(f"dataset.path={tmp_path}").examples()] == want
    assert [(e.id, e.prompt, e.turns) for e in
            dataset(f"dataset.path={tmp_path / 'qualitative.jsonl'}", data_dir=None).examples()] == want


def test_bad_config_and_missing_files_name_what_is_valid(tmp_path):
    with pytest.raises(OptionError, match="dataset.config.*qualitative.*throughput_32k"):
        dataset("dataset.config=throughput_4k")
    with pytest.raises(DataSourceError, match=r"speed/throughput_8k/test.parquet"):
        dataset("dataset.config=throughput_8k").examples()  # not in the fixture folder
    with pytest.raises(DataSourceError, match="no such file or folder"):
        dataset(f"dataset.path={tmp_path / 'absent'}").examples()


def test_a_run_groups_its_rows_per_category_in_the_report(tmp_path):
    over = ("dataset=speed_bench", f"dataset.data_dir={SYNTHETIC}", "limit=2", "decode.max_new_tokens=8")
    run(small(*over, "method=ar"), tmp_path / "ar")
    run(small(*over, "method=vanilla", "method.gamma=3"), tmp_path / "vanilla")
    rows = [json.loads(line) for line in (tmp_path / "vanilla" / "rows.jsonl").read_text().splitlines()]
    assert sorted(r["category"] for r in rows) == ["coding"] * 2 + ["math"] * 2 + ["writing"] * 2
    assert {r["bucket"] for r in rows} == {"qualitative"}
    rep = report.build_report(load.load_runs(tmp_path))
    t = next(t for t in rep.tables if t.name == "categories")
    labels = [r for _, r in t.values.index]
    assert "vanilla · math" in labels and "ar · writing" in labels
    v = t.values.droplevel(0)
    assert v.loc["vanilla · coding", ("", "prompts")] == 2
    math_rows = [r for r in rows if r["category"] == "math"]
    assert v.loc["vanilla · math", ("", "τ")] == pytest.approx(
        sum(r["new_tokens"] for r in math_rows) / sum(r["target_calls"] for r in math_rows))
    assert v.loc["ar · math", ("", "speedup vs ar")] == pytest.approx(1.0)


def test_local_throughput_files_have_the_schema_and_the_input_lengths(tmp_path, tiny_pair):
    """specbench.data.speed_local from the synthetic sets: one file per bucket in SPEED-Bench's schema, 3 tiers, each
    prompt within 2 tokens of the bucket's length in the pair's tokenizer, read back by dataset=speed_bench."""
    from specbench.data.speed_local import make

    tok = tiny_pair.tokenizer
    (path,) = make(SYNTHETIC, tok, [1000], 1, tmp_path)
    assert path == tmp_path / "speed" / "throughput_1k" / "test.parquet"
    assert pq.read_schema(path).names == ["question_id", "category", "sub_category", "turns", "source", "src_id",
                                          "difficulty", "multiturn"]
    ex = dataset("dataset.config=throughput_1k", data_dir=tmp_path).examples()
    assert [e.meta["category"] for e in ex] == ["low_entropy", "mixed", "high_entropy"]
    for e in ex:
        assert abs(len(tok(e.prompt, add_special_tokens=False)["input_ids"]) - 1000) <= 2
    with pytest.raises(ValueError, match="multiples of 1000"):
        make(SYNTHETIC, tok, [1500], 1, tmp_path)
