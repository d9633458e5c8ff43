"""The command line of `python -m specbench.bench`: one subcommand per benchmark (specbench.bench)."""

from __future__ import annotations

import argparse
import shlex
import sys

from specbench.bench import batch, engine, gpu, kit, methods, overhead, rules
from specbench.bench.common import batch_sizes


def parser() -> argparse.ArgumentParser:
    """The command line: subcommands engine, verify, methods, batch, overhead, gpu, kit and rules with their options."""
    ap = argparse.ArgumentParser(prog="python -m specbench.bench",
                                 description="Benchmarks of the engine and the methods (a CLI, so it prints); one "
                                             "subcommand each.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("engine", help="engine overhead and throughput against transformers' assisted generation")
    e.add_argument("--pair", default="bench_random", help="a conf/pair name")
    e.add_argument("--dataset", default="smoke", help="a conf/dataset name whose first prompts are decoded")
    e.add_argument("--prompts", type=int, default=8, help="the first N prompts of the dataset")
    e.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="also the compiled path (engine.compile=true) beside the eager one")
    e.add_argument("--max-new-tokens", type=int, default=64)
    e.add_argument("--gamma", type=int, default=5)
    e.add_argument("--repeats", type=int, default=1, help="measured passes over the prompts")
    e.add_argument("--device", default="auto")
    e.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1: several threads on a shared 2-core box spin and time erratically)")
    e.add_argument("--trace", default=None, metavar="DIR",
                   help="instead: torch.profiler traces of ar's and vanilla's eager loops into DIR, and where their "
                        "time goes outside the forwards (DIR/trace.md)")
    v = sub.add_parser("verify", help="the target's verify cost against the nodes verified (chain and tree)")
    v.add_argument("--pair", default="toy", help="a conf/pair name")
    v.add_argument("--dataset", default="smoke", help="a conf/dataset name whose first prompt is the prefix")
    v.add_argument("--nodes", type=batch_sizes, default=batch_sizes("1,2,4,8,16,32,64"),
                   help="comma-separated node counts (default 1,2,4,8,16,32,64)")
    v.add_argument("--steps", type=int, default=15, help="forwards per count (the median is printed)")
    v.add_argument("--device", default="auto")
    v.add_argument("--threads", type=int, default=1)
    v.add_argument("--profile", default=None, help="write the pair's cost profile to this file (profile.json: the "
                                                    "target's verify of 1..64 tokens per row and trees, the draft's "
                                                    "token, at each --batch-sizes) instead of the table")
    v.add_argument("--profile-name", default=None, help="the profile's name (default: pair and device)")
    v.add_argument("--batch-sizes", type=batch_sizes, default=batch_sizes("1,4,16,64"),
                   help="with --profile: batch sizes (default 1,4,16,64)")
    v.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                   help="with --profile: also the compiled path at B = 1")
    m = sub.add_parser("methods", help="every method on one pair: the docs/design.md metric table")
    m.add_argument("--pair", default="tiny_random")
    m.add_argument("--methods", default=methods.ALL_METHODS, help="comma-separated method names")
    m.add_argument("--dataset", default="smoke")
    m.add_argument("--limit", type=int, default=8)
    m.add_argument("--decode", default="greedy")
    m.add_argument("--max-new-tokens", type=int, default=64)
    m.add_argument("--device", default=None, help="the config's device (auto) unless given")
    m.add_argument("--threads", type=int, default=1)
    m.add_argument("--out", default="results/bench_methods",
                   help="results root (paths.results): each method's run folder below it is the one run.py writes "
                        "for the same overrides (resumable)")
    m.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. warmup=0")
    b = sub.add_parser("batch", help="ar, chain and tree methods at batch sizes 1..32: throughput, speedup "
                                     "over ar at the same batch size, acceptance, τ, peak memory")
    b.add_argument("--pair", default="toy")
    b.add_argument("--methods", default=batch.BATCH_METHODS, help="comma-separated method names")
    b.add_argument("--batch-sizes", type=batch_sizes, default=batch_sizes(batch.BATCH_SIZES),
                   help=f"comma-separated batch sizes (default {batch.BATCH_SIZES})")
    b.add_argument("--dataset", default="toy_arith")
    b.add_argument("--limit", type=int, default=None, help="examples per run (default: the largest batch size)")
    b.add_argument("--decode", default="greedy")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--device", default=None, help="the config's device (auto) unless given")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--out", default=None, help="results root (paths.results) of the runs (default: a new temporary "
                                               "folder); each run's folder below it is the one run.py writes")
    b.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. warmup=0")
    o = sub.add_parser("overhead", help="the engine's own share of the decode time at batch sizes 1..64, in one "
                                        "process")
    overhead.add_arguments(o)
    g = sub.add_parser("gpu", help="the GPU characterisation in one command: per-call costs, overhead, throughput "
                                   "against transformers, batch sizes, the CUDA test lane; a markdown report")
    gpu.add_arguments(g)
    k = sub.add_parser("kit", help="the wheels a GPU node with its own torch lacks for `gpu` and the CUDA test lane, "
                                   "and the one line that installs them there offline")
    kit.add_arguments(k)
    r = sub.add_parser("rules", help="acceptance rules on the same drafts: each rule's exact expected acceptance at "
                                     "every iteration of one sampled decode (block against rejection)")
    rules.add_arguments(r)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the subcommand."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    command = shlex.join(["python", "-m", "specbench.bench", *argv])
    run = {"batch": lambda: batch.cmd_batch(args, command), "verify": lambda: engine.cmd_verify(args, command),
           "engine": lambda: engine.cmd_engine(args), "methods": lambda: methods.cmd_methods(args),
           "overhead": lambda: overhead.run(args), "gpu": lambda: gpu.cmd_gpu(args, command),
           "kit": lambda: kit.cmd_kit(args), "rules": lambda: rules.run(args)}
    return run[args.cmd]()
