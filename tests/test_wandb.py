"""logger=wandb: an offline run's files hold the run's config, summary and rows; a failure changes nothing.

The offline run file (wandb/offline-run-*/run-*.wandb) is read here with a small reader of its
record format (LevelDB log blocks of wandb's protobuf Records), independently of the logging code.
"""

import json
import logging
import struct
from pathlib import Path

import pytest

from helpers import TIMING, small
from specbench.runs import wandb_log
from specbench.runs.runner import run

JOB = ["limit=3", "decode.max_new_tokens=8", "decode=t1"]


def wandb_records(run_file: Path) -> list:
    """The protobuf Records of a .wandb file: 7-byte file header, then 32 KiB blocks of chunked records."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, out = run_file.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # FULL or LAST chunk: a record is complete
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
        elif kind == 0 and n == 0:
            buf = b""
    return out


def offline_run(run_dir: Path) -> tuple[dict, dict, Path]:
    """(summary items, config items, run folder) of the one offline wandb run under run_dir/wandb.

    `run.finish()` returns once the run's exit record is handled, but it only *informs* wandb's service
    process that the run is done (a message it does not wait on): the service writes the rest of the
    .wandb file and closes it afterwards. Read at once on a busy machine, the file can still lack its
    summary records. `wandb.teardown()` waits for the service process to exit, which closes every run
    file, so the file read below is complete.
    """
    import wandb

    wandb.teardown()
    (folder,) = list((run_dir / "wandb").glob("offline-run-*"))
    summary, config = {}, {}
    for rec in wandb_records(next(folder.glob("run-*.wandb"))):
        kind = rec.WhichOneof("record_type")
        if kind == "summary":
            summary.update({u.key: json.loads(u.value_json) for u in rec.summary.update if u.key})
        elif kind in ("config", "run"):  # the run record carries the config given to wandb.init
            updates = rec.config.update if kind == "config" else rec.run.config.update
            config.update({u.key: json.loads(u.value_json) for u in updates if u.key})
    return summary, config, folder


def test_offline_run_holds_config_summary_and_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "run"
    returned = run(small("logger=wandb", "logger.tags=[test]", *JOB), out)
    saved = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    summary, config, folder = offline_run(out)
    # the summary's numbers, as summary.json has them
    assert summary["n_examples"] == 3 == saved["n_examples"]
    assert summary["total_new_tokens"] == sum(r["new_tokens"] for r in rows)
    assert summary["acceptance_rate"] == pytest.approx(saved["acceptance_rate"])
    assert summary["example_means/block_efficiency"] == pytest.approx(saved["example_means"]["block_efficiency"])
    assert summary["tokens_per_s"] == pytest.approx(returned["tokens_per_s"])
    # the resolved config and provenance
    assert config["config"]["method"] == saved["config"]["method"] and config["config"]["decode"]["temperature"] == 1.0
    assert config["git_hash"] == saved["git_hash"] and config["choices"]["pair"] == "tiny_random"
    # the rows table: one line per example, as rows.jsonl
    (table,) = list(folder.glob("files/media/table/rows_*.table.json"))
    t = json.loads(table.read_text())
    assert [r[t["columns"].index("id")] for r in t["data"]] == [r["id"] for r in rows]
    assert [r[t["columns"].index("new_tokens")] for r in t["data"]] == [r["new_tokens"] for r in rows]
    assert "token_ids" not in t["columns"] and "output" in t["columns"]


def test_a_wandb_failure_leaves_the_run_intact(tmp_path, caplog):
    """wandb.init refusing a bad setting (mode=bogus): a warning, and the same files as without a logger."""
    plain = tmp_path / "plain"
    run(small(*JOB), plain)
    out = tmp_path / "failing"
    with caplog.at_level(logging.WARNING, logger="specbench.runs.wandb_log"):
        s = run(small("logger=wandb", "logger.mode=bogus", *JOB), out)
    assert "wandb logging failed" in caplog.text and "bogus" in caplog.text
    assert s["n_examples"] == 3
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in plain.iterdir())
    a, b = ([{k: v for k, v in json.loads(line).items() if k not in TIMING}  # times and the machine's load differ
             for line in (d / "rows.jsonl").read_text().splitlines()] for d in (plain, out))
    assert a == b
    assert json.loads((out / "summary.json").read_text())["n_examples"] == 3


def test_a_failure_after_init_finishes_the_wandb_run(tmp_path, monkeypatch, caplog):
    """An exception while logging (here: the table) is caught, the wandb run is closed, the run completes."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")

    def broken_table(*args, **kwargs):
        raise RuntimeError("table upload broke")

    monkeypatch.setattr(wandb, "Table", broken_table)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="specbench.runs.wandb_log"):
        s = run(small("logger=wandb", *JOB), out)
    assert "table upload broke" in caplog.text and s["n_examples"] == 3
    assert wandb.run is None  # finished, not left open for the next run of a sweep
    assert json.loads((out / "summary.json").read_text())["n_examples"] == 3


def test_unknown_logger_names_the_valid_ones(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="specbench.runs.wandb_log"):
        assert wandb_log.log_run({"name": "tensorboard"}, tmp_path, {}, []) is False
    assert "tensorboard" in caplog.text and "none, wandb" in caplog.text
    assert wandb_log.log_run({"name": "none"}, tmp_path, {}, []) is False
    assert wandb_log.log_run(None, tmp_path, {}, []) is False
    assert not list(tmp_path.iterdir())


def test_flatten_and_rows_table():
    assert wandb_log.flatten({"a": 1, "b": {"c": 2.5, "d": [1, 2]}, "e": None}) == {"a": 1, "b/c": 2.5, "e": None}
    cols, data = wandb_log.rows_table([{"id": "x", "token_ids": [1], "m": {"k": 1}}, {"id": "y", "z": 3}])
    assert cols == ["id", "m", "z"] and data == [["x", "{'k': 1}", None], ["y", None, 3]]
