"""`python -m specbench.bench methods`: each method through the runner on one pair and dataset; the docs/design.md
metric table."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from specbench.common.configs import compose_config
from specbench.runs.layout import discard_job_dir, job_dir


ALL_METHODS = ("ar,draft_only,vanilla,hf_assisted,heuristic,confidence,gammatune,gammatune_plus,adasd,"
               "adasd_gen_only,adasd_verify_only,adasd_variant_a,adasd_variant_b,adasd_variant_c")

# summary.json's pooled numbers (specbench.common.aggregate.run_metrics), the same the report prints
TABLE = ["tokens_per_s", "mean_drafted", "mean_accepted", "acceptance_rate", "block_efficiency", "mean_t_v", "score"]

def table_row(name: str, summary: dict) -> dict:
    """One line of the methods table from a run's summary: its TABLE numbers, example count, losslessness."""
    return {"method": name, **{k: summary[k] for k in TABLE}, "n": summary["n_examples"],
            "lossless": summary["lossless"]}

def run_overrides(args: argparse.Namespace, name: str) -> list[str]:
    """The `python run.py` overrides for method `name` with the command's options."""
    return [f"pair={args.pair}", f"method={name}", f"dataset={args.dataset}", f"limit={args.limit}",
            f"decode={args.decode}", f"decode.max_new_tokens={args.max_new_tokens}", "progress=false",
            f"threads={args.threads}", f"paths.results={args.out}",
            *([f"device={args.device}"] if args.device is not None else []), *args.overrides]

def cmd_methods(args: argparse.Namespace) -> int:
    """Run each method through the runner on one pair and dataset, in the folders run.py uses; print the table."""
    from specbench.runs.runner import run

    rows = []
    for name in args.methods.split(","):
        cfg = compose_config(run_overrides(args, name), hydra=True)  # run.py's config, hydra node included
        folder = job_dir(cfg)
        try:
            s = run(cfg, folder)
        except BaseException:  # a method that fails before its first row leaves no folder, as under run.py
            discard_job_dir(folder, Path(args.out), set())
            raise
        rows.append(table_row(name, s))
    df = pd.DataFrame(rows).set_index("method")
    if "vanilla" in df.index:
        df["speedup_vs_vanilla"] = df["tokens_per_s"] / df.loc["vanilla", "tokens_per_s"]
    print(f"pair {args.pair}, dataset {args.dataset} (limit {args.limit}), decode {args.decode}, "
          f"max_new_tokens {args.max_new_tokens}, device {args.device or 'auto'}, {args.threads} thread(s)")
    print(df.to_string(float_format=lambda x: f"{x:.3f}"))
    return 0
