"""`python -m specbench.bench gpu --out DIR`: the GPU characterisation in one command, nothing downloaded.

On one CUDA GPU, for each pair of PAIRS (random weights with the shapes of real pairs, built on the GPU in bfloat16
with the target's per-token agreement with the draft calibrated: specbench.models.shaped):
  1. build: seconds, the calibrated agreement α, parameters;
  2. per-call costs (median ms, `engine`'s call_ms / `verify`'s tree_ms): target for 1 token, for γ+1 tokens and for a
     tree of 16 and 32 nodes, draft for 1 token, eager and compiled (no compiled tree: trees run eagerly);
  3. `engine`'s figures: tokens/s and engine overhead of our eager and compiled `vanilla` (γ, greedy) and `ar` against
     transformers' generate(assistant_model=...) with the same constant γ, every generation's token ids compared,
     Leviathan's expected speedup beside each measured one;
  4. `ar` and `vanilla` at each batch size (tokens/s = new tokens / wall seconds of one batch, speedup over ar at the
     same B), and the tree methods spec_tree and dyn_tree at B = 1 (trees decode one row at a time);
then the CUDA test lane (SPECBENCH_TEST_DEVICE=cuda python -m pytest tests) and its counts, and the goals (eager
overhead <= 10%, compiled <= 5%, compiled vanilla >= 1.5x transformers on the Llama-3.1-8B / 3.2-1B shapes).
DIR/report.md gets each section as soon as it is measured, so a run cut short keeps what it measured; DIR/figures.jsonl
holds every number, DIR/*.png the plots. `--quick --device cpu` runs the same code at tiny sizes (shaped.shrink,
2 prompts x 16 tokens, B = 1 and 4, the lane one test module, no compiled path unless --compile) in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from omegaconf import OmegaConf

from specbench.bench.common import dataset_prompts, load_cfg, tree_ms
from specbench.bench.engine import EngineFigures, engine_figures
from specbench.bench.overhead import measure, positive
from specbench.common.configs import compose_config
from specbench.common.files import ROOT
from specbench.models.pairs import Pair, load_pair
from specbench.models.shaped import chain, shrink, successor
from specbench.runs.provenance import git_info, package_versions
from specbench.runs.runner import build_method, make_engine, sampling_params

PAIRS = ("llama31_8b_1b_shaped", "qwen3_8b_0p6b_shaped")
GOAL_PAIR = "llama31_8b_1b_shaped"
TREE_METHODS = ("spec_tree", "dyn_tree")
QUICK_LANE = ["tests/test_batched_acceptance.py"]
GOALS = {"eager overhead": 0.10, "compiled overhead": 0.05, "compiled vanilla / transformers": 1.5}


class Report:
    """DIR/report.md written as it goes (flushed after every block) and DIR/figures.jsonl, one record per figure."""

    def __init__(self, out: Path, append: bool = False) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.md, self.jsonl = out, out / "report.md", out / "figures.jsonl"
        if not append:  # a new report; with append the sections go after the ones already there
            self.md.write_text("")
            self.jsonl.write_text("")

    def write(self, *lines: str) -> None:
        """Append lines (and a blank one) to report.md and echo them."""
        text = "\n".join(lines) + "\n\n"
        with self.md.open("a") as f:
            f.write(text)
        print(text, end="", flush=True)

    def table(self, header: list[str], rows: list[list[object]]) -> None:
        """A markdown table."""
        self.write("| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                   *("| " + " | ".join(map(str, r)) + " |" for r in rows))

    def record(self, **fields: object) -> None:
        """One figure into figures.jsonl."""
        with self.jsonl.open("a") as f:
            f.write(json.dumps(fields) + "\n")


def machine(device: torch.device) -> list[str]:
    """Lines naming the machine: GPU and driver (or CPU), CUDA, torch, transformers, specbench commit."""
    v, g = package_versions(), git_info()
    if device.type == "cuda":
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True) if shutil.which("nvidia-smi") else None
        driver = smi.stdout.strip().splitlines()[0] if smi and smi.returncode == 0 and smi.stdout.strip() else "n/a"
        props = torch.cuda.get_device_properties(device)
        hw = f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB), driver {driver}, CUDA {torch.version.cuda}"
    else:
        hw = f"CPU ({torch.get_num_threads()} torch thread(s)), no GPU"
    return [f"- machine: {hw}", f"- torch {v.get('torch')}, transformers {v.get('transformers')}, python {v['python']}",
            f"- specbench commit {g['git_hash']}{' (local changes)' if g['git_dirty'] else ''}",
            f"- date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"]


def count(n: int) -> str:
    """A parameter count as 8.03B or 1.2M."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def build(name: str, device: torch.device, quick: bool) -> tuple[Pair, dict, float]:
    """The pair conf/pair/<name>.yaml (shrunk with quick) on `device`, its config and build seconds."""
    cfg = load_cfg(name)
    cfg = shrink(cfg) if quick else cfg  # check_pairs: quick takes shaped_random pairs only
    if device.type == "cpu" and quick:
        cfg["dtype"] = "float32"
    t0 = time.perf_counter()
    pair = load_pair(cfg, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return pair, cfg, time.perf_counter() - t0


def check_pairs(names: list[str], quick: bool) -> str | None:
    """Why --pairs cannot run (an unknown config, or a pair --quick cannot shrink or transformers cannot assist), or
    None."""
    for name in names:
        try:
            cfg = load_cfg(name)
        except Exception as e:  # Hydra's own error names the config group and the missing option
            return f"--pairs {name!r}: {e}"
        if quick and cfg.get("builder") != "shaped_random":
            return f"--pairs {name!r}: --quick shrinks builder shaped_random pairs only ({', '.join(PAIRS)})"
        if cfg.get("cross_tokenizer") or cfg.get("draft") is None:
            return (f"--pairs {name!r}: needs a draft with the target's tokenizer (transformers' assisted generation "
                    "with one vocabulary is the yardstick)")
    return None


def shaped_prompts(cfg: dict, pair: Pair, n: int, length: int) -> list[list[int]]:
    """n prompts [n][length] of the calibration kind (the bigram chain with jumps), seeded apart from calibration."""
    f = successor(int(cfg.get("seed", 0)), len(pair.tokenizer), pair.target.device)
    return chain(f, int(cfg.get("seed", 0)) + 3, (n, length)).tolist()


def batch_figures(pair: Pair, prompts: list[list[int]], sizes: list[int], gamma: int, max_new: int
                  ) -> list[dict]:
    """tokens/s of ar and vanilla at each B (eager) and of the tree methods at B = 1; speedup over ar at the same B."""
    params = sampling_params({"temperature": 0.0, "max_new_tokens": max_new})
    specs = {"ar": {"name": "ar"}, "vanilla": {"name": "vanilla", "gamma": gamma, "rule": "rejection"}}
    for name in TREE_METHODS:
        specs[name] = OmegaConf.to_container(compose_config([f"method={name}"]).method, resolve=True)
    ours = {name: make_engine(pair, build_method(spec), params, ()) for name, spec in specs.items()}
    for engine in ours.values():  # warm-up, not measured
        engine.generate(prompts[0], max_new)
    rows = []
    for b in sizes:
        batch = [prompts[i % len(prompts)] for i in range(b)]
        tps = {}
        for name, engine in ours.items():
            if b > 1 and name in TREE_METHODS:
                continue
            m = measure(engine, batch, max_new, seeded=False)
            tps[name] = m["tokens_per_s"]
            rows.append({"B": b, "method": name, "tokens_per_s": tps[name], "acceptance": m["acceptance"]})
        for r in rows:
            if r["B"] == b:
                r["speedup_vs_ar"] = r["tokens_per_s"] / tps["ar"]
    return rows


def run_lane(device: torch.device, quick: bool, timeout: int) -> dict:
    """The test lane in its own process: the CUDA lane (SPECBENCH_TEST_DEVICE=cuda) on a GPU, else the CPU tests;
    with quick, only QUICK_LANE. Its counts by outcome, exit status and seconds."""
    targets = QUICK_LANE if quick else ["tests"]
    if not (ROOT / "tests").is_dir():
        return {"command": None, "note": f"no tests folder under {ROOT}: run from a checkout of the repository"}
    env_dev = "cuda" if device.type == "cuda" else "cpu"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *targets]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "SPECBENCH_TEST_DEVICE": env_dev})
        tail, code = done.stdout.strip().splitlines()[-1:] or [""], done.returncode
    except subprocess.TimeoutExpired:
        tail, code = [f"timed out after {timeout} s"], None
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)",
                                                tail[0])}
    return {"command": f"SPECBENCH_TEST_DEVICE={env_dev} " + shlex.join(["python", *cmd[1:]]), "counts": counts,
            "exit": code, "seconds": time.perf_counter() - t0, "summary": tail[0]}


def plot(out: Path, name: str, rows: list[dict], costs: dict[str, list[float]]) -> list[str]:
    """Two PNGs per pair: tokens/s against B per method, and the per-call costs; their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        ax.plot([r["B"] for r in mine], [r["tokens_per_s"] for r in mine], "o-", label=method)
    ax.set(xscale="log", xlabel="batch size B", ylabel="tokens/s", title=name)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{name}_throughput.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    labels = list(costs)
    for k, path in enumerate(("eager", "compiled")):
        vals = [costs[label][k] for label in labels]
        ax.bar([i + 0.4 * k for i in range(len(labels))], [v if v == v else 0 for v in vals], 0.4, label=path)
    ax.set_xticks([i + 0.2 for i in range(len(labels))], labels, rotation=30, ha="right")
    ax.set(ylabel="ms per call (median)", title=name)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{name}_calls.png", dpi=120)
    plt.close(fig)
    return [f"{name}_throughput.png", f"{name}_calls.png"]


def pair_section(rep: Report, name: str, args: argparse.Namespace, device: torch.device) -> EngineFigures:
    """Sections 1-4 for one pair, each written as soon as measured."""
    pair, cfg, seconds = build(name, device, args.quick)
    n_t, n_d = (sum(p.numel() for p in m.parameters()) for m in (pair.target, pair.draft))
    alpha = getattr(pair.target.config, "shaped_agreement", None)  # None: a real pair
    rep.write(f"## {name}", f"Built in {seconds:.1f} s on {device} in {pair.target.dtype}: target {count(n_t)} "
              f"parameters, draft {count(n_d)}" + (
                  f"; the target agrees with the draft's bigram map at α = {alpha:.3f} of the calibration positions "
                  f"(pair.acceptance {cfg['acceptance']})." if alpha is not None else
                  f" ({pair.target.name_or_path}, {pair.draft.name_or_path}); prompts from the smoke dataset."))
    rep.record(pair=name, what="build", seconds=seconds, target_params=n_t, draft_params=n_d, alpha=alpha)
    prompts = (shaped_prompts(cfg, pair, max(args.prompts, 1), args.prompt_tokens) if alpha is not None
               else dataset_prompts(pair, "smoke", max(args.prompts, 1)))
    p0, g1 = prompts[0], args.gamma + 1
    fig = engine_figures(pair, prompts, args.gamma, args.max_new_tokens, args.compile, args.repeats)
    costs = {"target 1": [fig.costs[p][0] for p in fig.costs], f"target {g1}": [fig.costs[p][1] for p in fig.costs],
             "draft 1": [fig.costs[p][2] for p in fig.costs]}
    for nodes in (16, 32):
        costs[f"target tree {nodes}"] = [tree_ms(pair.target, p0, nodes), float("nan")]
    for v in costs.values():
        v += [float("nan")] * (2 - len(v))
    rep.write(f"Per-call costs (median ms over 15 calls, prompt of {len(p0)} tokens cached):")
    rep.table(["call", "eager ms", "compiled ms"], [[k, f"{a:.2f}", "-" if b != b else f"{b:.2f}"]
                                                   for k, (a, b) in costs.items()])
    rep.record(pair=name, what="calls", costs=costs)
    rep.write(f"Engines ({len(prompts)} prompts x {args.max_new_tokens} new tokens, γ = {args.gamma}, greedy, "
              f"{args.repeats} repeat(s); vanilla's acceptance rate {fig.acceptance:.3f}, per-token α {fig.alpha:.3f}, "
              "the α Leviathan's formula takes):")
    rep.table(["engine", "tokens/s", "overhead", "vs transformers"],
              [[k, f"{fig.tps[k]:.1f}", f"{fig.overhead[k]:.1%}", f"{fig.tps[k] / fig.tps['transformers']:.3f}"]
               for k in fig.overhead] + [["transformers assisted", f"{fig.tps['transformers']:.1f}", "-", "1.000"]])
    rep.table(["path", "vanilla / ar measured", "Leviathan expected"],
              [[p, f"{m:.3f}", f"{e:.3f}"] for p, (m, e) in fig.speedups().items()])
    rep.write("Token ids identical to transformers' for every engine and prompt." if not fig.mismatches else
              f"**Token ids differ from transformers' in {len(fig.mismatches)} generations:** " +
              "; ".join(fig.mismatches))
    rep.record(pair=name, what="engines", tps=fig.tps, overhead=fig.overhead, acceptance=fig.acceptance, alpha=fig.alpha,
               speedups=fig.speedups(), mismatches=fig.mismatches)
    rows = batch_figures(pair, prompts, args.batch_sizes, args.gamma, args.max_new_tokens)
    rep.write(f"Batch sizes (eager, {args.max_new_tokens} new tokens, greedy; tokens/s of one batch):")
    rep.table(["B", "method", "tokens/s", "speedup vs ar", "acceptance"],
              [[r["B"], r["method"], f"{r['tokens_per_s']:.1f}", f"{r['speedup_vs_ar']:.3f}",
                "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"] for r in rows])
    rep.record(pair=name, what="batch", rows=rows)
    rep.write(*(f"![{f}]({f})" for f in plot(rep.out, name, rows, costs)))
    del pair
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return fig


def goals(figs: dict[str, EngineFigures]) -> list[str]:
    """The goal lines, each with its measured value."""
    out = []
    for name, fig in figs.items():
        for path in fig.costs:
            o, goal = fig.overhead[f"vanilla {path}"], GOALS[f"{path} overhead"]
            out.append(f"- {name}: {path} vanilla engine overhead {o:.1%} (goal <= {goal:.0%}): "
                       f"{'met' if o <= goal else 'NOT met'}")
    fig = figs.get(GOAL_PAIR)
    if fig is not None and "compiled" in fig.costs:
        r, goal = fig.tps["vanilla compiled"] / fig.tps["transformers"], GOALS["compiled vanilla / transformers"]
        out.append(f"- {GOAL_PAIR}: compiled vanilla / transformers assisted {r:.2f}x (goal >= {goal}x): "
                   f"{'met' if r >= goal else 'NOT met'}")
    return out


def cmd_gpu(args: argparse.Namespace, command: str) -> int:
    """Every section in turn into args.out/report.md; exit status 1 when tokens differed or the lane failed."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False); run it on a GPU "
              "node, or `--quick --device cpu` to check the command", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    fill_defaults(args)
    why = check_pairs(args.pairs, args.quick)
    if why:
        print(why, file=sys.stderr)
        return 2
    rep = Report(Path(args.out), args.append)
    rep.write("# specbench GPU characterisation" + (" (--quick: tiny sizes)" if args.quick else ""),
              f"`{command}`", *machine(device))
    figs = {name: pair_section(rep, name, args, device) for name in args.pairs}
    failed = any(f.mismatches for f in figs.values())
    if args.lane:
        lane = run_lane(device, args.quick, args.lane_timeout)
        rep.write("## Test lane", f"`{lane['command']}`: {lane.get('summary') or lane.get('note')} "
                  f"(exit status {lane.get('exit')}, {lane.get('seconds', 0):.0f} s)")
        rep.record(what="lane", **lane)
        failed |= lane["command"] is not None and lane["exit"] != 0
    rep.write("## Goals" + (" (set for the full sizes on a GPU: --quick's tiny models on a CPU do not test them)"
                            if args.quick else ""), *goals(figs))
    return 1 if failed else 0


def add_arguments(ap: argparse.ArgumentParser, sizes_type) -> None:
    """The command's options."""
    ap.add_argument("--out", required=True, help="folder of report.md, figures.jsonl and the PNGs (created)")
    ap.add_argument("--device", default="cuda", help="cuda (the default) or cpu (with --quick, to check the command)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: the same code in under a minute on a CPU")
    ap.add_argument("--pairs", type=lambda s: [p for p in s.split(",") if p], default=list(PAIRS),
                    help="comma-separated pair configs ('' for none: the lane alone)")
    ap.add_argument("--append", action="store_true",
                    help="add to the report in --out instead of starting it anew (one section per call where a "
                         "machine limits a command's time)")
    ap.add_argument("--prompts", type=positive, default=None, help="prompts per pair (default 4; quick 2)")
    ap.add_argument("--prompt-tokens", type=positive, default=None, help="tokens per prompt (default 128; quick 16)")
    ap.add_argument("--max-new-tokens", type=positive, default=None, help="default 256; quick 16")
    ap.add_argument("--gamma", type=positive, default=5)
    ap.add_argument("--repeats", type=positive, default=1)
    ap.add_argument("--batch-sizes", type=sizes_type, default=None, help="default 1,4,16,64; quick 1,4")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="the compiled path beside the eager one (default: on, off with --quick)")
    ap.add_argument("--lane", action=argparse.BooleanOptionalAction, default=True, help="run the test lane")
    ap.add_argument("--lane-timeout", type=positive, default=900)
    ap.add_argument("--threads", type=positive, default=1, help="torch CPU threads")


def fill_defaults(args: argparse.Namespace) -> None:
    """The size options' defaults, full or --quick (compile: on unless --quick)."""
    full = {"prompts": 4, "prompt_tokens": 128, "max_new_tokens": 256, "batch_sizes": [1, 4, 16, 64]}
    quick = {"prompts": 2, "prompt_tokens": 16, "max_new_tokens": 16, "batch_sizes": [1, 4]}
    for k, v in {**(quick if args.quick else full), "compile": not args.quick}.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
