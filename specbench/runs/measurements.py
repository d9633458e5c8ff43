"""What a run measured beside its rows, recorded once per set of repeats (`measure_from`) in the append-only
`<run folder>/measurements.jsonl`: a summary is recomputed from the folder every time a run ends, so every number it
reports comes from what the folder recorded, never from a new measurement of the process that happens to write it.
- `{"kind": "target_1", ...}`: the seconds of one target call verifying one token per row at the run's batch_size
  (specbench.runs.calibration), written by the first summary that needs it; the first such record is the one read;
- `{"kind": "process", ...}`: a process that decoded rows of the set records its peak memory, how many rows it
  decoded and when it finished; a set without one (an older version, or a crash before the record) gets the first
  summarizing process's.
Each line is written whole with one write(), flushed and fsync'ed; a reader skips a partial last line (a crash
mid-write), which the next append cuts off.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from specbench.common.errors import InputError
from specbench.common.files import append_durably, cut_to_last_line

log = logging.getLogger(__name__)

MEASUREMENTS = "measurements.jsonl"


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The folder's records, in the order written (a partial or unreadable last line is skipped)."""
    path = Path(run_dir) / MEASUREMENTS
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(keepends=True), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if line.endswith("\n"):
                raise InputError(f"{path}, line {n}: not a JSON record") from None
            log.warning("%s: ignoring the partial last line a crash left", path)
            break
        out.append(record)
    return out


def append(run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append one record as one line, flushed to disk, after cutting a partial last line a crash left (the caller
    holds the folder's lock); returns the record."""
    path = Path(run_dir) / MEASUREMENTS
    cut = cut_to_last_line(path)
    if cut:
        log.warning("%s: dropping the partial last line a crash left (%d bytes)", path, cut)
    append_durably(path, json.dumps(record, sort_keys=True) + "\n")
    return record


def target_1(run_dir: Path, measure_from: int, batch_size: int) -> dict[str, Any] | None:
    """The first `target_1` record of the set `measure_from` at `batch_size`, or None."""
    return next((r for r in read(run_dir) if r.get("kind") == "target_1" and r.get("measure_from") == measure_from
                 and r.get("batch_size") == batch_size), None)


def processes(run_dir: Path, measure_from: int) -> list[dict[str, Any]]:
    """The `process` records of the set `measure_from`."""
    return [r for r in read(run_dir) if r.get("kind") == "process" and r.get("measure_from") == measure_from]


def peaks(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest peak memory of the records (processes' or shards' summaries), each key the records give."""
    return {k: max(r[k] for r in records if r.get(k) is not None)
            for k in ("peak_rss_mb", "peak_cuda_mb") if any(r.get(k) is not None for r in records)}


def peak_and_finished(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The records' peaks and the latest `finished`."""
    return {**peaks(records), "finished": max(r["finished"] for r in records)}
