"""`python -m specbench.bench overhead`: the engine's own cost at serving batch sizes, measured in one process.

`vanilla` decodes the first B prompts per decode and B (interleaved, so a drift of the machine's speed spreads over
all); printed are the medians over --repeats batches of overhead = 1 - (Σ target + draft forward seconds) / (Σ decode
seconds), tokens/s and acceptance. It imports only the runner's public functions, so the same file measures an older
checkout too (`PYTHONPATH=<checkout> python specbench/bench/overhead.py ...`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any, Mapping, TypedDict, cast

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.common.aggregate import run_metrics
from specbench.common.configs import compose_config
from specbench.data.dataset import build_dataset
from specbench.data.prompting import encode
from specbench.decoding.metrics import example_metrics
from specbench.models.pairs import Pair, load_pair, resolve_device
from specbench.runs.binding import build_method, make_engine
from specbench.runs.validation import sampling_params

if TYPE_CHECKING:  # not imported when run: an older checkout may lack the module
    from specbench.decoding.decoders import Decoder

DECODES = {"greedy": 0.0, "sample": 1.0}  # decode name -> temperature


class BatchFigures(TypedDict):
    """What `measure` finds of one batch."""

    overhead: float | None
    tokens_per_s: float
    acceptance: float | None


def resolved(node: DictConfig) -> dict[str, Any]:
    """A config mapping as plain values, interpolations resolved (a DictConfig always converts to a dict)."""
    return cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))


def prompts_of(cfg_pair: str, dataset: str, n: int, device: torch.device) -> tuple[Pair, list[list[int]]]:
    """The pair of conf/pair/<name>.yaml and the first prompts of conf/dataset/<dataset>.yaml, repeated up to n."""
    cfg = compose_config([f"pair={cfg_pair}", f"dataset={dataset}"])
    pair = load_pair(resolved(cfg.pair), device)
    examples = build_dataset(resolved(cfg.dataset)).examples()[:n]
    prompts = [encode(pair.tokenizer, ex) for ex in examples]
    return pair, [prompts[i % len(prompts)] for i in range(n)]


def measure(engine: Decoder, prompts: list[list[int]], max_new: int, seeded: bool) -> BatchFigures:
    """One engine.generate_batch over prompts [B][P_b]: engine overhead, acceptance (run_metrics) and wall tokens/s."""
    device = cast(torch.device, engine.device)  # the verifier model's device (nn.Module leaves .device untyped)
    gens: list[torch.Generator | None] | None = ([torch.Generator(device=device).manual_seed(b)
                                                  for b in range(len(prompts))] if seeded else None)
    t0 = time.perf_counter()
    out = engine.generate_batch(prompts, max_new, gens)
    wall = time.perf_counter() - t0
    m = run_metrics([example_metrics(g) for g in out])
    return {"overhead": m["engine_overhead"], "tokens_per_s": m["total_new_tokens"] / wall,
            "acceptance": m["acceptance_rate"]}


def positive(text: str) -> int:
    """An integer >= 1, else argparse's error naming the value."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
    return value


def sizes(text: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]; argparse's error for anything but integers >= 1."""
    return [positive(x) for x in text.split(",")]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The command's options."""
    ap.add_argument("--pair", default="bench_random")
    ap.add_argument("--dataset", default="smoke")
    ap.add_argument("--batch-sizes", type=sizes, default=sizes("1,8,32,64"), help="comma-separated batch sizes")
    ap.add_argument("--decodes", default="greedy,sample", help=f"comma-separated, of {', '.join(DECODES)}")
    ap.add_argument("--gamma", type=positive, default=5)
    ap.add_argument("--max-new-tokens", type=positive, default=64)
    ap.add_argument("--repeats", type=positive, default=3, help="measured batches per (decode, B); medians printed")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    """Measure and print one line per (decode, B)."""
    torch.set_num_threads(args.threads)
    batch = args.batch_sizes
    decodes = args.decodes.split(",")
    bad = [d for d in decodes if d not in DECODES]
    if bad:
        print(f"--decodes: {', '.join(bad)} unknown; valid: {', '.join(DECODES)}", file=sys.stderr)
        return 2
    pair, prompts = prompts_of(args.pair, args.dataset, max(batch), resolve_device(args.device))
    print(f"pair {args.pair}, {args.dataset} prompts, vanilla γ={args.gamma}, {args.max_new_tokens} new tokens, device "
          f"{args.device}, {torch.get_num_threads()} thread(s), median of {args.repeats} batches per line")
    print("| decode | B | overhead | tokens/s | acceptance |")
    print("|---|---|---|---|---|")
    for decode in decodes:
        params = sampling_params({"temperature": DECODES[decode], "max_new_tokens": args.max_new_tokens})
        engine = make_engine(pair, build_method({"name": "vanilla", "gamma": args.gamma, "parts": {"rule": "rejection"}}),
                             params, ())
        measure(engine, prompts[: min(batch)], args.max_new_tokens, decode == "sample")  # warm-up
        got: dict[int, list[Mapping[str, Any]]] = {b: [] for b in batch}
        for _ in range(args.repeats):
            for b in batch:
                got[b].append(measure(engine, prompts[:b], args.max_new_tokens, decode == "sample"))
        for b in batch:
            med = {k: statistics.median(m[k] for m in got[b]) for k in got[b][0]}
            print(f"| {decode} | {b} | {med['overhead']:.2%} | {med['tokens_per_s']:.1f} | {med['acceptance']:.3f} |",
                  flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command as a script (for an older checkout, which has no such subcommand)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
