"""The `files` evaluator: a dataset of prompts (and references) from a local file or the hub, chosen by a YAML alone."""

import gzip
import json
import re
import shutil

import pyarrow
import pyarrow.parquet
import pytest
from omegaconf import OmegaConf

import specbench.data.dataset as data
import specbench.data.sources as sources
from helpers import ROOT, compose_cfg, small
from specbench.common.options import OptionError
from specbench.common.registry import UnknownNameError
from specbench.data.dataset import DataSourceError, build_dataset
from specbench.runs.runner import run

PROMPTS = ROOT / "tests" / "data" / "prompts.jsonl"  # the file conf/dataset/local_prompts.yaml reads
ROWS = [json.loads(line) for line in PROMPTS.read_text().splitlines()]


def dataset(**options):
    """conf/dataset/local_prompts.yaml (read from the repository root) with `options` replaced."""
    cfg = OmegaConf.to_container(compose_cfg("dataset=local_prompts").dataset, resolve=True)
    cfg["path"] = str(ROOT / cfg["path"])
    return build_dataset({**cfg, **options})


def key(e):
    return e.id, e.prompt, e.reference


def write_parquet(path, rows):
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    return str(path)


def test_the_example_yaml_loads_its_file_under_its_own_name():
    ev = dataset()
    examples = ev.examples()
    assert ev.name == "local_prompts" and isinstance(ev, data.DATASETS.get("files"))
    assert [e.id for e in examples] == [r["id"] for r in ROWS]
    assert examples[0].prompt == ROWS[0]["prompt"] and examples[1].reference == ["42"]
    assert examples[2].reference == ["red", "green", "blue"]


def test_jsonl_gzip_json_and_parquet_give_the_same_examples(tmp_path):
    with gzip.open(tmp_path / "p.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(PROMPTS.read_text())
    (tmp_path / "p.json").write_text(json.dumps(ROWS))
    parquet_rows = [{**r, "answer": r["answer"] if isinstance(r["answer"], list) else [str(r["answer"])]}
                    for r in ROWS]  # one column type: a list of strings
    write_parquet(tmp_path / "p.parquet", parquet_rows)
    want = [key(e) for e in dataset().examples()]
    for name in ("p.jsonl.gz", "p.json", "p.parquet"):
        assert [key(e) for e in dataset(path=str(tmp_path / name)).examples()] == want, name


def test_ids_default_to_the_dataset_name_and_row_index():
    assert [e.id for e in dataset(id_field=None).examples()] == [f"local_prompts-{i:05d}" for i in range(len(ROWS))]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_missing_field_names_the_file_the_row_and_the_field(tmp_path, kind):
    rows = [dict(r) for r in ROWS]
    del rows[2]["answer"]
    if kind == "jsonl":
        path = tmp_path / "p.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        where = f"{path}, line 3"
    else:
        path = tmp_path / "p.parquet"
        write_parquet(path, [{k: str(v) for k, v in r.items()} for r in rows])  # the row's answer is null
        where = f"{path}, row 3"
    with pytest.raises(DataSourceError) as err:
        dataset(path=str(path)).examples()
    assert str(err.value).startswith(f"{where}: the row") and "'answer' field" in str(err.value), str(err.value)


@pytest.mark.parametrize("field,value,words", [
    ("prompt", 3, "field 'prompt' must be a string, got 3"),
    ("answer", [], "field 'answer' must be a string, a number or a non-empty list of them, got []"),
    ("answer", {"a": 1}, "field 'answer' must be a string, a number or a non-empty list of them"),
])
def test_a_field_of_the_wrong_kind_names_the_line(tmp_path, field, value, words):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({**r, field: value} if i == 1 else r) + "\n" for i, r in enumerate(ROWS)))
    with pytest.raises(DataSourceError, match=re.escape(f"{path}, line 2: {words}")):
        dataset(path=str(path)).examples()


@pytest.mark.parametrize("scoring,output,score", [
    ("exact_match", " Paris\n", 1.0), ("exact_match", "Paris.", 0.0), ("exact_match", "The capital is Paris", 0.0),
    ("contains", "The capital is Paris.", 1.0), ("contains", "paris", 0.0), ("contains", "Lyon", 0.0),
    ("none", "Paris", None),
])
def test_scoring_of_one_output(scoring, output, score):
    """A scored row keeps the references and what was compared: the stripped output (exact_match), or the
    reference found in it (contains)."""
    ev = dataset(scoring=scoring)
    found = {"exact_match": output.strip(), "contains": "Paris" if score else None}
    want = {"score": score} if scoring == "none" else {"score": score, "reference": ["Paris"],
                                                        "extracted": found[scoring]}
    assert ev.score(ev.examples()[0], output) == want


@pytest.mark.parametrize("scoring", ["exact_match", "contains"])
def test_every_reference_answer_scores_full_marks(scoring):
    ev = dataset(scoring=scoring)
    examples = ev.examples()
    assert [ev.score(e, ev.reference(e))["score"] for e in examples] == [1.0] * len(ROWS)
    assert ev.score(examples[2], "blue")["score"] == 1.0  # any reference counts
    assert ev.score(examples[2], "Blue, I think.")["score"] == 0.0  # compared as written
    assert ev.score(examples[1], "41")["score"] == 0.0


def test_hub_sets_load_through_datasets(monkeypatch):
    calls = []

    def fake_hub(path, config, split, data_files):
        calls.append((path, config, split, data_files))
        return [dict(r) for r in ROWS]

    monkeypatch.setattr(sources, "load_hub", fake_hub)
    ev = dataset(path=None, hub="org/prompts", split="test", subset="en")
    assert [key(e) for e in ev.examples()] == [key(e) for e in dataset().examples()]
    assert calls == [("org/prompts", "en", "test", None)]


def test_a_hub_set_that_cannot_be_loaded_names_it():
    with pytest.raises(DataSourceError, match=r"dataset 'local_prompts': could not load org/no_such_set \(split test\)"):
        dataset(path=None, hub="org/no_such_set", split="test").examples()  # offline in tests


@pytest.mark.parametrize("options,words", [
    ({"path": None}, "set exactly one of dataset.path (a local .jsonl, .json or .parquet file) and dataset.hub"),
    ({"hub": "org/set"}, "set exactly one of dataset.path"),
    ({"split": "test"}, "dataset.split and dataset.subset choose part of a hub set"),
    ({"scoring": "rouge"}, "dataset.scoring must be one of none, exact_match, contains, got 'rouge'"),
    ({"reference_field": None}, "dataset.scoring=contains needs dataset.reference_field"),
    ({"prompt_field": 3}, "dataset.prompt_field must be a string, got 3"),
    ({"stop_strings": "\n"}, "dataset.stop_strings must be a list of strings"),
    ({"data_dir": "x"}, "dataset 'local_prompts' got unknown options ['data_dir']; valid options: hub, id_field, path"),
])
def test_bad_options_name_their_key(options, words):
    with pytest.raises(OptionError, match=re.escape(words)):
        dataset(**options)


def test_an_unknown_evaluator_names_the_key_and_lists_the_valid_ones():
    with pytest.raises(UnknownNameError, match=r"dataset.evaluator of dataset 'local_prompts': unknown dataset "
                                               r"'filez'; valid names: .*files, .*gsm8k"):
        dataset(evaluator="filez")


@pytest.mark.parametrize("name,words", [
    ("missing.jsonl", "dataset 'local_prompts': file {} not found (dataset.path={})"),
    ("p.csv", "{}: unknown data file type; expected .jsonl, .json, .jsonl.gz, .json.gz or .parquet"),
    ("p.parquet", "{}: cannot be read as Parquet"),
    ("p.jsonl", "{}: the file is empty"),
])
def test_a_file_that_cannot_be_read_is_named(tmp_path, name, words):
    path = tmp_path / name
    if name != "missing.jsonl":
        path.write_text("" if name == "p.jsonl" else "id,prompt\n1,hi\n")
    with pytest.raises(DataSourceError, match=re.escape(words.format(path, path))):
        dataset(path=str(path)).examples()


def test_a_run_records_the_dataset_name_and_its_scores(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the YAML's relative path
    summary = run(small("method=vanilla", "dataset=local_prompts", "limit=2", "decode.max_new_tokens=4",
                        "dataset.scoring=exact_match", "dataset.stop_strings=[STOP]"), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert summary["dataset"] == "local_prompts" and summary["n_examples"] == 2
    assert [r["id"] for r in rows] == ["capital-fr", "add-17-25"]
    assert all(r["dataset"] == "local_prompts" and r["score"] in (0.0, 1.0) for r in rows)
    # every row keeps the file's own answer field, as strings, and the output it compared (exact_match: stripped)
    assert [r["reference"] for r in rows] == [["Paris"], ["42"]] and [r["reference"] for r in rows] == [
        [str(x["answer"])] for x in ROWS[:2]]
    assert all(r["extracted"] == r["output"].strip() for r in rows)


def test_a_copied_yaml_is_a_new_dataset(tmp_path):
    """Only a YAML: another name and file, through the composed config and the command line."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    text = (conf / "dataset" / "local_prompts.yaml").read_text()
    (conf / "dataset" / "my_prompts.yaml").write_text(text.replace("name: local_prompts", "name: my_prompts"))
    write_parquet(tmp_path / "mine.parquet", [{"question": "Say yes.", "target": "yes"}])
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=["dataset=my_prompts", f"dataset.path={tmp_path / 'mine.parquet'}",
                                           "dataset.prompt_field=question", "dataset.reference_field=target",
                                           "dataset.id_field=null", "limit=5"])
    ev = build_dataset(OmegaConf.to_container(cfg.dataset, resolve=True))
    [ex] = data.select(ev.examples(), cfg.limit, cfg.shard)
    assert (ev.name, ex.id, ex.prompt) == ("my_prompts", "my_prompts-00000", "Say yes.")
    assert ev.score(ex, "Well, yes.") == {"score": 1.0, "reference": ["yes"], "extracted": "yes"}
