"""`python -m specbench.bench engine` and `verify`: per-call costs, engine overhead and throughput against
transformers' assisted generation; the target's verify cost against the nodes verified."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

import torch

from specbench.bench.common import (assistant_settings, call_ms, dataset_prompts, engines, leviathan, load, mismatch,
                                   run_ours, run_theirs, same_vocab, tree_ms)
from specbench.common.aggregate import run_metrics
from specbench.decoding.metrics import example_metrics
from specbench.models.pairs import Pair, resolve_device


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

    def speedups(self) -> dict[str, tuple[float, float]]:
        """path -> (vanilla's measured speedup over ar, Leviathan's expected one at alpha and c = draft / target)."""
        return {path: (self.tps[f"vanilla {path}"] / self.tps[f"ar {path}"],
                       leviathan(self.alpha, self.gamma, d1 / t1)) for path, (t1, _, d1) in self.costs.items()}


def per_token(records: list) -> float:
    """Leviathan's α, the probability that a draft token is accepted given its prefix was, estimated from
    iterations as accepted / (accepted + rejected): each iteration's drafts are accepted up to its one rejection (an
    iteration that accepted all its drafts rejected none). accepted / drafted is lower: the drafts after a rejection
    are never tried."""
    accepted = sum(r.accepted for r in records)
    rejected = sum(r.accepted < r.drafted for r in records)
    return accepted / (accepted + rejected) if accepted + rejected else 0.0


def engine_figures(pair: Pair, prompts: list[list[int]], gamma: int, max_new: int, compile: bool, repeats: int
                   ) -> EngineFigures:
    """Per-call costs, then vanilla and ar (eager, and compiled with `compile`) against transformers' assisted
    generation with a constant γ, after a warm-up over every prompt, interleaved per prompt (the order rotated);
    every generation's token ids are compared with transformers'."""
    ours = engines(pair, gamma, max_new, compile)
    p0, g1 = prompts[0], gamma + 1
    costs = {}
    for path in ("eager", "compiled") if compile else ("eager",):
        c = path == "compiled"
        costs[path] = (call_ms(pair.target, p0, 1, c), call_ms(pair.target, p0, g1, c), call_ms(pair.draft, p0, 1, c))
    seconds = dict.fromkeys([*ours, "transformers"], 0.0)
    rows: dict[str, list[dict]] = {k: [] for k in ours}
    bad: dict[str, str] = {}
    tokens: dict[str, list[int]] = {}  # each engine's tokens on the current prompt
    theirs_tokens = 0
    records: list = []  # vanilla eager's iterations
    with assistant_settings(pair.draft, gamma):
        for engine in ours.values():  # warm-up, not measured: every prompt (the compiled graphs of all widths)
            for ids in prompts:
                engine.generate(ids, max_new)
        run_theirs(pair, p0, max_new)
        labels = [*ours, "transformers"]
        for r in range(repeats):
            for i, ids in enumerate(prompts):
                k = (r * len(prompts) + i) % len(labels)  # rotate who goes first, against drift
                for label in labels[k:] + labels[:k]:
                    if label == "transformers":
                        theirs, t, _ = run_theirs(pair, ids, max_new)
                        theirs_tokens += len(theirs)
                    else:
                        gen, t = run_ours(ours[label], ids, max_new)
                        rows[label].append(example_metrics(gen))
                        records += gen.records if label == "vanilla eager" else []
                        tokens[label] = gen.token_ids
                    seconds[label] += t
                for label in ours:
                    if tokens[label] != theirs:
                        bad.setdefault(f"{label} {i}", f"{label}: " + mismatch(i, tokens[label], theirs))
    tps = {"transformers": theirs_tokens / seconds["transformers"]}
    overhead = {}
    for label in ours:
        m = run_metrics(rows[label])
        tps[label], overhead[label] = m["total_new_tokens"] / seconds[label], m["engine_overhead"]
    acceptance = run_metrics(rows["vanilla eager"])["acceptance_rate"] or 0.0
    return EngineFigures(gamma, costs, tps, overhead, acceptance, per_token(records), list(bad.values()))


def cmd_engine(args: argparse.Namespace) -> int:
    """Print engine_figures for one pair; exit status 1 when any generation's tokens differ from transformers'."""
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    pair = load(args.pair, device)
    if not same_vocab(pair):
        print(f"pair {args.pair}: target and draft vocab_size differ; transformers' assisted generation needs equal "
              "sizes to run the same algorithm", file=sys.stderr)
        return 2
    prompts = dataset_prompts(pair, args.dataset, args.prompts)
    n_t, n_d = (sum(p.numel() for p in m.parameters()) / 1e6 for m in (pair.target, pair.draft))
    print(f"pair {args.pair}: target {n_t:.1f}M params, draft {n_d:.1f}M, {pair.target.dtype}; device {device}, "
          f"{torch.get_num_threads()} thread(s); {len(prompts)} {args.dataset} prompts x {args.max_new_tokens} new "
          f"tokens, γ={args.gamma}, greedy, {args.repeats} repeat(s)")
    fig = engine_figures(pair, prompts, args.gamma, args.max_new_tokens, args.compile, args.repeats)
    for path, (t1, tg, d1) in fig.costs.items():
        print(f"model calls {path} (median ms): target 1 token {t1:.2f}, target {args.gamma + 1} tokens {tg:.2f}, "
              f"draft 1 token {d1:.2f}")
    print(f"{'engine':18} {'tok/s':>8} {'overhead':>9} {'vs transformers':>16}")
    for label, o in fig.overhead.items():
        print(f"{label:18} {fig.tps[label]:8.1f} {o:9.1%} {fig.tps[label] / fig.tps['transformers']:16.3f}")
    print(f"{'transformers':18} {fig.tps['transformers']:8.1f} {'':9} {1:16.3f}")
    for path, (measured, expected) in fig.speedups().items():
        t1, _, d1 = fig.costs[path]
        print(f"{path}: acceptance rate {fig.acceptance:.3f}, α {fig.alpha:.3f}, cost ratio c = draft/target {d1 / t1:.3f}; speedup of vanilla over "
              f"ar measured {measured:.3f}, Leviathan's expected {expected:.3f}")
    if args.compile:
        print(f"compiled / eager throughput: vanilla {fig.tps['vanilla compiled'] / fig.tps['vanilla eager']:.3f}, "
              f"ar {fig.tps['ar compiled'] / fig.tps['ar eager']:.3f}")
    if fig.mismatches:
        print(f"token ids differ from transformers' in {len(fig.mismatches)} generations:", *fig.mismatches, sep="\n")
        return 1
    print(f"token ids identical to transformers' for every engine on all {len(prompts)} prompts")
    return 0
