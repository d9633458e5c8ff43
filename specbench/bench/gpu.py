"""`python -m specbench.bench gpu --out DIR [--budget MINUTES]`: the GPU characterisation in one command, nothing
downloaded, fitted to a job's time limit (`--budget`; docs/gpu.md, "GPU figures in one command").

Each pair of PAIRS runs its SECTIONS (specbench.bench.gpu_sections), the CUDA test lane once after the first pair's
engines; with --budget a section starts only when its estimate (specbench.bench.schedule) fits the time left, else it
is listed as skipped, and one that outruns the budget is cut between its steps. DIR/report.md gets each section as
soon as it is measured; figures.jsonl, profile.json and the plots go beside it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from pathlib import Path

import torch

from specbench.bench import profile as prof
from specbench.bench.gpu_report import Report, machine
from specbench.bench.gpu_sections import (DEFAULT_BUDGET, PAIRS, SECTION_RUN, SPLIT_PROMPTS, SPLIT_TOKENS,
                                          TREE_METHODS, Ctx, PairRun, check_pairs, config, goals, params_b, run_lane)
from specbench.bench.common import batch_sizes
from specbench.bench.overhead import positive
from specbench.bench.schedule import BUILD_S_PER_B, LANE_S, OVERHEAD, Budget, OutOfTime, Pace
from specbench.decoding.compiled import WIDTHS
from specbench.models.pairs import free_pairs
from specbench.runs.provenance import git_info, package_versions

SECTIONS = ("build", "engines", "costs", "compiled", "batch", "trees", "split")  # per pair, in order of value; split
# leaves the target split over two places: the pair's last
log = logging.getLogger(__name__)


def plan(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(pair, section) in the order they run: the chosen sections (--sections) of the first pair, the lane after the
    first engines section planned (at the end if none is), then the next pair's; ("", "lane") is the lane."""
    out = [(name, s) for name in args.pairs for s in SECTIONS
           if (s != "compiled" or args.compile) and chosen(args.sections, name, s)]
    if args.lane:
        first = next((i for i, (_, s) in enumerate(out) if s == "engines"), len(out) - 1)
        out.insert(first + 1, ("", "lane"))
    return out


def chosen(sections: list[str] | None, pair: str, section: str) -> bool:
    """Does --sections ask for `section` of `pair`: build always, all without --sections, else SECTION, PAIR:SECTION?"""
    return section == "build" or sections is None or section in sections or f"{pair}:{section}" in sections


def check_sections(sections: list[str] | None, pairs: list[str]) -> str | None:
    """Why --sections cannot run (an unknown section or a pair not in --pairs), or None."""
    valid = [s for s in SECTIONS if s != "build"]
    for item in sections or []:
        pair, _, section = item.rpartition(":")
        if section not in valid:
            return f"--sections: unknown section {section!r} in {item!r}; valid: {', '.join(valid)} (or PAIR:SECTION)"
        if pair and pair not in pairs:
            return f"--sections: {item!r} names pair {pair!r}, which is not in --pairs ({', '.join(pairs) or 'none'})"
    return None


def estimate(section: str, run: PairRun | None, ctx: Ctx) -> float | None:
    """Seconds the section should take at the measured pace (specbench.bench.schedule); None with nothing measured."""
    args, dev = ctx.args, ctx.device.type
    if section == "lane":
        return min(LANE_S[dev], args.lane_timeout)
    assert run is not None, f"section {section} is a pair's"
    params = params_b(run.cfg)
    per_b = ctx.build_s_per_b or BUILD_S_PER_B[dev]
    pace = ctx.pace if run.pair is not None else (ctx.pace.for_pair(params) if ctx.pace else None)
    if section == "build":
        return per_b * params + (engines_s(pace, args, "eager") if pace else 0.0)
    if pace is None:
        return None
    steps = args.profile_steps + 3
    if section == "engines":
        return engines_s(pace, args, "eager")
    if section == "costs":
        chains = sum(pace.target(b * w) for b in args.batch_sizes for w in prof.CHAIN_WIDTHS)
        trees = sum(pace.target(n + 1) for n in prof.TREE_NODES)
        return steps * (chains + trees + sum(pace.draft(b) for b in args.batch_sizes)) * OVERHEAD
    if section == "compiled":
        profile = steps * (sum(pace.target(w) for w in WIDTHS) + pace.draft(1))
        return engines_s(pace, args, "compiled") + profile + pace.compile_s(len(WIDTHS) + 2)
    n, g = args.max_new_tokens, args.gamma
    if section == "batch":
        return OVERHEAD * (pace.ar(1, n) + pace.vanilla(1, g, n) +
                           sum(pace.ar(b, n) + pace.vanilla(b, g, n) for b in args.batch_sizes))
    if section == "trees":  # warm-up, then each B: ar, vanilla and each tree method (about 2 vanilla's)
        k = 1 + 2 * len(TREE_METHODS)
        return OVERHEAD * (pace.ar(1, n) + k * pace.vanilla(1, g, n) +
                           sum(pace.ar(b, n) + k * pace.vanilla(b, g, n) for b in args.batch_sizes))
    if section == "split":  # ar and vanilla, warm-up and measured, on one device and split (SPLIT_SLOWDOWN slower)
        k = min(n, SPLIT_TOKENS)
        return 2 * OVERHEAD * (1 + SPLIT_SLOWDOWN) * (1 + SPLIT_PROMPTS) * (pace.ar(1, k) + pace.vanilla(1, g, k))
    raise ValueError(f"unknown section {section!r}")


SPLIT_SLOWDOWN = 20.0  # a prior: half an 8B target's bf16 weights over PCIe per forward, against its eager forward
UNCORRECTED = ("build", "lane")  # estimated from priors, not the pace model: never corrected, never correcting


def corrected(est: float | None, section: str, ctx: Ctx) -> float | None:
    """The pace model's estimate times the median ratio taken / estimated of the sections done so far (the model
    misses what it does not count, e.g. a host-bound framework's launches; the ratio learns it within the run)."""
    return est if est is None or section in UNCORRECTED else est * ctx.correction()


def engines_s(pace: Pace, args: argparse.Namespace, path: str) -> float:
    """Seconds of engine_figures on one path: a warm-up and `repeats` passes over the prompts of ar, vanilla,
    transformers' greedy (an ar) and assisted generation (about 1.5 vanilla's), 17 timed forwards of each of three
    calls, and compiling (compiled)."""
    n, g = args.max_new_tokens, args.gamma
    per_prompt = 2 * pace.ar(1, n) + 2.5 * pace.vanilla(1, g, n)
    calls = 17 * (pace.target(1) + pace.target(g + 1) + pace.draft(1))
    compile_s = pace.compile_s(6) if path == "compiled" else 0.0  # target widths 1, 2, 4, 8; draft 1, 2
    return OVERHEAD * (1 + args.repeats) * args.prompts * per_prompt + calls + compile_s


def cmd_gpu(args: argparse.Namespace, command: str) -> int:
    """The planned sections in order within the budget into args.out; exit status 1 when tokens differed or the
    lane failed, 2 when the device or --pairs cannot run."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False); run it on a GPU "
              "node, or `--quick --device cpu` to check the command", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    fill_defaults(args)
    why = check_pairs(args.pairs, args.quick) or check_sections(args.sections, args.pairs)
    if why:
        print(why, file=sys.stderr)
        return 2
    budget = Budget(args.budget * 60 if args.budget else None)
    rep = Report(Path(args.out), args.append)
    rep.write("# specbench GPU characterisation" + (" (--quick: tiny sizes)" if args.quick else ""),
              f"`{command}`", *machine(device),
              f"- budget: {f'{args.budget:g} min' if args.budget else 'none'} (sections that would not fit are skipped)")
    header = {"machine": machine(device), "versions": package_versions(), "git": git_info(), "command": command}
    ctx = Ctx(rep, args, device, budget, header)
    runs = {name: PairRun(name, config(name, device, args.quick)) for name in args.pairs}
    schedule, failed = [], False
    planned = plan(args)
    last = {name: section for name, section in planned}  # each pair's last section
    for name, section in planned:
        run = runs.get(name)
        if run is not None and section != "build" and run.pair is None:
            schedule.append([name, section, "-", "-", "skipped: the pair was not built"])
            continue
        est, left = corrected(estimate(section, run, ctx), section, ctx), budget.left()
        if est is not None and est > left:
            schedule.append([name, section, f"{est:.0f}", "-", f"skipped: estimated {est:.0f} s, {left:.0f} s left"])
            rep.write(f"Skipped {name} {section}: estimated {est:.0f} s at the measured pace, {left:.0f} s left.")
            continue
        t0, note = time.monotonic(), "done"
        try:
            if section == "lane":
                failed |= lane_section(ctx, min(args.lane_timeout, left))
            else:
                assert run is not None, f"section {section} is a pair's"
                SECTION_RUN[section](ctx, run)
                failed |= bool(section in ("engines", "compiled") and any(f.mismatches for f in run.figs.values()))
        except OutOfTime as err:
            note = f"cut short: {err}"
            rep.write(f"{name} {section} cut short: {err}.")
        except Exception as err:  # one section's failure must not lose the job's other sections
            note, failed = f"failed: {type(err).__name__}", True
            log.exception("%s %s failed", name, section)
            rep.write(f"**{name} {section} failed:** `{type(err).__name__}: {err}`",
                      "```", traceback.format_exc(limit=-8).strip(), "```")
            rep.record(pair=name, what="failure", section=section, error=f"{type(err).__name__}: {err}")
            if section == "build" and run is not None:
                run.pair = None
        took = time.monotonic() - t0
        schedule.append([name, section, "-" if est is None else f"{est:.0f}", f"{took:.0f}", note])
        if est and section not in UNCORRECTED and note == "done":
            ctx.ratios.append(took / (est / ctx.correction()))  # took / the model's own estimate
        if run is not None and section == last[name] and run.pair is not None:
            rep.write(*(f"![{f}]({f})" for f in (f"{name}_throughput.png", f"{name}_calls.png")
                        if (rep.out / f).exists()))
            run.pair = None  # the next pair needs the memory
            free_pairs()
    rep.write("## Schedule", f"Estimated and measured seconds per section, in the order run (budget "
              f"{f'{args.budget:g} min' if args.budget else 'none'}; {time.monotonic() - budget.start:.0f} s in all):")
    rep.table(["pair", "section", "estimated s", "took s", "outcome"], schedule)
    rep.record(what="schedule", budget_min=args.budget, rows=schedule)
    rep.write("## Goals" + (" (set for the full sizes on a GPU: --quick's tiny models on a CPU do not test them)"
                            if args.quick else ""), *goals(list(runs.values())))
    return 1 if failed else 0


def lane_section(ctx: Ctx, timeout: float) -> bool:
    """The test lane into the report; True when it failed."""
    lane = run_lane(ctx.device, ctx.args.quick, timeout)
    counts = ", ".join(f"{n} {k}" for k, n in lane.get("counts", {}).items()) or "no tests ran"
    ctx.rep.write("## Test lane", f"`{lane['command']}`: {counts}; {lane.get('summary') or lane.get('note')} "
                  f"(exit status {lane.get('exit')}, {lane.get('seconds', 0):.0f} s)" +
                  (f"; failed: {', '.join(lane['failed'])}" if lane.get("failed") else ""))
    ctx.rep.record(what="lane", **lane)
    return lane["command"] is not None and lane["exit"] not in (0, None) or bool(lane.get("failed"))


def budget_minutes(text: str) -> float:
    """--budget: minutes >= 0 (0: no limit); argparse's error otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected minutes >= 0 (0: no limit), e.g. 8")
    return value


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The command's options."""
    ap.add_argument("--out", required=True, help="folder of report.md, figures.jsonl and the PNGs (created)")
    ap.add_argument("--device", default="cuda", help="cuda (the default) or cpu (with --quick, to check the command)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: the same code in under a minute on a CPU")
    ap.add_argument("--pairs", type=lambda s: [p for p in s.split(",") if p], default=list(PAIRS),
                    help="comma-separated pair configs ('' for none: the lane alone)")
    ap.add_argument("--sections", type=lambda s: [p for p in s.split(",") if p], default=None,
                    help="comma-separated sections to run, each SECTION (every pair's) or PAIR:SECTION, of "
                         f"{', '.join(SECTIONS[1:])} (default: all; each chosen pair is built first)")
    ap.add_argument("--budget", type=budget_minutes, default=None,
                    help=f"minutes the run may take: sections whose estimate does not fit the time left are skipped "
                         f"(default {DEFAULT_BUDGET:g}: fits a 10-minute job with the install; quick: none; 0: none)")
    ap.add_argument("--append", action="store_true",
                    help="add to the report in --out instead of starting it anew")
    ap.add_argument("--prompts", type=positive, default=None, help="prompts per pair (default 3; quick 2)")
    ap.add_argument("--prompt-tokens", type=positive, default=None, help="tokens per prompt (default 128; quick 16)")
    ap.add_argument("--max-new-tokens", type=positive, default=None, help="default 128; quick 16")
    ap.add_argument("--gamma", type=positive, default=5)
    ap.add_argument("--repeats", type=positive, default=1)
    ap.add_argument("--batch-sizes", type=batch_sizes, default=None, help="default 1,4,16,64; quick 1,4")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="the compiled path beside the eager one (default: on, off with --quick)")
    ap.add_argument("--lane", action=argparse.BooleanOptionalAction, default=True, help="run the test lane")
    ap.add_argument("--lane-timeout", type=positive, default=150,
                    help="seconds the lane may take at most (default 150; cut short, it reports what ran)")
    ap.add_argument("--profile-steps", type=positive, default=None,
                    help="forwards per cost-profile figure (median; default 10, quick 3)")
    ap.add_argument("--threads", type=positive, default=1, help="torch CPU threads")


def fill_defaults(args: argparse.Namespace) -> None:
    """The size options' defaults, full or --quick (compile: on unless --quick)."""
    full = {"prompts": 3, "prompt_tokens": 128, "max_new_tokens": 128, "batch_sizes": [1, 4, 16, 64],
            "profile_steps": 10, "budget": DEFAULT_BUDGET}
    quick = {"prompts": 2, "prompt_tokens": 16, "max_new_tokens": 16, "batch_sizes": [1, 4], "profile_steps": 3,
             "budget": 0.0}
    for k, v in {**(quick if args.quick else full), "compile": not args.quick}.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
