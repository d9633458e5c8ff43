"""Per-iteration traces (trace=true): one Parquet file per example under run_dir/traces/."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specbench.decoding.records import IterationRecord
from specbench.common.files import atomic_path


def trace_frame(example_id: str, records: list[IterationRecord], repeat: int = 0) -> pd.DataFrame:
    """One row per iteration; policy state keys become columns (t_g, t_v, gamma, ...); a tree's iteration also has
    its `depth` and its `tree`: the nodes' tokens and parents and the accepted path (node indices)."""
    rows = []
    for i, r in enumerate(records):
        tree = {"depth": r.depth, "tree": r.tree} if r.tree is not None else {}
        rows.append({"id": example_id, "repeat": repeat, "iteration": i, "drafted": r.drafted, "accepted": r.accepted,
                     "accepted_relaxed": r.accepted_relaxed, "stop": r.stop, "draft_steps": r.draft_steps,
                     "draft_s": r.draft_s, "verify_s": r.verify_s, "verify_forward_s": r.verify_forward_s,
                     "draft_forward_s": r.draft_forward_s, "host_s": r.host_s, "entropy": r.entropy, "js": r.js,
                     **tree, **r.state})
    return pd.DataFrame(rows)


def trace_path(run_dir: Path, example_id: str, repeat: int = 0) -> Path:
    """Where the trace of one example's repeat is: repeat 0 in traces/<id>.parquet, repeat k in <id>.r<k>.parquet."""
    return Path(run_dir) / "traces" / f"{example_id.replace('/', '_')}{f'.r{repeat}' if repeat else ''}.parquet"


def write_trace(run_dir: Path, example_id: str, records: list[IterationRecord], repeat: int = 0) -> Path:
    """Write the trace of one example's repeat atomically (temporary file, then rename) to its trace_path."""
    path = trace_path(run_dir, example_id, repeat)
    path.parent.mkdir(exist_ok=True)
    with atomic_path(path) as tmp:
        trace_frame(example_id, records, repeat).to_parquet(tmp, index=False)
    return path


def read_traces(run_dir: Path) -> pd.DataFrame:
    """All traces of a run as one DataFrame."""
    files = sorted((Path(run_dir) / "traces").glob("*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()
