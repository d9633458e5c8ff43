"""The sections of `bench gpu` (specbench.bench.gpu) and what they share: building a pair, its prompts, the batch
figures, the test lane, the goals. Each section writes its part of the report as soon as it is measured."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch

from specbench.bench import bandwidth, profile as prof
from specbench.bench.common import dataset_prompts, load_cfg
from specbench.bench.engine import THEIRS, EngineFigures, engine_figures
from specbench.bench.gpu_report import Report, count, plot
from specbench.bench.overhead import measure
from specbench.bench.schedule import Budget, Pace, probe
from specbench.bench.split import split_figures
from specbench.common.configs import compose_config, plain
from specbench.common.files import ROOT
from specbench.runs import roofline
from specbench.decoding.profiles import Entry
from specbench.models.pairs import Pair, load_pair
from specbench.models.shaped import chain, shrink, successor
from specbench.runs.binding import build_method, make_engine
from specbench.runs.validation import sampling_params

PAIRS = ("llama31_8b_1b_shaped", "qwen3_8b_0p6b_shaped")
GOAL_PAIR = "llama31_8b_1b_shaped"
TREE_METHODS = ("spec_tree", "dyn_tree")
QUICK_LANE = ["tests/test_batched_acceptance.py"]
GOALS = {"eager overhead": 0.10, "compiled overhead": 0.05, "compiled vanilla / transformers": 1.5}
DEFAULT_BUDGET = 7.5  # minutes: fits a 10-minute job's time limit, after the kit's install (under a minute)


@dataclass
class PairRun:
    """One pair's state across its sections: the loaded pair, its prompts, pace and figures."""

    name: str
    cfg: dict
    pair: Pair | None = None
    prompts: list[list[int]] = field(default_factory=list)
    figs: dict[str, EngineFigures] = field(default_factory=dict)  # path -> engine figures
    costs: dict[str, list[float]] = field(default_factory=dict)  # call -> [eager ms, compiled ms]
    rows: list[dict] = field(default_factory=list)  # batch and tree rows

    def loaded(self) -> Pair:
        """The built pair: every section after `build` runs on a built pair only (specbench.bench.gpu.cmd_gpu)."""
        assert self.pair is not None, f"pair {self.name} is not built"
        return self.pair


def params_b(cfg: dict) -> float:
    """Billions of parameters of a shaped pair's config: each model's matrix weights (roofline.weights: attention, MLP
    per layer, the untied head) and its embedding."""
    models = [roofline.layout(cfg[role]) for role in ("target", "draft")]
    return sum(roofline.weights(m) + m.V * m.h for m in models) / 1e9


def config(name: str, device: torch.device, quick: bool) -> dict:
    """conf/pair/<name>.yaml resolved, shrunk with quick (float32 on a CPU)."""
    cfg = load_cfg(name)
    cfg = shrink(cfg) if quick else cfg  # check_pairs: quick takes shaped_random pairs only
    if device.type == "cpu" and quick:
        cfg["dtype"] = "float32"
    return cfg


def check_pairs(names: list[str], quick: bool) -> str | None:
    """Why --pairs cannot run (unknown config; a pair --quick cannot shrink or transformers cannot assist), or None."""
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


def batch_figures(pair: Pair, prompts: list[list[int]], sizes: list[int], methods: tuple[str, ...], gamma: int,
                  max_new: int, budget: Budget) -> list[dict]:
    """tokens/s of each method (ar among them) at each B (eager), speedup over ar at the same B; the budget is
    checked before each B."""
    params = sampling_params({"temperature": 0.0, "max_new_tokens": max_new})
    specs: dict[str, dict[str, Any]] = {"ar": {"name": "ar"},
                                        "vanilla": {"name": "vanilla", "gamma": gamma, "parts": {"rule": "rejection"}}}
    specs = {m: specs.get(m) or plain(compose_config([f"method={m}"]).method) for m in ("ar", *methods)}
    ours = {name: make_engine(pair, build_method(spec), params, ()) for name, spec in specs.items()}
    for engine in ours.values():  # warm-up, not measured
        engine.generate(prompts[0], max_new)
    rows = []
    for b in sizes:
        budget.check()
        batch = [prompts[i % len(prompts)] for i in range(b)]
        tps = {}
        for name, engine in ours.items():
            m = measure(engine, batch, max_new, seeded=False)
            tps[name] = m["tokens_per_s"]
            rows.append({"B": b, "method": name, "tokens_per_s": tps[name], "acceptance": m["acceptance"],
                         "speedup_vs_ar": tps[name] / tps["ar"]})
    return rows


def lane_targets(quick: bool) -> list[str]:
    """The lane's test files: QUICK_LANE with quick, else the CUDA lane's modules (tests/conftest.py CUDA_LANE)
    that exist; files given by name, so the other modules (and what they import) are not collected."""
    if quick:
        return QUICK_LANE
    text = (ROOT / "tests" / "conftest.py").read_text()
    names = re.findall(r'"(test_\w+)"', text[text.index("CUDA_LANE"):].split("}")[0])
    return [f"tests/{n}.py" for n in names if (ROOT / "tests" / f"{n}.py").exists()]


# pytest -v's outcome lines: "tests/x.py::test PASSED" alone, "[gw0] [ 50%] PASSED tests/x.py::test" under xdist
OUTCOME = (r"^(?:(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b"
           r"|\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+::\S+))")


def lane_workers(device: torch.device) -> list[str]:
    """pytest-xdist's workers on a GPU where it is installed (half the host's cores, at most 8: the lane's tests
    share the one GPU; measured on an H200, 286 of its tests in 171 s with 12), else none (one process)."""
    if device.type != "cuda" or importlib.util.find_spec("xdist") is None:
        return []
    return ["-n", str(min(8, max(1, (os.cpu_count() or 2) // 2)))]


def lane_outcomes(out: str) -> tuple[dict[str, int], list[str]]:
    """Counts by outcome (lower case) and the failed or erroring tests, read off pytest -v's lines (also of a run cut
    short, which prints no summary), with or without xdist."""
    counts: dict[str, int] = {}
    failed = []
    for test_a, a, b, test_b in (m.groups() for m in re.finditer(OUTCOME, out, re.MULTILINE)):
        counts[(a or b).lower()] = counts.get((a or b).lower(), 0) + 1
        if (a or b) in ("FAILED", "ERROR"):
            failed.append(test_a or test_b)
    return counts, failed


def run_lane(device: torch.device, quick: bool, timeout: float) -> dict:
    """The test lane in its own process (SPECBENCH_TEST_DEVICE=cuda on a GPU, else cpu), its counts by outcome
    (also of a lane cut short by the timeout: read off pytest's per-test lines), exit status and seconds."""
    if not (ROOT / "tests").is_dir():
        return {"command": None, "note": f"no tests folder under {ROOT}: run from a checkout of the repository"}
    env_dev = "cuda" if device.type == "cuda" else "cpu"
    cmd = [sys.executable, "-m", "pytest", "-rN", "-v", "-p", "no:cacheprovider", "-m", "not slow",
           *lane_workers(device), *lane_targets(quick)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 1),
                              env={**os.environ, "SPECBENCH_TEST_DEVICE": env_dev})
        out, code, summary = done.stdout, done.returncode, (done.stdout.strip().splitlines()[-1:] or [""])[0]
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        code, summary = None, f"cut short after {timeout:.0f} s"
    counts, failed = lane_outcomes(out)
    return {"command": f"SPECBENCH_TEST_DEVICE={env_dev} " + shlex.join(["python", *cmd[1:]]), "counts": counts,
            "exit": code, "seconds": time.perf_counter() - t0, "summary": summary, "failed": failed[:20]}


def goals(runs: list[PairRun]) -> list[str]:
    """The goal lines, each with its measured value."""
    out = []
    for run in runs:
        for path, fig in run.figs.items():
            o, goal = fig.overhead[f"vanilla {path}"], GOALS[f"{path} overhead"]
            out.append(f"- {run.name}: {path} vanilla engine overhead {o:.1%} (goal <= {goal:.0%}): "
                       f"{'met' if o <= goal else 'NOT met'}")
        compiled = run.figs.get("compiled")
        if run.name == GOAL_PAIR and compiled is not None:
            r, goal = (compiled.tps["vanilla compiled"] / compiled.tps["transformers"],
                       GOALS["compiled vanilla / transformers"])
            out.append(f"- {GOAL_PAIR}: compiled vanilla / transformers assisted {r:.2f}x (goal >= {goal}x): "
                       f"{'met' if r >= goal else 'NOT met'}")
    return out or ["- none measured"]


@dataclass
class Ctx:
    """What every section reads and writes: the report, the options, the device, the budget, the profile's entries,
    the pace of the pair in hand and the seconds per billion parameters a build took."""

    rep: Report
    args: argparse.Namespace
    device: torch.device
    budget: Budget
    profile_header: dict
    entries: list[Entry] = field(default_factory=list)
    pace: Pace | None = None
    build_s_per_b: float | None = None
    ratios: list[float] = field(default_factory=list)  # taken / estimated seconds of the sections done
    bandwidth: tuple[float, str] | None = None  # the device's bytes/s and their source, once asked

    def correction(self) -> float:
        """The median of `ratios` (1 before any section is done)."""
        return statistics.median(self.ratios) if self.ratios else 1.0

    def write_profile(self) -> None:
        """DIR/profile.json with every entry measured so far."""
        name = f"{prof.device_name(self.device)}, torch {torch.__version__}"
        prof.write(self.rep.out / "profile.json", name, self.profile_header, self.entries)


def sec_build(ctx: Ctx, run: PairRun) -> None:
    """Build the pair (shrunk with --quick), probe its pace, pick its prompts."""
    run.cfg = cfg = config(run.name, ctx.device, ctx.args.quick)
    t0 = time.perf_counter()
    run.pair = pair = load_pair(cfg, ctx.device)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    seconds = time.perf_counter() - t0
    draft = pair.model("draft")
    n_t, n_d = (sum(p.numel() for p in m.parameters()) for m in (pair.target, draft))
    ctx.build_s_per_b = seconds / ((n_t + n_d) / 1e9)
    alpha = getattr(pair.target.config, "shaped_agreement", None)  # None: a real pair
    args = ctx.args
    if alpha is not None:  # prompts of the calibration kind (the bigram chain with jumps), seeded apart from it
        seed = int(cfg.get("seed", 0))
        f = successor(seed, len(pair.tokenizer), pair.target.device)
        run.prompts = chain(f, seed + 3, (args.prompts, args.prompt_tokens)).tolist()  # [n][length]
    else:
        run.prompts = dataset_prompts(pair, "smoke", args.prompts)
    ctx.pace = Pace(ctx.device.type, probe(pair.target, run.prompts[0]), probe(draft, run.prompts[0]),
                    (n_t + n_d) / 1e9)
    ctx.rep.write(f"## {run.name}", f"Built in {seconds:.1f} s on {ctx.device} in {pair.target.dtype}: target "
                  f"{count(n_t)} parameters, draft {count(n_d)}" + (
                      f"; the target agrees with the draft's bigram map at α = {alpha:.3f} of the calibration "
                      f"positions (pair.acceptance {cfg['acceptance']})." if alpha is not None else
                      f" ({pair.target.name_or_path}, {draft.name_or_path}); prompts from the smoke dataset."))
    ctx.rep.record(pair=run.name, what="build", seconds=seconds, target_params=n_t, draft_params=n_d, alpha=alpha,
                   pace={"target": vars(ctx.pace.target), "draft": vars(ctx.pace.draft)})


def sec_engines(ctx: Ctx, run: PairRun, path: str = "eager") -> None:
    """Our vanilla and ar on `path` against transformers' assisted generation: tokens compared, tokens/s, overhead."""
    args, rep = ctx.args, ctx.rep
    fig = engine_figures(run.loaded(), run.prompts, args.gamma, args.max_new_tokens, (path,), args.repeats)
    run.figs[path] = fig
    k = 0 if path == "eager" else 1
    for label, ms in zip(("target 1", f"target {args.gamma + 1}", "draft 1"), fig.costs[path]):
        run.costs.setdefault(label, [float("nan")] * 2)[k] = ms
    assert ctx.pace is not None, "the build section sets the pace"
    ctx.pace.tau = max(1.0, args.max_new_tokens / max(1.0, sum(fig.stats[path]["iterations"].values()) /
                                                      len(run.prompts) / args.repeats))
    rep.write(f"Engines, {path} ({len(run.prompts)} prompts x {args.max_new_tokens} new tokens, γ = {args.gamma}, "
              f"greedy, {args.repeats} repeat(s); vanilla's acceptance rate {fig.acceptance:.3f}, per-token α "
              f"{fig.alpha:.3f}); per-call medians: target 1 token {fig.costs[path][0]:.2f} ms, {args.gamma + 1} "
              f"tokens {fig.costs[path][1]:.2f} ms, draft 1 token {fig.costs[path][2]:.2f} ms:")
    like = "transformers compiled" if path == "compiled" and "transformers compiled" in fig.tps else "transformers"
    rep.table(["engine", "tokens/s", "overhead", "vs transformers assisted",
               *(["vs transformers compiled assisted"] if like != "transformers" else [])],
              [[k_, f"{fig.tps[k_]:.1f}", f"{fig.overhead[k_]:.1%}" if k_ in fig.overhead else "-",
                *(f"{fig.tps[k_] / fig.tps[y]:.3f}" for y in dict.fromkeys(("transformers", like)))]
               for k_ in [*fig.overhead, *(k for k in THEIRS if k in fig.tps)]])
    rep.table(["path", "vanilla / ar measured", "Leviathan textbook", "predicted (its iterations at these costs)"],
              [[p, f"{m:.3f}", f"{e:.3f}", "-" if q is None else f"{q:.3f}"] for p, (m, e, q) in fig.speedups().items()])
    rep.write("Token ids identical to transformers' for every engine and prompt (vanilla against assisted generation, "
              "ar against greedy generation)." if not fig.mismatches else
              f"**Token ids differ from transformers' in {len(fig.mismatches)} generations ("
              f"{sum('near-tie: ' in m for m in fig.mismatches)} near-tie, "
              f"{sum('suspect: ' in m for m in fig.mismatches)} suspect: the target's top-2 margin where they part):** "
              + "; ".join(fig.mismatches))
    rep.record(pair=run.name, what="engines", path=path, tps=fig.tps, overhead=fig.overhead,
               acceptance=fig.acceptance, alpha=fig.alpha, speedups=fig.speedups(), mismatches=fig.mismatches)
    plot(ctx.rep.out, run.name, run.rows, run.costs)


def sec_costs(ctx: Ctx, run: PairRun, path: str = "eager") -> None:
    """The cost profile at each batch size on `path` (compiled: B = 1), into profile.json as each entry ends."""
    args = ctx.args
    sizes = args.batch_sizes if path == "eager" else [1]
    for b in sizes:
        ctx.budget.check()
        entry = prof.measure_entry(run.loaded(), run.name, run.prompts[0], path, b, args.profile_steps)
        ctx.entries.append(entry)
        ctx.write_profile()
        if b == 1 and path == "eager":
            for n, s in entry["target_tree_s"].items():
                run.costs.setdefault(f"target tree {n}", [float("nan")] * 2)[0] = 1e3 * s
    rows = [[e["batch_size"], *(f"{1e3 * e['target_chain_s'][str(w)]:.2f}" if str(w) in e["target_chain_s"] else "-"
                                for w in (1, 2, 4, 8, 16, 32, 64)), f"{1e3 * e['draft_token_s']:.2f}"]
            for e in ctx.entries if e["pair"] == run.name and e["path"] == path]
    ctx.rep.write(f"Cost profile, {path} (median ms of {args.profile_steps} forwards after a cached prompt of "
                  f"{len(run.prompts[0])} tokens; every width in profile.json):")
    ctx.rep.table(["B", *(f"target {w} tok/row" for w in (1, 2, 4, 8, 16, 32, 64)), "draft 1"], rows)
    trees: dict[str, float] = next((e["target_tree_s"] for e in ctx.entries
                                    if e["pair"] == run.name and e["target_tree_s"]), {})
    if trees and path == "eager":
        ctx.rep.write("Trees at B = 1 (root + n nodes, tree attention): " +
                      ", ".join(f"{n} nodes {1e3 * s:.2f} ms" for n, s in trees.items()))
    ctx.rep.record(pair=run.name, what="profile", path=path, entries=len(rows))
    plot(ctx.rep.out, run.name, run.rows, run.costs)
    bandwidth_part(ctx, run.name, path)


def bandwidth_part(ctx: Ctx, name: str, path: str) -> None:
    """The bandwidth each target forward of the pair's `path` entries reached, its fraction of the device's and
    the bound, as a table, a record and a plot (specbench.bench.bandwidth)."""
    if ctx.bandwidth is None:
        ctx.bandwidth = bandwidth.device_bandwidth(ctx.device)
    bw, said = ctx.bandwidth
    mine = [e for e in ctx.entries if e["pair"] == name and e["path"] == path]
    table = bandwidth.rows(mine, bw)
    ctx.rep.write(f"Memory bandwidth, {path}: bytes each target forward moves (its weights; every row's keys and "
                  f"values over the cached prompt; the logits written) per measured second, against {said}; "
                  "the bound is bytes / bandwidth:")
    ctx.rep.table(bandwidth.HEADER, table)
    ctx.rep.record(pair=name, what="bandwidth", path=path, bandwidth=bw, source=said, header=bandwidth.HEADER,
                   rows=table)
    png = bandwidth.plot(ctx.rep.out, name, path, mine, bw)
    ctx.rep.write(f"![{png}]({png})")


def sec_compiled(ctx: Ctx, run: PairRun) -> None:
    """The compiled path: engines against transformers, then the B = 1 profile."""
    sec_engines(ctx, run, "compiled")
    sec_costs(ctx, run, "compiled")


def sec_batch(ctx: Ctx, run: PairRun, methods: tuple[str, ...] = ("vanilla",)) -> None:
    """ar and `methods` at each batch size: tokens/s and speedup over ar."""
    args = ctx.args
    rows = batch_figures(run.loaded(), run.prompts, args.batch_sizes, methods, args.gamma, args.max_new_tokens,
                         ctx.budget)
    run.rows += rows
    trees = any(m in TREE_METHODS for m in methods)
    ctx.rep.write(f"{'Trees beside chains' if trees else 'Batch sizes'} (eager, {args.max_new_tokens} new tokens, "
                  "greedy; tokens/s of one batch):")
    ctx.rep.table(["B", "method", "tokens/s", "speedup vs ar", "acceptance"],
                  [[r["B"], r["method"], f"{r['tokens_per_s']:.1f}", f"{r['speedup_vs_ar']:.3f}",
                    "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"] for r in rows])
    ctx.rep.record(pair=run.name, what="trees" if trees else "batch", rows=rows)
    plot(ctx.rep.out, run.name, run.rows, run.costs)


def sec_split(ctx: Ctx, run: PairRun) -> None:
    """The target split over the device and the CPU (a CPU: the CPU and disk) by a memory cap: ar's and vanilla's
    tokens against the one-device pair's, tokens/s of both (specbench.bench.split); the pair's last section."""
    args = ctx.args
    prompts, n = run.prompts[:SPLIT_PROMPTS], min(args.max_new_tokens, SPLIT_TOKENS)
    fig = split_figures(run.loaded(), prompts, args.gamma, n)
    where = ", ".join(f"{k} {v} modules" for k, v in fig["placement"].items())
    ctx.rep.write(f"Target split by a memory cap ({where}; accelerate's device_map, as `device_map: auto` with "
                  f"`max_memory` places a target larger than the GPU), {len(prompts)} prompt(s) x {n} new tokens, "
                  "greedy; tokens/s:")
    ctx.rep.table(["engine", "one device", "split", "split / one"],
                  [[k, f"{v['one device']:.1f}", f"{v['split']:.1f}", f"{v['split'] / v['one device']:.3f}"]
                   for k, v in fig["tps"].items()])
    ctx.rep.write("Token ids identical to the one-device run for ar and vanilla." if not fig["differ"] else
                  f"**Token ids differ from the one-device run: {', '.join(fig['differ'])}.**")
    ctx.rep.record(pair=run.name, what="split", **fig)
    if fig["differ"]:
        raise RuntimeError(f"the split target's tokens differ from the one-device run's: {', '.join(fig['differ'])}")


SPLIT_PROMPTS, SPLIT_TOKENS = 1, 32  # a split target's forwards move half its weights from the CPU each time


SECTION_RUN: dict[str, Callable[[Ctx, PairRun], None]] = {
    "build": sec_build, "engines": sec_engines, "costs": sec_costs, "compiled": sec_compiled, "batch": sec_batch,
    "trees": partial(sec_batch, methods=("vanilla", *TREE_METHODS)),  # trees beside a chain, at every batch size
    "split": sec_split}
