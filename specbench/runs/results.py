"""Append-only, resumable results: rows.jsonl (one JSON row per example) and summary.json.

The rows of a batch are written with a single write() of complete lines, then flushed and fsync'ed; while the write
is under way, `.rows.pending` holds the file's size before it, where a reader stops and a reopening writer cuts the
file back, so a crash leaves every finished batch and no part of an unfinished one. JSON files such as summary.json
are written to a uniquely named temporary file and renamed. One writer per folder: `folder_lock` holds an exclusive
flock on `<folder>/.lock` for the whole run; the kernel drops it when its holder exits or is killed. A full disk or a
folder that may not be written fails with FolderNotWritable, naming the folder and what to do.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specbench.common.errors import InputError, UserError
from specbench.common.files import (FULL, append_durably, cut_to_last_line, remove_temporaries, write_json_atomic,
                                    writing)

log = logging.getLogger(__name__)

ROWS = "rows.jsonl"
PENDING = ".rows.pending"  # while a batch of rows is appended: rows.jsonl's size before it (JSON {"size": n})
LOCK = ".lock"
LOCK_POLL_S = 0.5  # how often a waiting run retries a busy folder's lock

SUMMARY = "summary.json"
CONFIG = "config.json"


def _clean(x: Any) -> Any:
    """NaN/inf -> None so rows stay strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def row_key(row: dict) -> tuple[str, int]:
    """What identifies a row: (id, repeat); rows without `repeat` (one repeat, older versions) are repeat 0."""
    return row["id"], row.get("repeat", 0)


def measured_rows(rows: list[dict], record: dict) -> list[dict]:
    """The rows of the folder's newest set of repeats: repeat >= config.json's `measure_from` (0 until
    remeasure=true starts a new set)."""
    first = record.get("measure_from", 0)
    return [r for r in rows if r.get("repeat", 0) >= first]


def read_measured(run_dir: Path) -> list[dict]:
    """The complete rows of run_dir's newest set of repeats (measured_rows of its rows.jsonl)."""
    record = json.loads((Path(run_dir) / CONFIG).read_text())
    return measured_rows(read_rows(Path(run_dir) / ROWS), record)


def pending_size(path: Path) -> int | None:
    """The size a rows file had before an append that has not finished (its PENDING marker), else None."""
    marker = Path(path).parent / PENDING
    if not marker.exists():
        return None
    try:
        return int(json.loads(marker.read_text())["size"])
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{marker}: not a pending-append marker ({e}); delete it if {path} holds no "
                         "rows of an interrupted append") from None


def read_rows(path: Path) -> list[dict]:
    """The complete rows of a rows.jsonl file, unique by (id, repeat) (the first row of each; a trailing
    partial line and the rows of an unfinished append are ignored)."""
    if not path.exists():
        return []
    rows, seen, repeated = [], set(), 0
    end, pos = pending_size(path), 0
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            pos += len(line)
            if not line.endswith(b"\n") or (end is not None and pos > end):
                break  # partial last line, or a batch, from a crash
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}, line {n}: not a JSON row ({e})") from None
            if not isinstance(row, dict) or "id" not in row:
                raise InputError(f"{path}, line {n}: a row must be a JSON object with an 'id'")
            if row_key(row) in seen:
                repeated += 1
                continue
            seen.add(row_key(row))
            rows.append(row)
    if repeated:
        log.warning("%s: %d rows repeat an (id, repeat) already in the file (two writers on one folder?); "
                    "the first row of each is kept", path, repeated)
    return rows


class RowWriter:
    """Appends rows to run_dir/rows.jsonl; knows which (id, repeat) rows are already done. The caller holds the
    folder's lock (folder_lock)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / ROWS
        self.pending = Path(run_dir) / PENDING
        with writing(self.path.parent):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair()
        self.rows = read_rows(self.path)
        self.done = {row_key(r) for r in self.rows}

    def has(self, example_id: str, repeat: int = 0) -> bool:
        """Whether the folder holds the row of this example and repeat."""
        return (example_id, repeat) in self.done

    def _repair(self) -> None:
        """Cut the rows of an unfinished append and a partial trailing line left by a crash, so appends
        start on a fresh line after whole batches."""
        cut = cut_to_last_line(self.path, pending_size(self.path))
        if cut:
            log.warning("%s: dropping %d bytes of rows an interrupted run left unfinished", self.path, cut)
        self.pending.unlink(missing_ok=True)

    def append(self, row: dict) -> None:
        """Write one row as one line, flushed to disk."""
        self.append_many([row])

    def append_many(self, rows: list[dict]) -> None:
        """Write the rows of one batch as lines in one write, flushed to disk: all of them or, after a crash, none."""
        keys = [row_key(r) for r in rows]
        for i, key in enumerate(keys):
            if key in self.done or key in keys[:i]:
                where = self.path if key in self.done else "the rows to append"
                raise InputError(f"example {key[0]!r} (repeat {key[1]}) is already in {where}")
        data = "".join(json.dumps(_clean(r), sort_keys=True) + "\n" for r in rows)
        write_json_atomic(self.pending, {"size": self.path.stat().st_size if self.path.exists() else 0})
        try:
            with writing(self.path.parent):
                append_durably(self.path, data)
        except BaseException:
            self._repair()  # back to the size before this batch
            raise
        self.pending.unlink()
        self.rows.extend(rows)
        self.done.update(keys)


class FolderLocked(UserError, RuntimeError):
    """Another process holds the folder's lock; the message names it."""


def lock_timeout(value: Any) -> float | None:
    """The top-level key wait_for_lock as seconds to wait for a busy folder: false 0, true None (no limit)."""
    if value is None or value is False:
        return 0.0
    if value is True:
        return None
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return float(value)
    raise InputError(f"wait_for_lock must be false (fail at once), true (wait) or a number of seconds >= 0, "
                     f"got {value!r}")


def lock_holder(run_dir: Path) -> str:
    """Who holds (or last held) the folder's lock, from what the holder wrote into the lock file."""
    try:
        h = json.loads((Path(run_dir) / LOCK).read_text())
    except (OSError, ValueError):
        return "a process that has not written its name yet"
    slurm = f", SLURM job {h['slurm_job_id']}" if h.get("slurm_job_id") else ""
    return f"pid {h.get('pid')} on host {h.get('host')}{slurm}, started {h.get('started')} ({h.get('command')})"


def _holder() -> bytes:
    """This process, as lock_holder reports it."""
    slurm = os.environ.get("SLURM_JOB_ID")
    if slurm and os.environ.get("SLURM_ARRAY_TASK_ID"):
        slurm = f"{os.environ.get('SLURM_ARRAY_JOB_ID')}_{os.environ['SLURM_ARRAY_TASK_ID']} ({slurm})"
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "slurm_job_id": slurm,
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)}).encode()


def _try_lock(run_dir: Path) -> int | None:
    """An fd holding the exclusive lock of run_dir/.lock, or None while another process holds it."""
    path = run_dir / LOCK
    try:
        with writing(run_dir):
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:  # the folder was removed after mkdir (see folder_lock's clean-up): again
        return _try_lock(run_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise OSError(e.errno, f"cannot lock {path} ({e.strerror}); the filesystem must support flock") from None
    try:  # the last holder may have removed the file (an empty folder it created) while we waited
        same = os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
        return _try_lock(run_dir)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, _holder())
    except OSError as err:  # a full disk: the flock holds all the same, without its holder's name
        if err.errno not in FULL:
            os.close(fd)
            raise
        log.warning("%s: cannot write this run's name into the lock file (%s)", path, err.strerror)
    return fd


@contextmanager
def folder_lock(run_dir: Path, timeout: float | None = 0.0) -> Iterator[None]:
    """Hold the exclusive lock of run_dir (created if missing) while the block runs: one writer per folder.

    A busy folder raises FolderLocked naming the holder at once (timeout 0), after `timeout` seconds, or never
    (timeout None: wait). Once held, killed writers' temporary files are removed. A folder this call created and
    left holding only the lock file is removed again: a run refused before writing anything leaves nothing behind."""
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    deadline = None if timeout is None else time.monotonic() + timeout
    told = False
    while (fd := _try_lock(run_dir)) is None:
        holder = lock_holder(run_dir)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            waited = f" after waiting {timeout:g} s" if timeout else ""
            raise FolderLocked(f"{run_dir} is in use by another run{waited}: {holder}. One writer per folder: "
                               "wait for it (wait_for_lock=true, or a number of seconds), stop it, or use "
                               "another folder (hydra.run.dir=...)")
        if not told:
            log.warning("%s is in use by %s; waiting for it to finish (wait_for_lock)", run_dir, holder)
            told = True
        time.sleep(LOCK_POLL_S if left is None else min(LOCK_POLL_S, left))
    try:
        remove_temporaries(run_dir, below=("traces",))  # the one writer now: killed writers' temporary files
        yield
    finally:
        try:
            if created and os.listdir(run_dir) == [LOCK]:
                os.unlink(run_dir / LOCK)
                run_dir.rmdir()
        finally:
            os.close(fd)  # releases the lock
