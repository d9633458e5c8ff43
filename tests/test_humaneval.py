"""HumanEval rows: a row without a needed key fails when examples are loaded, naming the file, the row and the key."""

import gzip
import json
import re

import pytest

from conftest import ROOT, small
from specbench.data import DataSourceError, build_dataset, read_local
from specbench.runner import run

DATA = ROOT.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"local benchmark copies not found at {DATA}")


def write_rows(folder, rows) -> str:
    path = folder / "humaneval" / "HumanEval.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


@pytest.mark.parametrize("change,words", [
    ({"test": None}, ["row 2", "(task_id 'HumanEval/1')", "has no key 'test'"]),
    ({"entry_point": None}, ["row 2", "has no key 'entry_point'"]),
    ({"task_id": None}, ["row 2", "(task_id None)", "has no key 'task_id'"]),
    ({"prompt": 3}, ["row 2", "has a int (not a string) as 'prompt'"]),
    ({"entry_point": "separate paren groups"}, ["row 2", "is not a Python identifier"]),
], ids=["test", "entry_point", "task_id", "prompt", "identifier"])
def test_a_bad_row_names_the_file_the_row_and_the_key(tmp_path, change, words):
    rows = read_local(DATA / "humaneval" / "HumanEval.jsonl.gz")[:3]
    for key, value in change.items():
        if value is None:
            del rows[1][key]
        else:
            rows[1][key] = value
    path = write_rows(tmp_path, rows)
    with pytest.raises(DataSourceError) as err:
        build_dataset({"name": "humaneval", "data_dir": str(tmp_path)}).examples()
    assert str(err.value).startswith(f"HumanEval: {path}: ")
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "task_id, prompt, test, entry_point" in str(err.value) or "identifier" in str(err.value)


def test_a_bad_row_stops_the_run_before_anything_is_decoded_or_written(tmp_path):
    rows = read_local(DATA / "humaneval" / "HumanEval.jsonl.gz")[:2]
    del rows[0]["test"]
    write_rows(tmp_path / "data", rows)
    out = tmp_path / "out"
    with pytest.raises(DataSourceError, match=re.escape("row 1 (task_id 'HumanEval/0') has no key 'test'")):
        run(small("dataset=humaneval", f"dataset.data_dir={tmp_path / 'data'}", "decode.max_new_tokens=4"), out)
    assert not (out / "rows.jsonl").exists() and not (out / "config.json").exists()


def test_canonical_solution_is_optional(tmp_path):
    rows = read_local(DATA / "humaneval" / "HumanEval.jsonl.gz")[:2]
    del rows[1]["canonical_solution"]
    write_rows(tmp_path, rows)
    examples = build_dataset({"name": "humaneval", "data_dir": str(tmp_path)}).examples()
    assert [e.meta["canonical_solution"] is None for e in examples] == [False, True]
