"""Results are append-only and resumable; a crash leaves only complete rows."""

import json
import os

import pytest

import specbench.runs.runner as runner
from specbench.runs import validation
from helpers import TEST_DEVICE, small
from specbench.runs.results import ROWS, RowWriter, read_rows

KEYS = ("id", "token_ids", "output", "new_tokens", "iterations", "drafted", "accepted", "stop_reason")


def stable(rows):
    """The row fields that do not depend on timing."""
    return [{k: r[k] for k in KEYS} for r in rows]


class Crash(RuntimeError):
    pass


@pytest.mark.parametrize("decode", ["greedy", "t1"])
def test_resume_after_a_crash_gives_the_uninterrupted_rows(tmp_path, monkeypatch, decode):
    overrides = ("method=vanilla", f"decode={decode}", "limit=8", "decode.max_new_tokens=24")
    runner.run(small(*overrides), tmp_path / "whole")
    whole = read_rows(tmp_path / "whole" / ROWS)
    assert len(whole) == 8

    real = runner.decode_batch
    calls = {"n": 0}

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise Crash("simulated crash on the 4th example")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "decode_batch", crashing)
    with pytest.raises(Crash):
        runner.run(small(*overrides), tmp_path / "resumed")
    part = tmp_path / "resumed" / ROWS
    assert len(read_rows(part)) == 3 and not (tmp_path / "resumed" / "summary.json").exists()
    with open(part, "a") as f:
        f.write('{"id": "smoke-03", "token_ids": [1, 2')  # a row cut off mid-write by the crash
    monkeypatch.setattr(runner, "decode_batch", real)
    summary = runner.run(small(*overrides), tmp_path / "resumed")
    resumed = read_rows(part)
    assert stable(resumed) == stable(whole)
    assert summary["n_examples"] == 8
    assert all(line.endswith("}") for line in part.read_text().splitlines())  # no partial row left


def test_rerun_of_a_finished_run_adds_nothing(tmp_path):
    overrides = ("method=ar", "limit=3", "decode.max_new_tokens=8")
    runner.run(small(*overrides), tmp_path)
    before = (tmp_path / ROWS).read_text()
    runner.run(small(*overrides), tmp_path)
    assert (tmp_path / ROWS).read_text() == before


def test_extending_the_limit_appends_only_new_examples(tmp_path):
    runner.run(small("method=ar", "limit=2", "decode.max_new_tokens=8"), tmp_path)
    runner.run(small("method=ar", "limit=5", "decode.max_new_tokens=8"), tmp_path)
    assert [r["id"] for r in read_rows(tmp_path / ROWS)] == [f"smoke-0{i}" for i in range(5)]


def test_a_different_config_is_not_mixed_into_a_folder(tmp_path):
    runner.run(small("method=vanilla", "limit=2", "decode.max_new_tokens=8"), tmp_path)
    with pytest.raises(ValueError, match=r"different configuration \(saved vs now: method\.gamma \(5 vs 3\)\)"):
        runner.run(small("method=vanilla", "method.gamma=3", "limit=2", "decode.max_new_tokens=8"), tmp_path)
    assert len(read_rows(tmp_path / ROWS)) == 2


def test_summary_records_provenance(tmp_path):
    s = runner.run(small("method=vanilla", "limit=2", "decode.max_new_tokens=8"), tmp_path)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["n_examples"] == 2 and saved["seed"] == 0
    for key in ("git_hash", "versions", "device_info", "config", "choices", "peak_rss_mb"):
        assert key in saved
    assert saved["versions"]["torch"] and saved["versions"]["transformers"]
    assert saved["choices"]["method"] == "vanilla" and saved["choices"]["pair"] == "tiny_random"
    assert saved["config"]["method"]["gamma"] == 5
    assert saved["device_info"]["device"].split(":")[0] == TEST_DEVICE  # cuda in the CUDA lane
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 None) if os.path.exists("/proc/cpuinfo") else None
    assert model is None or saved["device_info"]["cpu"] == model  # the CPU's model name, not its architecture
    # token-weighted totals agree with the rows
    rows = read_rows(tmp_path / ROWS)
    assert s["total_new_tokens"] == sum(r["new_tokens"] for r in rows)
    assert s["acceptance_rate"] == pytest.approx(sum(r["accepted"] for r in rows) / sum(r["drafted"] for r in rows))
    for r in rows:
        assert r["block_efficiency"] == pytest.approx(r["new_tokens"] / r["target_calls"])
        assert r["target_calls"] == r["iterations"]


def test_row_writer_refuses_duplicates(tmp_path):
    w = RowWriter(tmp_path)
    w.append({"id": "a", "x": 1})
    with pytest.raises(ValueError, match="already"):
        w.append({"id": "a", "x": 2})
    assert RowWriter(tmp_path).done == {("a", 0)} and RowWriter(tmp_path).has("a") and not RowWriter(tmp_path).has("a", 1)


def test_resume_refuses_rows_of_another_code_version(tmp_path):
    """config.json names the code version (git hash, dirty flag) that wrote the rows; another version
    resumes only with resume_any_version=true. The recorded version is faked: tests never depend on
    the checkout's own hash."""
    job = ("method=ar", "decode.max_new_tokens=8")
    runner.run(small(*job, "limit=2"), tmp_path)
    record = json.loads((tmp_path / "config.json").read_text())
    now = validation.code_version(record)
    old = {"git_hash": "0123456789abcdef" * 2 + "01234567", "git_dirty": False}
    (tmp_path / "config.json").write_text(json.dumps({**record, **old}))
    with pytest.raises(ValueError) as refused:
        runner.run(small(*job, "limit=3"), tmp_path)
    msg = str(refused.value)
    assert f"holds rows of git {old['git_hash']}, but this is {validation.describe_version(now)}" in msg
    assert "resume_any_version=true" in msg
    assert len(read_rows(tmp_path / ROWS)) == 2
    s = runner.run(small(*job, "limit=2"), tmp_path)  # nothing left to decode: nothing is mixed
    assert s["git_hash"] == old["git_hash"] and "resumed_versions" not in s
    s = runner.run(small(*job, "limit=3", "resume_any_version=true"), tmp_path)
    assert len(read_rows(tmp_path / ROWS)) == 3
    assert json.loads((tmp_path / "config.json").read_text())["resumed_versions"] == [now]
    assert s["git_hash"] == old["git_hash"] and s["resumed_versions"] == [now]


def test_versions_in_words():
    assert validation.describe_version({"git_hash": "abc", "git_dirty": True}) == "git abc with uncommitted changes"
    assert validation.describe_version({"git_hash": "abc", "git_dirty": False}) == "git abc"
    assert "unknown version" in validation.describe_version({"git_hash": None, "git_dirty": None})


def test_measurements_are_appended_whole_and_a_cut_last_line_is_skipped(tmp_path):
    """measurements.jsonl: records appended one line each; a line a crash cut is skipped by readers and cut off by
    the next append; the first target_1 record of a set and batch size is the one read."""
    from specbench.runs import measurements

    first = {"kind": "target_1", "measure_from": 0, "batch_size": 2, "seconds": 0.5}
    measurements.append(tmp_path, first)
    with open(tmp_path / measurements.MEASUREMENTS, "a") as f:
        f.write('{"kind": "target_1", "measure_from": 0, "batch')  # a crash mid-write
    assert measurements.read(tmp_path) == [first]
    measurements.append(tmp_path, {**first, "seconds": 0.7})
    measurements.append(tmp_path, {**first, "batch_size": 4, "seconds": 0.9})
    assert measurements.target_1(tmp_path, 0, 2) == first and measurements.target_1(tmp_path, 0, 4)["seconds"] == 0.9
    assert measurements.target_1(tmp_path, 1, 2) is None
    assert [json.loads(line)["seconds"] for line in (tmp_path / measurements.MEASUREMENTS).read_text().splitlines()] == [
        0.5, 0.7, 0.9]
    with open(tmp_path / measurements.MEASUREMENTS, "a") as f:
        f.write("not json\n")  # a whole line that is not a record: an error naming it, not a silent skip
    with pytest.raises(ValueError, match=r"measurements\.jsonl, line 4: not a JSON record"):
        measurements.read(tmp_path)
