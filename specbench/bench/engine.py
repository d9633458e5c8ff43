"""`python -m specbench.bench engine` and `verify`: per-call costs, engine overhead and throughput against
transformers' assisted generation; the target's verify cost against the nodes verified."""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch

from specbench.bench import profile as prof, trace
from specbench.bench.gpu_report import machine
from specbench.bench.common import (assistant_settings, call_ms, dataset_prompts, divergence_class, engines, leviathan,
                                    load, mismatch, run_theirs)
from specbench.common.aggregate import run_metrics
from specbench.decoding.metrics import example_metrics
from specbench.decoding.profiles import Entry, iteration_costs
from specbench.decoding.speedup import CallStats, call_stats, merge_stats, predicted_speedup
from specbench.models.pairs import Pair, resolve_device
from specbench.runs.provenance import cpu_record, git_info, package_versions

log = logging.getLogger(__name__)


def cmd_verify(args: argparse.Namespace, command: str) -> int:
    """Print the verify cost table: drafted nodes w, chain ms (w + 1 tokens), tree ms (the root's token and w nodes)
    and both relative to one token; with --profile, write the pair's cost profile instead (profile.json)."""
    torch.set_num_threads(args.threads)
    pair = load(args.pair, resolve_device(args.device))
    prompt = dataset_prompts(pair, args.dataset, 1)[0]
    if args.profile:
        return write_profile(args, command, pair, prompt)
    one = call_ms(pair.target, prompt, 1, steps=args.steps)
    print(f"pair {args.pair} ({pair.target.name_or_path}, {pair.target.dtype}, {pair.target.device}), prompt of "
          f"{len(prompt)} tokens, {torch.get_num_threads()} thread(s), median of {args.steps} forwards")
    print("| nodes | chain ms | tree ms | chain / 1 token | tree / 1 token |")
    print("|---|---|---|---|---|")
    for n in args.nodes:
        chain_ms = call_ms(pair.target, prompt, n + 1, steps=args.steps)
        t_ms = 1e3 * prof.tree_seconds(pair.target, prompt, n, args.steps)
        print(f"| {n} | {chain_ms:.2f} | {t_ms:.2f} | {chain_ms / one:.2f} | {t_ms / one:.2f} |", flush=True)
    return 0

def write_profile(args: argparse.Namespace, command: str, pair: Pair, prompt: list[int]) -> int:
    """The cost profile of the pair at each of --batch-sizes (eager; compiled at B = 1 with --compile) into
    args.profile, rewritten after each entry; each entry's summary printed."""
    entries = []
    header: dict[str, object] = {
        "machine": [f"- device: {prof.device_name(pair.target.device)}", *machine(pair.target.device),
                    f"- cpu: {cpu_record()['model']}, {os.cpu_count()} CPU(s), {platform.platform()}"],
        "versions": package_versions(), "git": git_info(), "command": command}
    name = args.profile_name or f"{args.pair} on {prof.device_name(pair.target.device)}"
    paths = [("eager", b) for b in args.batch_sizes] + ([("compiled", 1)] if args.compile else [])
    for path, b in paths:
        entries.append(prof.measure_entry(pair, args.pair, prompt, path, b, args.steps))
        prof.write(Path(args.profile), name, header, entries)
        e = entries[-1]
        print(f"{args.pair} {path} B={b}: target " + ", ".join(
            f"{w} tok {1e3 * s:.2f} ms" for w, s in e["target_chain_s"].items() if w in ("1", "2", "4", "8", "16", "64"))
            + f"; draft {1e3 * e['draft_token_s']:.2f} ms" + "".join(
                f"; tree {n} {1e3 * s:.2f} ms" for n, s in e["target_tree_s"].items()), flush=True)
    print(f"wrote {args.profile} ({len(entries)} entries)")
    return 0


THEIRS = {"transformers": (True, False), "transformers greedy": (False, False),  # label -> (assisted, static cache)
          "transformers compiled": (True, True), "transformers compiled greedy": (False, True)}  # the compiled path's


@dataclass
class EngineFigures:
    """What `engine` measures on one pair: per-call costs, throughput, overhead, acceptance, token checks."""

    gamma: int
    costs: dict[str, tuple[float, float, float]]  # path -> median ms of (target 1 token, target γ+1, draft 1)
    tps: dict[str, float]  # engine label (and "transformers") -> new tokens / decode seconds
    overhead: dict[str, float]  # engine label -> 1 - model seconds / decode seconds
    acceptance: float  # vanilla's acceptance rate (accepted / drafted), eager
    alpha: float  # its per-token acceptance: accepted / (accepted + rejected), Leviathan's α
    mismatches: list[str] = field(default_factory=list)  # generations whose tokens differ from transformers'
    stats: dict[str, CallStats] = field(default_factory=dict)  # path -> vanilla's merged call_stats (its iterations)

    def speedups(self) -> dict[str, tuple[float, float, float | None]]:
        """path -> (vanilla's measured speedup over ar, Leviathan's textbook one at alpha and c = draft / target,
        the prediction of its own iterations at the measured call costs: predicted_speedup, which charges a verify
        of w + 1 tokens what it costs, not one target call)."""
        out = {}
        for path, (t1, tg, d1) in self.costs.items():
            # ms, interpolated between the two widths measured; iteration_costs reads no other key of an entry
            entry = cast(Entry, {"path": "eager", "batch_size": 1, "target_chain_s": {"1": t1, str(self.gamma + 1): tg},
                                 "target_tree_s": {}, "draft_token_s": d1})
            stats = self.stats.get(path)
            predicted = (predicted_speedup(stats, iteration_costs(entry, [int(w) for w in stats["iterations"]]))
                         if stats and stats["iterations"] else None)
            out[path] = (self.tps[f"vanilla {path}"] / self.tps[f"ar {path}"], leviathan(self.alpha, self.gamma, d1 / t1),
                         predicted)
        return out


def warm_theirs(pair: Pair, prompt: list[int], max_new: int, theirs: dict[str, tuple[bool, bool]]
                ) -> dict[str, tuple[bool, bool]]:
    """Warm each of transformers' generations up once (compiling its static-cache ones); a static-cache one that this
    transformers version cannot run is left out, logged with its error (the eager ones must run)."""
    out = {}
    for label, (assisted, static) in theirs.items():
        try:
            run_theirs(pair, prompt, max_new, assisted, static)
        except (ValueError, RuntimeError, TypeError, NotImplementedError) as err:
            if not static:
                raise
            log.warning("%s left out: transformers cannot run it here (%s: %s)", label, type(err).__name__, err)
            continue
        out[label] = (assisted, static)
    return out


def per_token(records: list) -> float:
    """Leviathan's α, P(a draft token is accepted | its prefix was), from iterations as accepted / (accepted +
    rejected): each iteration accepts its drafts up to its one rejection (none if it accepted all). accepted / drafted
    is lower: the drafts after a rejection are never tried."""
    accepted = sum(r.accepted for r in records)
    rejected = sum(r.accepted < r.drafted for r in records)
    return accepted / (accepted + rejected) if accepted + rejected else 0.0


def engine_figures(pair: Pair, prompts: list[list[int]], gamma: int, max_new: int, paths: tuple[str, ...],
                   repeats: int) -> EngineFigures:
    """Per-call costs, then vanilla and ar on each path of `paths` (eager, compiled) against transformers' assisted
    generation with a constant γ and its plain greedy generation, after a warm-up over every prompt, interleaved per
    prompt (the order rotated). Token ids are compared with transformers' run of the same algorithm (vanilla's with
    assisted generation, ar's with greedy: the same forward widths): in bfloat16 a forward of 6 tokens and one of 1
    round differently and can part at a near-tie, so only like with like keeps a difference a real one."""
    ours = engines(pair, gamma, max_new, paths)
    p0, g1 = prompts[0], gamma + 1
    costs, draft = {}, pair.model("draft")
    for path in paths:
        c = path == "compiled"
        costs[path] = (call_ms(pair.target, p0, 1, c), call_ms(pair.target, p0, g1, c), call_ms(draft, p0, 1, c))
    theirs = {k: v for k, v in THEIRS.items() if "compiled" in paths or not v[1]}  # label -> (assisted, static)
    labels = [*ours, *theirs]
    seconds = dict.fromkeys(labels, 0.0)
    rows: dict[str, list[dict]] = {k: [] for k in ours}
    bad: dict[str, str] = {}
    tokens: dict[str, list[int]] = {}  # each label's tokens on the current prompt
    theirs_tokens = dict.fromkeys(theirs, 0)
    records: list = []  # the first path's vanilla iterations
    stats: dict[str, list[CallStats]] = {path: [] for path in paths}  # path -> vanilla's call_stats per generation
    with assistant_settings(draft, gamma):
        for engine in ours.values():  # warm-up, not measured: every prompt (the compiled graphs of all widths)
            for ids in prompts:
                engine.generate(ids, max_new)
        theirs = warm_theirs(pair, p0, max_new, theirs)  # a compiled generation compiles here
        labels = [*ours, *theirs]
        for r in range(repeats):
            for i, ids in enumerate(prompts):
                k = (r * len(prompts) + i) % len(labels)  # rotate who goes first, against drift
                for label in labels[k:] + labels[:k]:
                    if label.startswith("transformers"):
                        tokens[label], t, _ = run_theirs(pair, ids, max_new, *theirs[label])
                        theirs_tokens[label] += len(tokens[label])
                    else:
                        t0 = time.perf_counter()
                        gen = ours[label].generate(ids, max_new)
                        t = time.perf_counter() - t0
                        rows[label].append(example_metrics(gen))
                        records += gen.records if label == f"vanilla {paths[0]}" else []
                        if label.startswith("vanilla "):
                            stats[label.removeprefix("vanilla ")].append(call_stats(gen.records))
                        tokens[label] = gen.token_ids
                    seconds[label] += t
                for label in ours:
                    yardstick = tokens["transformers greedy" if label.startswith("ar ") else "transformers"]
                    if tokens[label] != yardstick and f"{label} {i}" not in bad:
                        why = divergence_class(pair.target, ids, tokens[label], yardstick)
                        bad[f"{label} {i}"] = f"{label}: " + mismatch(i, tokens[label], yardstick, why)
    tps = {k: theirs_tokens[k] / seconds[k] for k in theirs}
    overhead = {}
    for label in ours:
        m = run_metrics(rows[label])
        tps[label], overhead[label] = m["total_new_tokens"] / seconds[label], m["engine_overhead"]
    acceptance = run_metrics(rows[f"vanilla {paths[0]}"])["acceptance_rate"] or 0.0
    return EngineFigures(gamma, costs, tps, overhead, acceptance, per_token(records), list(bad.values()),
                         {path: merge_stats(s) for path, s in stats.items()})


def cmd_trace(pair: Pair, prompts: list[list[int]], args: argparse.Namespace) -> int:
    """`engine --trace DIR`: ar's and vanilla's eager generations under torch.profiler (specbench.bench.trace), after
    a warm-up; each summary printed and kept in DIR/trace.md with the chrome traces beside it."""
    out = Path(args.trace)
    out.mkdir(parents=True, exist_ok=True)
    ours = engines(pair, args.gamma, args.max_new_tokens, ("eager",))
    models = [pair.target, pair.model("draft")]
    text = [f"pair {args.pair}, {len(prompts)} {args.dataset} prompts x {args.max_new_tokens} new tokens, "
            f"{torch.get_num_threads()} thread(s), {prof.device_name(pair.target.device)}"]
    for label, engine in ours.items():
        for ids in prompts:  # warm-up
            engine.generate(ids, args.max_new_tokens)
        name = label.replace(" ", "_")
        text += ["", f"### {label} ({name}.json)", "", trace.trace(engine, prompts, args.max_new_tokens, models,
                                                                    out / f"{name}.json").summary()]
    (out / "trace.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0


def cmd_engine(args: argparse.Namespace) -> int:
    """Print engine_figures for one pair; exit status 1 when any generation's tokens differ from transformers'."""
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    pair = load(args.pair, device)
    if args.trace:  # ours only: no like-for-like comparison with transformers needs equal vocabularies
        return cmd_trace(pair, dataset_prompts(pair, args.dataset, args.prompts), args)
    v_t, v_d = (m.config.get_text_config().vocab_size for m in (pair.target, pair.model("draft")))
    if v_t != v_d:  # transformers' assisted generation would take its different-tokenizer path: another algorithm
        print(f"pair {args.pair}: target and draft vocab_size differ; transformers' assisted generation needs equal "
              "sizes to run the same algorithm", file=sys.stderr)
        return 2
    prompts = dataset_prompts(pair, args.dataset, args.prompts)
    n_t, n_d = (sum(p.numel() for p in m.parameters()) / 1e6 for m in (pair.target, pair.model("draft")))
    print(f"pair {args.pair}: target {n_t:.1f}M params, draft {n_d:.1f}M, {pair.target.dtype}; device {device}, "
          f"{torch.get_num_threads()} thread(s); {len(prompts)} {args.dataset} prompts x {args.max_new_tokens} new "
          f"tokens, γ={args.gamma}, greedy, {args.repeats} repeat(s)")
    fig = engine_figures(pair, prompts, args.gamma, args.max_new_tokens,
                         ("eager", "compiled") if args.compile else ("eager",), args.repeats)
    for path, (t1, tg, d1) in fig.costs.items():
        print(f"model calls {path} (median ms): target 1 token {t1:.2f}, target {args.gamma + 1} tokens {tg:.2f}, "
              f"draft 1 token {d1:.2f}")
    print(f"{'engine':18} {'tok/s':>8} {'overhead':>9} {'vs transformers':>16}")
    for label, o in fig.overhead.items():
        print(f"{label:18} {fig.tps[label]:8.1f} {o:9.1%} {fig.tps[label] / fig.tps['transformers']:16.3f}")
    for label in (k for k in THEIRS if k in fig.tps):
        print(f"{label:18} {fig.tps[label]:8.1f} {'':9} {fig.tps[label] / fig.tps['transformers']:16.3f}")
    for path, (measured, expected, predicted) in fig.speedups().items():
        t1, _, d1 = fig.costs[path]
        print(f"{path}: acceptance rate {fig.acceptance:.3f}, α {fig.alpha:.3f}, cost ratio c = draft/target {d1 / t1:.3f}; speedup of vanilla over "
              f"ar measured {measured:.3f}, Leviathan's textbook {expected:.3f}, predicted from its iterations at the "
              f"measured call costs {'-' if predicted is None else f'{predicted:.3f}'}")
    if args.compile:
        print(f"compiled / eager throughput: vanilla {fig.tps['vanilla compiled'] / fig.tps['vanilla eager']:.3f}, "
              f"ar {fig.tps['ar compiled'] / fig.tps['ar eager']:.3f}")
    if fig.mismatches:
        print(f"token ids differ from transformers' in {len(fig.mismatches)} generations:", *fig.mismatches, sep="\n")
        return 1
    print(f"token ids identical to transformers' for every engine on all {len(prompts)} prompts (vanilla against "
          "assisted generation, ar against greedy generation)")
    return 0
