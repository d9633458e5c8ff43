"""`python -m specbench.bench rules`: acceptance rules compared on the same drafts.

The pair decodes the dataset's first prompts with vanilla (γ drafts from the pair's draft) under sampling, the first
rule listed deciding every iteration. At every iteration each listed rule's exact expected number of accepted drafts
given those very drafts and the target's p there is recorded (Rule.expected: rejection sum_j prod_{i<=j} min(1,
p_i(x_i)/q_i(x_i)); block sum_j P(τ >= j)), so the rules are compared without the noise of their own draws. Printed
per rule: the mean over iterations of E[accepted | drafts], τ = 1 + that mean, and the ratio to the first rule with
its paired 95% bootstrap interval over iterations; and the deciding rule's realised mean, which must lie near its
expectation.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from specbench.decoding.acceptance import make_rule
from specbench.decoding.engine import Engine
from specbench.decoding.proposal import Proposal, Verdict
from specbench.decoding.rule import Chains, Rule
from specbench.bench.common import dataset_prompts, load
from specbench.runs.binding import build_method, decoder_device, make_engine
from specbench.runs.validation import sampling_params


class Comparing(Rule):
    """Decides with `rules[0]`; on every batch of chains records each rule's E[accepted | drafts] and the verdicts."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self.name, self.lossless = rules[0].name, rules[0].lossless
        self.expected_rows: list[list[float]] = []  # per iteration with drafts: E per rule
        self.realised: list[int] = []  # the deciding rule's accepted drafts, same iterations

    def accept(self, props: list[Proposal], p: torch.Tensor, generators: list[torch.Generator | None],
               thresholds: list[float] | None = None) -> list[Verdict]:
        verdicts = self.rules[0].accept(props, p, generators, thresholds)
        c = Chains.of(props, p.shape[1] - 1, p.device)
        values = torch.stack([r.expected(c, p) for r in self.rules], 1).tolist()  # [B, rules]
        for prop, v, row in zip(props, verdicts, values):
            if len(prop):
                self.expected_rows.append(row)
                self.realised.append(v.accepted)
        return verdicts


def paired_ratio(a: np.ndarray, b: np.ndarray, seed: int = 0, draws: int = 2000) -> tuple[float, float, float]:
    """mean(b) / mean(a) and its 95% percentile bootstrap interval, iterations resampled together."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(draws, len(a)))
    boot = b[idx].mean(1) / a[idx].mean(1)
    return float(b.mean() / a.mean()), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pair", default="toy", help="a conf/pair name")
    ap.add_argument("--dataset", default="toy_arith", help="a conf/dataset name whose first prompts are decoded")
    ap.add_argument("--prompts", type=int, default=20, help="the first N prompts of the dataset")
    ap.add_argument("--rules", default="rejection,block", help="comma-separated rules; the first decides")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="prompt i is decoded with generator seed + i")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    """Decode, compare, print."""
    if args.temperature <= 0:
        raise SystemExit("--temperature must be > 0: at temperature 0 every rule is greedy")
    torch.set_num_threads(args.threads)
    names = args.rules.split(",")
    rules = [make_rule(n) for n in names]  # an unknown name fails here, listing the valid ones
    pair = load(args.pair, torch.device(args.device))
    params = sampling_params({"temperature": args.temperature, "max_new_tokens": args.max_new_tokens})
    engine = make_engine(pair, build_method({"name": "vanilla", "gamma": args.gamma, "parts": {"rule": names[0]}}), params, ())
    comparing = Comparing(rules)
    assert isinstance(engine, Engine)  # vanilla runs in the engine
    engine.rule = comparing  # the engine decides with the first rule and records all of them
    for i, ids in enumerate(dataset_prompts(pair, args.dataset, args.prompts)):
        engine.generate(ids, args.max_new_tokens, torch.Generator(decoder_device(engine)).manual_seed(args.seed + i))
    e = np.array(comparing.expected_rows)  # [iterations, rules]
    print(f"pair {args.pair}, dataset {args.dataset} (first {args.prompts} prompts), vanilla γ = {args.gamma}, "
          f"temperature {args.temperature}, max_new_tokens {args.max_new_tokens}, {len(e)} iterations with drafts; "
          f"decided by {names[0]} (its realised mean accepted {np.mean(comparing.realised):.3f})")
    print("| rule | E[accepted | drafts] | τ = 1 + E | against " + names[0] + " (95% CI over iterations) |")
    print("|---|---|---|---|")
    for k, name in enumerate(names):
        ratio, lo, hi = paired_ratio(e[:, 0] + 1, e[:, k] + 1)
        print(f"| {name} | {e[:, k].mean():.4f} | {1 + e[:, k].mean():.4f} | τ × {ratio:.4f} [{lo:.4f}, {hi:.4f}] |")
    return 0
