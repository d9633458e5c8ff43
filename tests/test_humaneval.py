"""HumanEval rows: a row without a needed key fails when examples are loaded, naming the file, the line and the key.

The rows are the synthetic fixtures' (tests/data/synthetic/humaneval: made-up problems in HumanEval's format).
"""

import gzip
import json
import re

import pytest

from helpers import SYNTHETIC, small
from specbench.data.dataset import DataSourceError, Example, build_dataset, read_local
from specbench.runs.runner import run

FIXTURES = SYNTHETIC / "humaneval" / "HumanEval.jsonl.gz"


def write_rows(folder, rows) -> str:
    path = folder / "humaneval" / "HumanEval.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


MISSING = object()


@pytest.mark.parametrize("key,value,words", [
    ("test", MISSING, "the row has no 'test' field"),
    ("entry_point", MISSING, "the row has no 'entry_point' field"),
    ("task_id", MISSING, "the row has no 'task_id' field"),
    ("test", None, "the row's 'test' field is null"),
    ("prompt", 3, "field 'prompt' must be a string, got 3"),
    ("entry_point", "separate paren groups", "field 'entry_point' must be a Python identifier"),
], ids=["no test", "no entry_point", "no task_id", "null test", "int prompt", "not an identifier"])
def test_a_bad_row_names_the_file_the_line_and_the_key(tmp_path, key, value, words):
    rows = [dict(r) for r in read_local(FIXTURES)[:3]]
    if value is MISSING:
        del rows[1][key]
    else:
        rows[1][key] = value
    path = write_rows(tmp_path, rows)
    with pytest.raises(DataSourceError) as err:
        build_dataset({"name": "humaneval", "data_dir": str(tmp_path)}).examples()
    assert str(err.value).startswith(f"{path}, line 2: {words}"), str(err.value)


def test_a_bad_row_stops_the_run_before_anything_is_decoded_or_written(tmp_path):
    rows = read_local(FIXTURES)[:2]
    del rows[0]["test"]
    write_rows(tmp_path / "data", rows)
    out = tmp_path / "out"
    with pytest.raises(DataSourceError, match=re.escape("HumanEval.jsonl.gz, line 1: the row has no 'test' field")):
        run(small("dataset=humaneval", f"dataset.data_dir={tmp_path / 'data'}", "decode.max_new_tokens=4"), out)
    assert not (out / "rows.jsonl").exists() and not (out / "config.json").exists()


def test_canonical_solution_is_optional(tmp_path):
    rows = read_local(FIXTURES)[:2]
    del rows[1]["canonical_solution"]
    write_rows(tmp_path, rows)
    examples = build_dataset({"name": "humaneval", "data_dir": str(tmp_path)}).examples()
    assert [e.meta["canonical_solution"] is None for e in examples] == [False, True]


def test_rows_keep_the_completion_that_ran():
    """prompt + `completion` is the code the sandbox ran: the canonical solution passes as itself; a fenced
    answer runs as its block."""
    ev = build_dataset({"name": "humaneval", "data_dir": str(SYNTHETIC)})
    ex = ev.examples()[0]
    got = ev.score(ex, ex.meta["canonical_solution"])
    assert got["passed"] and got["completion"] == ex.meta["canonical_solution"]
    fenced = f"Here it is:\n```python\n{ex.reference['prompt']}{ex.meta['canonical_solution']}```\nDone."
    got = ev.score(ex, fenced)
    assert got["passed"] and got["completion"] == "\n" + ex.reference["prompt"] + ex.meta["canonical_solution"].rstrip("\n")
    # as every scored row: `reference` (the canonical solution) and `extracted` (the completion that ran)
    assert got["reference"] == ex.meta["canonical_solution"] and got["extracted"] == got["completion"]


@pytest.mark.parametrize("output,complete", [
    ("```python\ndef f(x):\n    return x\n```\nmore", True),  # the code block was closed
    ("```python\ndef f(x):\n    return x", False),  # cut inside the block
    ("    return x\n\ndef g():", True),  # the body ended: a stop sequence follows it
    ("    return x", False),  # the body may go on
    ("def f(x):\n    return x\n", True),  # top-level code that parses
    ("def f(x):\n    return (x", False),
])
def test_the_answer_is_complete_when_its_code_ended(output, complete):
    ex = Example(id="HumanEval/0", prompt="p", reference={"entry_point": "f"})
    ev = build_dataset({"name": "humaneval", "data_dir": str(SYNTHETIC)})
    assert ev.answer_complete(ex, output) is complete
    assert ev.truncated(ex, output, ["length"]) is not complete
