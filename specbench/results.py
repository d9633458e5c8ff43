"""Append-only, resumable results: rows.jsonl (one JSON row per example) and summary.json.

Each row is written with a single write() of one complete line, then flushed and fsync'ed, so a
crash leaves every finished row readable. On reopening, a trailing partial line (a crash in the
middle of a write) is cut off before anything is appended. JSON files such as summary.json are
written to a temporary file and renamed, so they are either the old or the new version.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROWS = "rows.jsonl"

# Config keys that may change between a run and its resumption without changing any row (the runner's
# resume check, the report's run identity, specbench.merge). `task` is always `bench` for a benchmark
# run (folders written before the task group existed lack it); logger / slurm: where results are sent
# and where jobs run; drafters, init_gamma: an experiment's values that reach the rows only through the
# method's own option, which stays in the identity (method.drafter, and method.gamma / gamma0 / window:
# conf/experiment/sd2_drafter/, initial_gamma/).
RESUMABLE_KEYS = {("dataset", "limit"), ("warmup",), ("progress",), ("trace",), ("threads",), ("task",),
                  ("logger",), ("slurm",), ("drafters",), ("init_gamma",)}


def without_keys(config: dict, paths: set[tuple[str, ...]] = RESUMABLE_KEYS) -> dict:
    """A deep copy of the config with the keys at `paths` (e.g. ("dataset", "limit")) removed."""
    out = json.loads(json.dumps(config, default=str))
    for path in paths:
        node = out
        for k in path[:-1]:
            node = node.get(k) or {}
        node.pop(path[-1], None)
    return out
SUMMARY = "summary.json"
CONFIG = "config.json"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write obj as JSON to path via a temporary file and os.replace."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _clean(x: Any) -> Any:
    """NaN/inf -> None so rows stay strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def read_rows(path: Path) -> list[dict]:
    """The complete rows of a rows.jsonl file (a trailing partial line is ignored)."""
    if not path.exists():
        return []
    rows = []
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break  # partial last line from a crash
            rows.append(json.loads(line))
    return rows


class RowWriter:
    """Appends rows to run_dir/rows.jsonl; knows which example ids are already done."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / ROWS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        self.rows = read_rows(self.path)
        self.done = {r["id"] for r in self.rows}

    def _repair(self) -> None:
        """Cut a partial trailing line left by a crash, so appends start on a fresh line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            log.warning("%s: dropping a partial last row (%d bytes) left by an interrupted run", self.path, len(data) - end)
            with open(self.path, "r+b") as f:
                f.truncate(end)

    def append(self, row: dict) -> None:
        """Write one row as one line, flushed to disk."""
        if row["id"] in self.done:
            raise ValueError(f"example {row['id']!r} is already in {self.path}")
        line = json.dumps(_clean(row), sort_keys=True) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.rows.append(row)
        self.done.add(row["id"])
