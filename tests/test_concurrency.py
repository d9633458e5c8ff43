"""One writer per run folder: a second process fails at once naming the holder (or waits for it), a killed
holder leaves no lock behind, rows read unique by id, and atomic writes never share a temporary file."""

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import ROOT, TIMING, compose_cfg, small
from specbench.runs import merge
from specbench.analysis import load
from specbench.runs.layout import job_dir
from specbench.runs.results import LOCK, ROWS, SUMMARY, FolderLocked, folder_lock, lock_timeout, read_rows
from specbench.common.files import write_json_atomic
from specbench.runs.runner import run

JOB = ("method=vanilla", "decode=t1", "decode.max_new_tokens=24")

# A process that takes a folder's lock and keeps it until killed.
HOLDER = """
import sys, time
from pathlib import Path
from specbench.runs.results import folder_lock
with folder_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(600)
"""

# A real run that stops before example `smoke-02` (after two rows) until the file `gate` exists, so the
# test knows it holds the folder while the test tries a second writer.
GATED_RUN = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import specbench.runs.runner as runner
from helpers import small
out, gate, overrides = sys.argv[2], Path(sys.argv[3]), sys.argv[4:]
real = runner.decode_batch
def gated(job, examples, trace):
    while any(ex.id == "smoke-02" for ex in examples) and not gate.exists():
        time.sleep(0.05)
    return real(job, examples, trace)
runner.decode_batch = gated
runner.run(small(*overrides), out)
"""


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def until(condition, what: str, proc: subprocess.Popen | None = None, timeout_s: float = 120) -> None:
    """Poll `condition` (no timing is asserted: the limit only keeps a broken test from hanging)."""
    end = time.time() + timeout_s
    while not condition():
        assert proc is None or proc.poll() is None, f"the process ended (exit {proc.returncode}) before {what}"
        assert time.time() < end, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()


def test_busy_folder_names_its_holder_and_a_killed_holder_leaves_no_lock(tmp_path):
    env = {**os.environ, "SLURM_JOB_ID": "4242"}
    env.pop("SLURM_ARRAY_TASK_ID", None)
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        holder = rf"pid {p.pid} on host {socket.gethostname()}, SLURM job 4242, started "
        with pytest.raises(FolderLocked, match=rf"{tmp_path} is in use by another run: {holder}"):
            with folder_lock(tmp_path):
                pass
        with pytest.raises(FolderLocked, match=rf"after waiting 0.2 s: {holder}.*wait_for_lock"):
            with folder_lock(tmp_path, 0.2):
                pass
    finally:
        kill(p)  # SIGKILL: no clean-up runs in the holder
    assert (tmp_path / LOCK).exists()  # the stale lock file stays, and blocks nothing
    with folder_lock(tmp_path):
        assert str(os.getpid()) in (tmp_path / LOCK).read_text()


def test_two_runs_on_one_folder(tmp_path, caplog):
    """A second run fails at once naming the first; a waiting one resumes after it and the rows are those of
    one uninterrupted run."""
    run(small(*JOB, "limit=6"), tmp_path / "reference")
    out, gate = tmp_path / "run", tmp_path / "gate"
    first = subprocess.Popen([sys.executable, "-c", GATED_RUN, str(ROOT / "tests"), str(out), str(gate), *JOB,
                              "limit=3"], cwd=ROOT, stderr=open(tmp_path / "first.err", "w"))
    try:
        until(lambda: len(read_rows(out / ROWS)) == 2, "two rows", first)
        with pytest.raises(FolderLocked, match=rf"{out} is in use by another run: pid {first.pid} on host"):
            run(small(*JOB, "limit=6"), out)
        assert len(read_rows(out / ROWS)) == 2

        result: dict = {}

        def waiting_run():
            try:
                result["summary"] = run(small(*JOB, "limit=6", "wait_for_lock=true"), out)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                result["error"] = e

        with caplog.at_level(logging.INFO):
            second = threading.Thread(target=waiting_run)
            second.start()
            until(lambda: "waiting for it to finish" in caplog.text or not second.is_alive(), "waiting run")
            assert "waiting for it to finish" in caplog.text and f"pid {first.pid}" in caplog.text
            gate.touch()  # the first run goes on, finishes its 3 examples and exits
            second.join(timeout=300)
        assert first.wait(timeout=60) == 0, (tmp_path / "first.err").read_text()[-2000:]
    finally:
        gate.touch()
        kill(first)
    assert not second.is_alive() and "error" not in result, result
    assert "6 examples, 3 already done, 3 to decode" in caplog.text
    assert (out / ROWS).read_text().count("\n") == 6  # no row written twice
    assert untimed(read_rows(out / ROWS)) == untimed(read_rows(tmp_path / "reference" / ROWS))
    assert result["summary"]["n_examples"] == 6


@pytest.mark.parametrize("task", ["bench", "synth", "distill"])
def test_every_task_holds_its_folder(tmp_path, task):
    with folder_lock(tmp_path):  # another writer (the same process on another descriptor is refused too)
        with pytest.raises(FolderLocked, match=f"pid {os.getpid()}"):
            run(small(f"task={task}"), tmp_path)


def test_duplicated_rows_read_once_everywhere(tmp_path):
    """rows.jsonl with ids repeated (two writers before the lock existed): every reader sees unique rows."""
    run(small("method=ar", "limit=4", "decode.max_new_tokens=8"), tmp_path)
    lines = (tmp_path / ROWS).read_text().splitlines(keepends=True)
    noise = [json.dumps({**json.loads(x), "output": "a second decode"}) + "\n" for x in lines[1:3]]
    (tmp_path / ROWS).write_text("".join(lines[:3] + noise + lines[3:] + lines[:2]))  # 9 lines, 4 ids
    (tmp_path / SUMMARY).unlink()
    rows = read_rows(tmp_path / ROWS)
    assert [r["id"] for r in rows] == [f"smoke-0{i}" for i in range(4)]
    assert [r["output"] for r in rows] == [json.loads(x)["output"] for x in lines]  # each id's first row
    s = run(small("method=ar", "limit=4", "decode.max_new_tokens=8"), tmp_path)
    assert s["n_examples"] == 4 and s["total_new_tokens"] == sum(r["new_tokens"] for r in rows)
    runs = load.load_runs(tmp_path)
    assert runs.loc[0, "n_examples"] == 4 and runs.loc[0, "finished"]
    assert len(load.load_examples(runs)) == 4
    s = run(small("method=ar", "limit=5", "decode.max_new_tokens=8"), tmp_path)
    assert s["n_examples"] == 5 and [r["id"] for r in read_rows(tmp_path / ROWS)][-1] == "smoke-04"


def test_merge_refuses_a_busy_output_folder(tmp_path):
    shards = []
    for i in range(2):
        shards.append(tmp_path / f"shard={i}/2")
        run(small("method=ar", "limit=3", "decode.max_new_tokens=8", f"shard={i}/2"), shards[-1])
    out = tmp_path / "merged"
    group = merge.group_shards([merge.load_shard(d) for d in shards])[0]
    with folder_lock(out):  # a run (or another merge) writing the folder
        with pytest.raises(merge.MergeError, match=f"{out} is in use by another run: pid {os.getpid()}"):
            merge.write_merged(group, out)
    assert merge.write_merged(group, out)["n_examples"] == 3


def test_a_run_refused_before_writing_leaves_no_folder(tmp_path):
    with pytest.raises(ValueError, match="on_long_prompt"):  # refused after loading the models
        run(small("method=vanilla", "on_long_prompt=drop"), tmp_path / "new")
    assert not (tmp_path / "new").exists()


class Nested:
    """Serialised in the middle of a write_json_atomic: writes the same file meanwhile (a second writer)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __str__(self) -> str:
        write_json_atomic(self.path, {"writer": "second"})
        return "first"


def test_concurrent_atomic_writes_of_one_file_do_not_collide(tmp_path):
    """Two writers of summary.json at once: each completes and the file is one whole version (the old
    fixed `.tmp` name made the first writer fail: the second renamed its temporary file away)."""
    path = tmp_path / SUMMARY
    write_json_atomic(path, {"writer": Nested(path)})
    assert json.loads(path.read_text()) == {"writer": "first"}
    assert [p.name for p in tmp_path.iterdir()] == [SUMMARY]  # no temporary file left


@pytest.mark.parametrize("value,expected", [(False, 0.0), (None, 0.0), (True, None), (30, 30.0), (0.5, 0.5)])
def test_wait_for_lock_values(value, expected):
    assert lock_timeout(value) == expected


@pytest.mark.parametrize("value", [-1, "soon", float("inf")])
def test_bad_wait_for_lock_names_the_key_and_valid_values(value):
    with pytest.raises(ValueError, match=r"wait_for_lock must be false \(fail at once\), true \(wait\) or a number"):
        lock_timeout(value)


def test_lock_and_version_keys_do_not_change_the_run_folder():
    plain = job_dir(compose_cfg("method=ar", "decode.seed=3"))
    keys = job_dir(compose_cfg("method=ar", "decode.seed=3", "wait_for_lock=true", "resume_any_version=true"))
    assert keys == plain and plain.name == "decode.seed=3"
