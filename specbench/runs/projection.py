"""A run's own recorded iterations at a hardware cost profile's costs (`python -m specbench.report DIR --profile
PROFILE`): the speedup over `ar` the run would have where the profile was measured, by predicted_speedup's formula
(specbench.decoding.speedup) with the profile's call costs (specbench.decoding.profiles.iteration_costs).

Kept from the run: its iterations' draft lengths (verify widths) and depths, its acceptance per position and its
draft forwards and the tokens they fed (call_stats, each generation's first iteration left out). Taken from the
profile entry of the run's pair, batch size, dtype and path (profiles.pair_entries, `pick`): the target's forward of
w + 1 tokens (a chain) or of the root's token and w nodes (a tree), its one-token forward (ar's step) and the draft's
forwards (draft_cost). The host work outside the forwards (call_stats' host_s) is kept as measured on both sides, ar's
from the group's `ar` run (`baseline_host`); rows older than that split, or no `ar` run, give the forwards-only
projection (an upper bound where host work is a large part of an iteration). The host seconds are the run machine's:
on a GPU host work partly overlaps the device's, so this is its cost at most.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, TypedDict

from specbench.decoding.profiles import (Entry, ProfileError, draft_seconds, iteration_costs, pair_entries, pick,
                                         prefill_seconds, read)
from specbench.decoding.speedup import CallStats, alphas, from_row, iteration_seconds, merge_stats, predicted_speedup

__all__ = ["Entry", "ProfileError", "at_own_forwards", "draft_cost", "host_per_iteration", "price", "project",
           "project_whole", "read", "run_stats"]  # read: a profile.json, for the report


def run_stats(rows: list[dict]) -> dict[str, Any]:
    """What a projection needs from a run's rows: their merged call_stats (None where no row has them: rows of an
    older version) and its alpha_i (speedup.alphas), Σ draft_calls and Σ drafted, and `after_first_block_tps`, the
    measured counterpart of what a prediction models (after_first_block)."""
    stats = [from_row(r) for r in rows]
    merged = merge_stats(stats) if any(stats) else None
    if merged and not all(s and s.get("host_s") for s in stats):  # some rows older than the split: none of it
        for key in ("verify_forward_s", "draft_forward_s", "host_s"):
            merged[key] = {}
    return {"call_stats": merged, "alphas": alphas(merged) if merged else None,  # alpha_i, zeros included
            "draft_forwards": sum(int(r.get("draft_calls") or 0) for r in rows),
            "drafted_total": sum(int(r.get("drafted") or 0) for r in rows),
            "after_first_block_tps": after_first_block(rows), "first_blocks": first_blocks(rows, stats),
            "new_tokens_total": sum(int(r.get("new_tokens") or 0) for r in rows)}


def first_blocks(rows: list[dict], stats: list[CallStats | None]) -> list[tuple[int, int]] | None:
    """(prompt tokens P, nodes w_1 its first iteration drafted) of each generation: w_1 = the row's drafted nodes less
    those of the iterations in its call_stats, which leave the first out. None where a row lacks them (older rows) or
    answers several turns (the later turns' prompts are not recorded)."""
    out = []
    for r, st in zip(rows, stats):
        if r.get("prompt_tokens") is None or r.get("turn_outputs") or (st is None and r.get("drafted")):
            return None
        later = sum(int(w) * k for w, k in st["iterations"].items()) if st else 0
        out.append((int(r["prompt_tokens"]), max(int(r.get("drafted") or 0) - later, 0)))
    return out


def mean_context(runs: list[Mapping[str, Any]]) -> float | None:
    """The cache a run's later forwards attend over, on average: its generations' mean prompt P plus half their mean
    new tokens (a generation's context grows from P to P + new); None where rows lack prompt lengths."""
    blocks = [p for r in runs for p, _ in (r.get("first_blocks") or [])]
    if not blocks or any(not r.get("first_blocks") for r in runs):
        return None
    return statistics.mean(blocks) + sum(int(r["new_tokens_total"]) for r in runs) / len(blocks) / 2


def after_first_block(rows: list[dict]) -> float:
    """Tokens per second of the rows' generations after their first block (the prompt's forwards and the first
    iteration, which predicted_speedup and a projection leave out), the median over repeats: per repeat Σ tokens the
    later iterations committed (Σ accepted + 1 per iteration, from call_stats) / Σ (decode_s - first_block_s /
    batch_size). NaN where a row lacks call_stats or first_block_s. A multi-turn row's later turns' first blocks stay
    in (call_stats leaves each turn's first iteration out, first_block_s is the first turn's)."""
    sums: dict[int, list[float]] = {}
    for r in rows:
        stats = from_row(r)
        if stats is None or r.get("first_block_s") is None:
            return float("nan")
        at = sums.setdefault(int(r.get("repeat") or 0), [0.0, 0.0])
        at[0] += sum(stats["accepted"]) + sum(stats["iterations"].values())
        at[1] += r["decode_s"] - r["first_block_s"] / int(r.get("batch_size") or 1)
    rates = [tokens / seconds for tokens, seconds in sums.values() if seconds > 0]
    return statistics.median(rates) if rates else float("nan")


def pair_drafter(method: str) -> bool | None:
    """Does `method` draft with the pair's draft model (or a drafter trained from it)? Its drafter part says
    (Needs.pair_draft); None for a method that is not known here."""
    from specbench.decoding.compose import part_classes
    from specbench.decoding.parts import Drafter

    try:
        drafter = part_classes({"name": method}).get("drafter")  # None: a loop, whose assistant is the pair's draft
        return drafter is None or (issubclass(drafter, Drafter) and drafter.needs.pair_draft)
    except Exception:  # noqa: BLE001 - an unknown or unimportable method: no projection, said in the note
        return None


def host_per_iteration(stats: CallStats | None) -> float | None:
    """The mean host seconds of an iteration (call_stats' host_s over its iterations; ar's: per token), None for
    rows older than the split."""
    if not stats or not stats.get("host_s") or not stats["iterations"]:
        return None
    return sum(stats["host_s"].values()) / sum(stats["iterations"].values())


def host_by_drafted(stats: CallStats) -> dict[str, float]:
    """h(w): the mean host seconds of an iteration of w drafted nodes, per width the run's call_stats recorded."""
    return {w: stats["host_s"][w] / k for w, k in stats["iterations"].items() if k}


def at_own_forwards(stats: CallStats | None, baseline: CallStats | None) -> float | None:
    """predicted_speedup's formula over the run's iterations at the run's own in-loop forward and host costs, against
    ar's (`baseline`, its call_stats) per token: the formula's error (its E[T | D]) apart from a profile's (its
    forwards against the loop's); None without the host split on both sides."""
    if stats is None or baseline is None or host_per_iteration(stats) is None or host_per_iteration(baseline) is None:
        return None
    n, ar_its = stats["iterations"], sum(baseline["iterations"].values())
    nodes = sum(int(w) * k for w, k in n.items())
    costs = {"target_1": sum(baseline["verify_forward_s"].values()) / ar_its,
             "host_1": sum(baseline["host_s"].values()) / ar_its,
             "target_by_width": {str(int(w) + 1): stats["verify_forward_s"][w] / k for w, k in n.items() if k},
             "host_by_drafted": host_by_drafted(stats),
             "draft_per_token": sum(stats["draft_forward_s"].values()) / nodes if nodes else 0.0}
    return predicted_speedup(stats, costs)


def draft_cost(run: Mapping[str, Any], entry: Entry, target_s: float | None, tree: bool = False,
               kv: float | None = None) -> tuple[float | None, str]:
    """(the draft seconds per drafted node of the run's iterations at the entry's costs, in words), or (None, why).

    Drafts from no model (`pld`) cost 0. The pair's draft model: Σ_w steps_w · draft(tokens_w / steps_w) / Σ drafted
    nodes, from call_stats' draft_steps and draft_tokens per width w (a tree it grows, dyn_tree or spec_tree, at the
    entry's draft tree forwards `draft_tree_s` where it has them); rows older than those counts: Σ draft_calls / Σ
    drafted one-token forwards per node. A drafter that is not the pair's draft model (an EAGLE-3 or Medusa head,
    layer_skip's early exit) is part of the target's computation, with no forward of its own in a profile: its
    measured seconds per drafted node are scaled by `target_s`, the profile's seconds for the run's verifies, over the
    run's own measured seconds for them."""
    stats, forwards, drafted = run["call_stats"], run["draft_forwards"], run["drafted_total"]
    if not drafted:
        return None, "no drafts"
    nodes = sum(int(w) * n for w, n in stats["iterations"].items())
    if not nodes:
        return None, "no drafted nodes after the first iterations"
    pair_draft = pair_drafter(run["method"])
    if pair_draft is None:
        return None, f"method {run['method']} is not registered here: its drafter's cost is unknown"
    if not forwards:
        return 0.0, "drafts from no model (no draft cost)"
    if not pair_draft:  # its forwards' seconds where recorded (the host work between them is kept apart)
        split = bool(stats.get("draft_forward_s"))
        draft_s = sum((stats.get("draft_forward_s" if split else "draft_s") or {}).values())
        verify_s = sum((stats.get("verify_forward_s" if split else "verify_s") or {}).values())
        if not verify_s or target_s is None:
            return None, f"{run['method']}'s drafter is not the pair's draft and the run recorded no verify seconds"
        scale = target_s / verify_s
        return draft_s / nodes * scale, (f"{run['method']}'s drafter (not the pair's draft) at its measured "
                                         f"{'forward ' if split else ''}seconds x {scale:.3g}, the profile's over "
                                         f"the run's verify {'forward ' if split else ''}seconds")
    steps, tokens = stats.get("draft_steps") or {}, stats.get("draft_tokens") or {}
    if sum(steps.values()) and sum(tokens.values()):
        trees = tree and bool(entry.get("draft_tree_s"))
        seconds = sum(k * draft_seconds(entry, tokens.get(w, k) / k, trees, kv) for w, k in steps.items() if k)
        per_forward = sum(steps.values()) / nodes
        width = sum(tokens.values()) / sum(steps.values())
        exact = ("" if entry.get("draft_chain_s") else " (the entry has no draft widths: one-token forwards)"
                 ) if not trees else ", tree forwards"
        return seconds / nodes, f"{per_forward:.3g} draft forwards per drafted node of {width:.3g} tokens{exact}"
    ratio = forwards / drafted  # rows older than draft_steps: every draft forward a one-token one
    said = f"{ratio:.3g} draft forwards per drafted node, of one token each (older rows)"
    return ratio * draft_seconds(entry, 1, kv=kv), said


def project(run: Mapping[str, Any], profile: dict, by_name: str | None = None,
            baseline_host: float | None = None) -> tuple[float | None, str]:
    """(the speedup over ar of the run's iterations at the profile's costs, which entry and draft cost it used) or
    (None, why not); `run` is a loaded run (specbench.analysis.load), `baseline_host` ar's host seconds per token
    (None: forwards only). ProfileError when the profile has no entry of the run's pair (or of `by_name`)."""
    priced = price(run, profile, by_name, baseline_host)
    if isinstance(priced, str) or priced["draft_per_node"] is None:
        return None, priced if isinstance(priced, str) else priced["draft_said"]
    return predicted_speedup(run["call_stats"], priced["costs"]), priced["said"]


def project_whole(run: Mapping[str, Any], base: Mapping[str, Any], profile: dict, by_name: str | None = None,
                  baseline_host: float | None = None) -> tuple[float | None, str]:
    """(the run's speedup over its `ar` run `base` with every generation's first block priced too, at the profile's
    costs) or (None, why not): the measured speedup's own definition, Σ new tokens / Σ time of the run over ar's.

    The time of the run is its later iterations at the profile (`price`: the formula's denominator, the host work as
    measured) plus each generation's first block: the target's forward of its prompt and first drafts, P + w_1 tokens
    (the entry's `target_prefill_s`), and the drafter's first drafts: the pair's draft model's prefill of the P prompt
    tokens and w_1 - 1 one-token forwards; another drafter's w_1 nodes at its cost per node of the later iterations;
    none for drafts from no model; plus the host work of an iteration of w_1 nodes. ar's time is its prefill of P
    tokens, then a one-token forward and its host work per later token."""
    if run["first_blocks"] is None or base.get("first_blocks") is None:
        return None, "rows without prompt_tokens or with several turns (their first blocks are not recorded)"
    priced = price(run, profile, by_name, baseline_host)
    if isinstance(priced, str) or priced["draft_per_node"] is None:
        return None, priced if isinstance(priced, str) else priced["draft_said"]
    entry = priced["entry"]  # ar's too: the same pair, dtype, path and batch size
    if prefill_seconds(entry, "target", 1) is None:
        return None, f"the profile's {priced['which']} has no prefill costs (target_prefill_s)"
    costs, stats, cd = priced["costs"], run["call_stats"], priced["draft_per_node"]
    host = costs.get("host_by_drafted") or {}
    later = iteration_seconds(stats["iterations"], costs)
    mean_host = (host_per_iteration(stats) or 0.0) if host else 0.0
    pair_draft, model = pair_drafter(run["method"]), bool(run["draft_forwards"])
    if pair_draft and model and prefill_seconds(entry, "draft", 1) is None:
        return None, f"the profile's {priced['which']} has no draft prefill costs (draft_prefill_s)"

    def prefill(role: str, tokens: int) -> float:  # an entry has a role's prefills at every length or at none
        seconds = prefill_seconds(entry, role, tokens)
        assert seconds is not None, f"checked above: the entry has {role}_prefill_s"
        return seconds

    def first(p: int, w: int) -> float:  # one generation's first block at the profile's costs
        draft = 0.0 if not model or not w else (prefill("draft", p) + (w - 1) * entry["draft_token_s"]
                                                if pair_draft else w * cd)
        return prefill("target", p + w) + draft + (host.get(str(w), mean_host) if w else mean_host)

    run_s = later + sum(first(p, w) for p, w in run["first_blocks"])
    c1, h1 = costs["target_1"], costs.get("host_1") or 0.0
    ar_first = sum(prefill("target", p) for p, _ in base["first_blocks"])
    ar_s = ar_first + (base["new_tokens_total"] - len(base["first_blocks"])) * (c1 + h1)
    if run_s <= 0 or ar_s <= 0 or not base["new_tokens_total"]:
        return None, "no time to compare"
    speedup = (run["new_tokens_total"] / run_s) / (base["new_tokens_total"] / ar_s)
    return speedup, priced["said"] + ", first blocks priced"


class Priced(TypedDict):
    """What `price` finds for a run (see there)."""

    costs: dict[str, Any]  # specbench.decoding.speedup.call_costs' format and the host terms, for predicted_speedup
    draft_per_node: float | None
    draft_said: str
    said: str
    iterations: int
    verify_run: float
    verify_profile: float
    draft_run: float
    draft_profile: float | None
    host_run: float | None
    entry: Entry
    which: str


def price(run: Mapping[str, Any], profile: dict, by_name: str | None = None,
          baseline_host: float | None = None) -> Priced | str:
    """The profile's costs of the run's iterations, or why there are none: `costs` (for predicted_speedup, with the
    host terms where the run and `baseline_host` have them), `draft_per_node` (None: see `draft_said`), `said` (in
    words), and per iteration the seconds the run measured (its forwards' where recorded, else its phases') and the
    profile's for the same calls; `draft_profile` None without a draft cost, `host_run` None for older rows."""
    stats = run["call_stats"]
    if not stats or not stats["iterations"]:
        return "no recorded iterations (call_stats)"
    entries = pair_entries(profile, run["pair"], run["shapes"], by_name)
    dtype = run["dtype"] if isinstance(run["dtype"], str) else None  # a table's missing value (NaN): not recorded
    entry, which = pick(entries, run["pair"], dtype, run["path"], int(run["batch_size"]), any_dtype=by_name is not None)
    if entry is None:
        return which
    n = stats["iterations"]
    tree = stats.get("depths", n) != n
    widths = [int(w) for w in n]
    hidden = bool(run.get("hidden_verify"))  # its verifies returned hidden states (EAGLE-3, SD²)
    # the profile's verify of each width (draft below), in call_costs' format
    look = {w: k / n[w] for w, k in (stats.get("look_nodes") or {}).items() if n.get(w)}  # mean per iteration
    kv = mean_context([run]) if entry.get("long_tokens") else None  # its forwards' cache, where the entry prices it
    costs: dict[str, Any] = iteration_costs(entry, widths, tree, hidden=hidden, look=look, kv=kv)
    target_s = sum(k * costs["target_by_width"][str(int(w) + 1)] for w, k in n.items())
    per_node, said = draft_cost(run, entry, target_s, tree, kv) if run["drafted_total"] else (0.0, "no drafts")
    its, nodes = sum(n.values()), sum(int(w) * k for w, k in n.items())
    host = host_per_iteration(stats)
    if host is not None and baseline_host is not None:
        costs["host_by_drafted"] = host_by_drafted(stats)
        costs["host_1"] = baseline_host
        host_said = f"host work as measured ({1e3 * host:.3g} ms an iteration, ar's {1e3 * baseline_host:.3g} ms)"
    else:
        why = "rows older than the host split" if host is None else "no ar run's host work"
        host_said = f"forwards only ({why})"
    split = host is not None
    return {"costs": {**costs, "draft_per_token": per_node}, "draft_per_node": per_node, "draft_said": said,
            "said": f"{which}, {'tree' if tree else 'chain'} verifies"
                    + (" returning hidden states" + ("" if entry.get("target_hidden_s") else " (priced as plain "
                       "forwards: the entry has no target_hidden_s)") if hidden and not tree else "")
                    + (f", over a cache of {kv:.0f} tokens (the entry's {entry['prompt_tokens']} and "
                       f"{entry.get('long_tokens')})" if kv is not None else "")
                    + f", {said}, {host_said}", "iterations": its,
            "verify_run": sum(stats["verify_forward_s" if split else "verify_s"].values()) / its,
            "verify_profile": target_s / its,
            "draft_run": sum(stats["draft_forward_s" if split else "draft_s"].values()) / its,
            "draft_profile": None if per_node is None else per_node * nodes / its, "host_run": host,
            "entry": entry, "which": which}
