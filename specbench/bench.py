"""Micro-benchmarks of the engine (a CLI, so it prints): `python -m specbench.bench engine --help`.

`engine` measures, on one pair and the first N prompts of a dataset (smoke by default) at temperature 0, for
`vanilla` (γ) and `ar` on the eager path and (unless --no-compile) the compiled one (engine.compile=true):
  (a) the median cost of single model calls (target 1 token, target γ+1 tokens, draft 1 token), per path;
  (b) engine overhead = 1 - (model-call seconds) / decode wall seconds, per engine;
  (c) throughput of each engine and of transformers' `generate(assistant_model=...)` with a constant schedule
      of the same γ and the confidence stop off, all interleaved per prompt (the order rotated), after a warm-up
      over every prompt (which builds the compiled graphs); every generation's token ids are checked against
      transformers' (exit status 1 if any differ);
  (d) vanilla's measured speedup over ar beside Leviathan et al.'s expected speedup for the measured acceptance
      rate and cost ratio, and the compiled / eager throughput ratios.

`verify` measures the target's verify cost against the number of drafted nodes verified: the median ms of one
forward of the root's token and w nodes after a cached prompt, the nodes fed as a chain (causal) and as a tree
(tree attention: a complete binary tree in breadth-first order, specbench.decoding.tree_state), each relative to
a one-token forward (ar's call, w = 0), for w in --nodes.

`methods` runs each method through the runner on one pair and dataset and prints the docs/design.md metric table.

`batch` runs `ar`, `vanilla`, `gammatune` and `adasd` on the toy pair at batch sizes 1..32, each (method,
batch size) as its own `python run.py` process (peak memory is per process), and prints per batch size and
method: tokens/s (total new tokens / total decode wall time), speedup over `ar` at the same batch size,
acceptance rate, τ and peak memory, then the batch size at which `vanilla` stops beating `ar` and the
throughput ratio ar(B=8) / ar(B=1).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel

from specbench.common.aggregate import run_metrics, total
from specbench.common.configs import compose_config
from specbench.common.files import ROOT
from specbench.data.dataset import Example, build_dataset
from specbench.decoding.compiled import StaticState
from specbench.decoding.engine import Engine, Generation
from specbench.decoding.state import ModelState, sync
from specbench.decoding.tree_state import feed_tree, keep_path
from specbench.decoding.metrics import example_metrics
from specbench.models.pairs import Pair, load_pair, resolve_device
from specbench.data.prompting import encode
from specbench.runs.layout import discard_job_dir, job_dir
from specbench.runs.results import SUMMARY
from specbench.runs.runner import build_method, make_engine, sampling_params



def load(name: str, device: torch.device) -> Pair:
    """The pair conf/pair/<name>.yaml, composed through Hydra as the runner does."""
    cfg = compose_config([f"pair={name}"])
    return load_pair(OmegaConf.to_container(cfg.pair, resolve=True), device)


def smoke_prompts(pair: Pair, n: int) -> list[list[int]]:
    """Token ids of the first n smoke prompts."""
    return dataset_prompts(pair, "smoke", n)


def dataset_prompts(pair: Pair, dataset: str, n: int) -> list[list[int]]:
    """Token ids of the first n prompts of conf/dataset/<dataset>.yaml."""
    cfg = compose_config([f"dataset={dataset}"])
    examples: list[Example] = build_dataset(OmegaConf.to_container(cfg.dataset, resolve=True)).examples()[:n]
    return [encode(pair.tokenizer, ex) for ex in examples]


@contextmanager
def assistant_settings(draft: PreTrainedModel, gamma: int) -> Iterator[None]:
    """Constant schedule of γ drafts, confidence stop off (0 disables both the stop and the ROC update)."""
    gc = draft.generation_config
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {k: getattr(gc, k) for k in keys}
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = gamma, "constant"
    gc.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(gc, k, v)


def run_ours(engine: Engine, ids: list[int], max_new: int) -> tuple[Generation, float]:
    """One generation and its wall seconds around the call."""
    t0 = time.perf_counter()
    gen = engine.generate(ids, max_new)
    return gen, time.perf_counter() - t0


@torch.inference_mode()
def run_theirs(pair: Pair, ids: list[int], max_new: int) -> tuple[list[int], float, list[int]]:
    """transformers' greedy assisted generation: new token ids, wall seconds, [target, draft] forward calls."""
    device = pair.target.device
    x = torch.tensor([ids], dtype=torch.long, device=device)
    calls = [0, 0]
    hooks = [m.register_forward_pre_hook(lambda *_, k=k: calls.__setitem__(k, calls[k] + 1))
             for k, m in enumerate((pair.target, pair.draft))]
    try:
        sync(device)
        t0 = time.perf_counter()
        out = pair.target.generate(x, attention_mask=torch.ones_like(x), assistant_model=pair.draft, do_sample=False,
                                   max_new_tokens=max_new, pad_token_id=pair.tokenizer.pad_token_id)
        sync(device)
        seconds = time.perf_counter() - t0
    finally:
        for h in hooks:
            h.remove()
    return out[0, len(ids):].tolist(), seconds, calls


def call_ms(model: PreTrainedModel, prompt: list[int], width: int, compile: bool = False, steps: int = 15) -> float:
    """Median ms of one forward of `width` new tokens on top of a cached prompt (rolled back each time), on the
    eager state or the compiled one (static cache, compiled graph of the padded width)."""
    buf = torch.tensor([prompt + [65] * width], dtype=torch.long, device=model.device)
    state = StaticState(model, 1, len(prompt) + width + 1, "bench") if compile else ModelState(model)
    state.forward(buf, len(prompt), 1)
    times = []
    for _ in range(steps + 2):
        t0 = state.seconds
        state.forward(buf, len(prompt) + width, 1)
        sync(model.device)
        state.settle()
        times.append(state.seconds - t0)
        state.crop(len(prompt))
    return 1e3 * statistics.median(times[2:])


def tree_ms(model: PreTrainedModel, prompt: list[int], nodes: int, steps: int = 15) -> float:
    """Median ms of one tree-attention forward of `nodes` nodes (node j's parent (j - 1) // 2: a complete binary
    tree) after a cached prompt; each forward's nodes are then dropped from the cache again (keep_path)."""
    buf = torch.tensor([prompt + [65]], dtype=torch.long, device=model.device)
    state = ModelState(model)
    state.forward(buf, len(prompt) - 1, 1)  # the prompt but its last token is cached; each forward feeds it and the tree
    parents = [(j - 1) // 2 if j else -1 for j in range(nodes)]
    times = []
    for _ in range(steps + 2):
        t0 = state.seconds
        feed_tree(state, buf, len(prompt), [65] * nodes, parents, [], True)
        times.append(state.seconds - t0)
        keep_path(state, len(prompt) - 1, [])
    return 1e3 * statistics.median(times[2:])


def cmd_verify(args: argparse.Namespace) -> int:
    """Print the verify cost table: drafted nodes w, chain ms (w + 1 tokens), tree ms (the root's token and w nodes)
    and both relative to one token."""
    torch.set_num_threads(args.threads)
    pair = load(args.pair, resolve_device(args.device))
    prompt = dataset_prompts(pair, args.dataset, 1)[0]
    one = call_ms(pair.target, prompt, 1, steps=args.steps)
    print(f"pair {args.pair} ({pair.target.name_or_path}, {pair.target.dtype}, {pair.target.device}), prompt of "
          f"{len(prompt)} tokens, {torch.get_num_threads()} thread(s), median of {args.steps} forwards")
    print("| nodes | chain ms | tree ms | chain / 1 token | tree / 1 token |")
    print("|---|---|---|---|---|")
    for n in args.nodes:
        chain_ms, t_ms = call_ms(pair.target, prompt, n + 1, steps=args.steps), tree_ms(pair.target, prompt, n, args.steps)
        print(f"| {n} | {chain_ms:.2f} | {t_ms:.2f} | {chain_ms / one:.2f} | {t_ms / one:.2f} |", flush=True)
    return 0


def mismatch(i: int, ours: list[int], theirs: list[int]) -> str:
    """A one-paragraph report of where two token sequences first differ."""
    k = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return (f"MISMATCH prompt {i}: ours {len(ours)} tokens, transformers {len(theirs)}; first difference at "
            f"position {k}: ours {ours[k:k + 5]} vs transformers {theirs[k:k + 5]} "
            f"(after {ours[max(0, k - 5):k]})")


def engines(pair: Pair, gamma: int, max_new: int, compile: bool) -> dict[str, Engine]:
    """Our engines by label: vanilla (γ, rejection: argmax acceptance at temperature 0) and ar, eager and, with
    compile, compiled."""
    params = sampling_params({"temperature": 0.0, "max_new_tokens": max_new})
    out = {}
    for path in ("eager", "compiled") if compile else ("eager",):
        for name, cfg in (("vanilla", {"name": "vanilla", "gamma": gamma, "rule": "rejection"}), ("ar", {"name": "ar"})):
            out[f"{name} {path}"] = make_engine(pair, build_method(cfg), params, (), path == "compiled")
    return out


def leviathan(alpha: float, gamma: int, c: float) -> float:
    """Expected speedup of speculative decoding over ar (Leviathan et al. 2023, Theorem 3.8) with acceptance rate
    alpha, γ drafts and cost ratio c = draft forward / target forward: (1 - α^(γ+1)) / ((1 - α)(γc + 1))."""
    tau = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tau / (gamma * c + 1)


def cmd_engine(args: argparse.Namespace) -> int:
    """Per-call costs, engine overhead and throughput of our eager (and compiled) vanilla and ar against
    transformers' assisted generation, every generation's tokens checked against transformers'."""
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    pair = load(args.pair, device)
    v_t, v_d = (m.config.get_text_config().vocab_size for m in (pair.target, pair.draft))
    if v_t != v_d:  # transformers then takes the different-tokenizer path (universal assisted decoding)
        print(f"pair {args.pair}: target and draft vocab_size differ ({v_t} vs {v_d}); transformers' assisted "
              "generation needs equal sizes to run the same algorithm", file=sys.stderr)
        return 2
    ours = engines(pair, args.gamma, args.max_new_tokens, args.compile)
    prompts = smoke_prompts(pair, args.prompts) if args.dataset == "smoke" else dataset_prompts(pair, args.dataset,
                                                                                                   args.prompts)
    n_t = sum(p.numel() for p in pair.target.parameters()) / 1e6
    n_d = sum(p.numel() for p in pair.draft.parameters()) / 1e6
    print(f"pair {args.pair}: target {n_t:.1f}M params, draft {n_d:.1f}M, {pair.target.dtype}; device {device}, "
          f"{torch.get_num_threads()} thread(s); {len(prompts)} {args.dataset} prompts x {args.max_new_tokens} new "
          f"tokens, γ={args.gamma}, greedy, {args.repeats} repeat(s)")
    p0, g1 = prompts[0], args.gamma + 1
    cost = {}
    for path in ("eager", "compiled") if args.compile else ("eager",):
        c = path == "compiled"
        cost[path] = (call_ms(pair.target, p0, 1, c), call_ms(pair.target, p0, g1, c), call_ms(pair.draft, p0, 1, c))
        print(f"model calls {path} (median ms): target 1 token {cost[path][0]:.2f}, target {g1} tokens "
              f"{cost[path][1]:.2f}, draft 1 token {cost[path][2]:.2f}")

    seconds = dict.fromkeys([*ours, "transformers"], 0.0)
    rows: dict[str, list[dict]] = {k: [] for k in ours}
    bad: dict[str, str] = {}
    tokens: dict[str, list[int]] = {}  # each engine's tokens on the current prompt
    theirs_tokens = 0
    with assistant_settings(pair.draft, args.gamma):
        for engine in ours.values():  # warm-up, not measured: every prompt (the compiled graphs of all widths)
            for ids in prompts:
                engine.generate(ids, args.max_new_tokens)
        run_theirs(pair, p0, args.max_new_tokens)
        labels = [*ours, "transformers"]
        for r in range(args.repeats):
            for i, ids in enumerate(prompts):
                k = (r * len(prompts) + i) % len(labels)  # rotate who goes first, against drift
                for label in labels[k:] + labels[:k]:
                    if label == "transformers":
                        theirs, t, calls = run_theirs(pair, ids, args.max_new_tokens)
                        theirs_tokens += len(theirs)
                    else:
                        gen, t = run_ours(ours[label], ids, args.max_new_tokens)
                        rows[label].append(example_metrics(gen))
                        tokens[label] = gen.token_ids
                    seconds[label] += t
                for label in ours:
                    if tokens[label] != theirs:
                        bad.setdefault(f"{label} {i}", f"{label}: " + mismatch(i, tokens[label], theirs))
    print(f"{'engine':18} {'tok/s':>8} {'overhead':>9} {'vs transformers':>16}")
    tps = {"transformers": theirs_tokens / seconds["transformers"]}
    for label in ours:
        m = run_metrics(rows[label])
        tps[label] = m["total_new_tokens"] / seconds[label]
        print(f"{label:18} {tps[label]:8.1f} {m['engine_overhead']:9.1%} {tps[label] / tps['transformers']:16.3f}")
    print(f"{'transformers':18} {tps['transformers']:8.1f} {'':9} {1:16.3f}")
    alpha = run_metrics(rows["vanilla eager"])["acceptance_rate"] or 0.0
    for path, (t1, _, d1) in cost.items():
        print(f"{path}: acceptance {alpha:.3f}, cost ratio c = draft/target {d1 / t1:.3f}; speedup of vanilla over "
              f"ar measured {tps[f'vanilla {path}'] / tps[f'ar {path}']:.3f}, Leviathan's expected "
              f"{leviathan(alpha, args.gamma, d1 / t1):.3f}")
    if args.compile:
        print(f"compiled / eager throughput: vanilla {tps['vanilla compiled'] / tps['vanilla eager']:.3f}, "
              f"ar {tps['ar compiled'] / tps['ar eager']:.3f}")
    if bad:
        print(f"token ids differ from transformers' in {len(bad)} generations:", *bad.values(), sep="\n")
        return 1
    print(f"token ids identical to transformers' for every engine on all {len(prompts)} prompts")
    return 0


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


def methods_config(args: argparse.Namespace, name: str) -> DictConfig:
    """The config `python run.py` composes for method `name` with the command's options (hydra node included)."""
    return compose_config(run_overrides(args, name), hydra=True)


def cmd_methods(args: argparse.Namespace) -> int:
    """Run each method through the runner on one pair and dataset, in the folders run.py uses; print the table."""
    from specbench.runs.runner import run

    rows = []
    for name in args.methods.split(","):
        cfg = methods_config(args, name)
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


BATCH_METHODS = "ar,vanilla,gammatune,adasd"
BATCH_SIZES = "1,2,4,8,16,32"
# the batch table's columns: summary.json keys (speedup_vs_ar computed here; the memory column is one of MEMORY)
BATCH_TABLE = ["tokens_per_s", "speedup_vs_ar", "acceptance_rate", "block_efficiency", "n_examples"]
# summary.json's peak memory fields (specbench.runs.provenance.peak_memory) and what each measures
MEMORY = {"peak_cuda_mb": "peak CUDA memory allocated by torch in the run's own process (MiB)",
          "peak_rss_mb": "peak resident memory of the run's own process (MiB: Python, torch, both models, "
                         "caches; ru_maxrss, so one process per run)"}
BATCH_FORMAT = {"tokens_per_s": ".2f", "speedup_vs_ar": ".3f", "acceptance_rate": ".3f", "block_efficiency": ".3f",
                "peak_cuda_mb": ".1f", "peak_rss_mb": ".1f", "n_examples": "d"}


def batch_sizes(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique); argparse's error for anything but integers >= 1."""
    try:
        sizes = sorted({int(x) for x in text.split(",")})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers >= 1, e.g. 1,2,4,8")
    return sizes


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


def parser() -> argparse.ArgumentParser:
    """The command line: subcommands engine, verify, methods and batch with their options."""
    ap = argparse.ArgumentParser(prog="python -m specbench.bench", description=__doc__.splitlines()[0])
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
    v = sub.add_parser("verify", help="the target's verify cost against the nodes verified (chain and tree)")
    v.add_argument("--pair", default="toy", help="a conf/pair name")
    v.add_argument("--dataset", default="smoke", help="a conf/dataset name whose first prompt is the prefix")
    v.add_argument("--nodes", type=batch_sizes, default=batch_sizes("1,2,4,8,16,32,64"),
                   help="comma-separated node counts (default 1,2,4,8,16,32,64)")
    v.add_argument("--steps", type=int, default=15, help="forwards per count (the median is printed)")
    v.add_argument("--device", default="auto")
    v.add_argument("--threads", type=int, default=1)
    m = sub.add_parser("methods", help="every method on one pair: the docs/design.md metric table")
    m.add_argument("--pair", default="tiny_random")
    m.add_argument("--methods", default=ALL_METHODS, help="comma-separated method names")
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
    b = sub.add_parser("batch", help="ar and the draft-model methods at batch sizes 1..32: throughput, speedup "
                                     "over ar at the same batch size, acceptance, τ, peak memory")
    b.add_argument("--pair", default="toy")
    b.add_argument("--methods", default=BATCH_METHODS, help="comma-separated method names")
    b.add_argument("--batch-sizes", type=batch_sizes, default=batch_sizes(BATCH_SIZES),
                   help=f"comma-separated batch sizes (default {BATCH_SIZES})")
    b.add_argument("--dataset", default="toy_arith")
    b.add_argument("--limit", type=int, default=None, help="examples per run (default: the largest batch size)")
    b.add_argument("--decode", default="greedy")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--device", default=None, help="the config's device (auto) unless given")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--out", default=None, help="results root (paths.results) of the runs (default: a new temporary "
                                               "folder); each run's folder below it is the one run.py writes")
    b.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. warmup=0")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the subcommand."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if args.cmd == "batch":
        return cmd_batch(args, shlex.join(["python", "-m", "specbench.bench", *argv]))
    if args.cmd == "verify":
        return cmd_verify(args)
    return cmd_engine(args) if args.cmd == "engine" else cmd_methods(args)


if __name__ == "__main__":
    sys.exit(main())
