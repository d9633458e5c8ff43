"""`python -m specbench.bench batch`: ar, chains and trees at batch sizes 1..32, each (method, batch size) as
its own `python run.py` process (peak memory is per process)."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from specbench.bench.methods import run_overrides
from specbench.common.configs import compose_config
from specbench.common.files import ROOT
from specbench.runs.layout import job_dir
from specbench.runs.results import SUMMARY


BATCH_METHODS = "ar,vanilla,gammatune,adasd,spec_tree,dyn_tree"  # chains and trees

BATCH_SIZES = "1,2,4,8,16,32"

# the batch table's columns: summary.json keys (speedup_vs_ar computed here; the memory column is one of MEMORY)
BATCH_TABLE = ["tokens_per_s", "speedup_vs_ar", "acceptance_rate", "block_efficiency", "n_examples"]

# summary.json's peak memory fields (specbench.runs.provenance.peak_memory) and what each measures
MEMORY = {"peak_cuda_mb": "peak CUDA memory allocated by torch in the run's own process (MiB)",
          "peak_rss_mb": "peak resident memory of the run's own process (MiB: Python, torch, both models, "
                         "caches; ru_maxrss, so one process per run)"}

BATCH_FORMAT = {"tokens_per_s": ".2f", "speedup_vs_ar": ".3f", "acceptance_rate": ".3f", "block_efficiency": ".3f",
                "peak_cuda_mb": ".1f", "peak_rss_mb": ".1f", "n_examples": "d"}

def batch_overrides(args: argparse.Namespace, name: str, size: int) -> list[str]:
    """run_overrides plus batch_size=<size> (left out at 1, the default: its folder is run.py's default one)."""
    return [*run_overrides(args, name), *([f"batch_size={size}"] if size != 1 else [])]

def run_child(overrides: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    """`python run.py <overrides>` in its own process (printed first), and the run folder it writes."""
    folder = job_dir(compose_config(overrides, hydra=True))
    print("$ " + shlex.join(["python", "run.py", *overrides]), flush=True)
    done = subprocess.run([sys.executable, "run.py", *overrides], cwd=ROOT, capture_output=True, text=True)
    return done, folder

def memory_key(summaries: list[dict]) -> str:
    """The MEMORY field the runs report: peak_cuda_mb where a run ran on CUDA, else peak_rss_mb."""
    return "peak_cuda_mb" if any(s.get("peak_cuda_mb") is not None for s in summaries) else "peak_rss_mb"

def batch_table(summaries: dict[tuple[str, int], dict]) -> pd.DataFrame:
    """One row per (batch size B, method) from the runs' summaries {(method, B): summary}: BATCH_TABLE plus the
    memory_key column; speedup_vs_ar = tokens_per_s / tokens_per_s of `ar` at the same B (NaN without one)."""
    mem = memory_key(list(summaries.values()))
    df = pd.DataFrame([{"B": b, "method": m, **{k: s.get(k) for k in BATCH_TABLE if k != "speedup_vs_ar"},
                        mem: s.get(mem)} for (m, b), s in summaries.items()])
    df = df.astype({k: float for k in ("tokens_per_s", "acceptance_rate", "block_efficiency", mem)})
    df = df.sort_values("B", kind="stable", ignore_index=True)
    ar = df[df["method"] == "ar"].set_index("B")["tokens_per_s"]
    df.insert(3, "speedup_vs_ar", df["tokens_per_s"] / df["B"].map(ar))
    return df

def stops_beating(table: pd.DataFrame, method: str = "vanilla") -> int | None:
    """The first (smallest) batch size at which `method`'s speedup over ar is below 1; None if there is none."""
    mine = table[(table["method"] == method) & (table["speedup_vs_ar"] < 1)]
    return int(mine["B"].min()) if len(mine) else None

def ar_ratio(table: pd.DataFrame, big: int = 8, small: int = 1) -> float | None:
    """tokens_per_s of ar at B=big over that at B=small; None unless both ran."""
    ar = table[table["method"] == "ar"].set_index("B")["tokens_per_s"]
    return float(ar[big] / ar[small]) if big in ar.index and small in ar.index else None

def batch_lines(table: pd.DataFrame) -> list[str]:
    """The table (one line per row, numbers in BATCH_FORMAT, '-' where undefined) and the two verdicts."""
    formats = {k: (lambda x, f=f: format(x, f)) for k, f in BATCH_FORMAT.items() if k in table}
    measured = table.loc[(table["method"] == "vanilla") & table["speedup_vs_ar"].notna(), "B"]
    stop, ratio = stops_beating(table), ar_ratio(table)
    verdict = ("n/a (needs ar and vanilla at one batch size)" if measured.empty
               else f"B={stop}" if stop is not None else f"none up to B={measured.max()}")
    return [table.to_string(index=False, formatters=formats, na_rep="-"), f"vanilla stops beating ar at: {verdict}",
            "ar tokens_per_s B=8 / B=1: " + (f"{ratio:.3f}" if ratio is not None else "n/a (needs ar at B=1 and B=8)")]

def cmd_batch(args: argparse.Namespace, command: str) -> int:
    """Each (method, batch size) as its own run.py process under args.out; print the table of their summaries."""
    args.out = str(Path(args.out or tempfile.mkdtemp(prefix="specbench_bench_batch_")).resolve())
    args.limit = args.batch_sizes[-1] if args.limit is None else args.limit
    summaries = {}
    for size in args.batch_sizes:
        for name in args.methods.split(","):
            done, folder = run_child(batch_overrides(args, name, size))
            if done.returncode != 0:
                print(f"run failed (exit status {done.returncode}): {name} at batch_size={size}:\n"
                      f"{done.stderr[-3000:]}", file=sys.stderr)
                return 1
            summaries[(name, size)] = json.loads((folder / SUMMARY).read_text())
    table = batch_table(summaries)
    first = next(iter(summaries.values()))
    mem = memory_key(list(summaries.values()))
    print(f"\n{command}\npair {args.pair}, dataset {args.dataset} (limit {args.limit}), decode {args.decode}, "
          f"max_new_tokens {args.max_new_tokens}, device {first['device_info']['device']}, {args.threads} thread(s); "
          f"run folders under {args.out}")
    print("tokens_per_s: total new tokens / total decode wall time; speedup_vs_ar: over ar at the same B; "
          f"acceptance_rate: accepted / drafted tokens; block_efficiency: τ; {mem}: {MEMORY[mem]}")
    print(*batch_lines(table), sep="\n")
    return 0
