"""The analytic speedup over `ar` that a run's own acceptance and call costs predict (Leviathan et al. 2023,
generalised to the draft lengths the method actually used).

Each example's iteration records are reduced to sufficient statistics kept in its row (a resumed run keeps them),
the first iteration left out (its forwards include the prompt): `call_stats` (per draft length w the iterations;
per draft position i how often it was verified, `reached`: drafts 1..i-1 accepted, and accepted) and `call_seconds`
(per w the summed verify and draft seconds; the draft phase's forwards `draft_steps` and the tokens they fed per row
`draft_tokens`, both the batch's at B > 1 as the seconds are, which a projection onto a cost profile prices,
specbench.runs.projection; the wall seconds split into the verifier's forwards `verify_forward_s`, the drafter's
`draft_forward_s` and the host work outside every forward `host_s`, which a projection keeps as measured). Then,
over the run's iterations (a ratio of sums: tokens per second against ar's 1 / c_target(1)):

    alpha_i = accepted_i / reached_i                    (P(draft i accepted | drafts 1..i-1 accepted))
    E[T | D] = 1 + sum_{k=1..D} prod_{i=1..k} alpha_i   (tokens per iteration: accepted drafts + 1)
    cost(w) = w * c_draft + c_target(w + 1) [+ h(w)]    (seconds per iteration)
    predicted_speedup = sum_iter E[T | D] / sum_iter cost(w) * (c_target(1) [+ h_ar])

w: the drafted nodes the iteration verified (w + 1 tokens with the root's); D its depth: a chain's is w; a tree's
its deepest node, "position i" is depth i and alpha_i the tree's acceptance at depth i given depth i - 1 was
reached (iterations by D kept as `depths`). With one w and c_target(w+1) = c_target(1) = 1 / c this is Leviathan's
(1 - alpha^{w+1}) / ((1 - alpha)(w c + 1)). c_target(k): the mean verify time of the iterations that verified k
tokens; c_draft: draft seconds per drafted token; h(w) and h_ar, the host work outside the forwards, only in a
projection onto a cost profile (whose forwards hold none of it; the run's own phases' seconds hold most of it).
At B > 1 a row's seconds are its batch's calls' (a row that verified k tokens shared a call as wide as the batch's
widest), so c_target(1), ar's cost per token of each row, must be a call over B rows verifying one token each:
always a calibration's at B. At B = 1 it comes from the rows' one-token verifies where there are any, else (e.g.
vanilla without a short last block) from the calibration: a short `ar` decode at the run's batch size
(specbench.runs.calibration.calibrate_target_1), measured once per set of repeats and recorded in the run folder
(specbench.runs.measurements), so recomputing a summary from the same rows gives the same prediction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, TypedDict, TypeVar, cast

from specbench.decoding.records import IterationRecord


COUNTS: Final = ("iterations", "depths", "reached", "accepted")  # the row field call_stats: the same on every rerun
SECONDS: Final = ("verify_s", "draft_s", "draft_steps", "draft_tokens",  # the row field call_seconds: what the calls cost
                  "verify_forward_s", "draft_forward_s", "host_s",  # and the iterations' wall split: forwards and host work
                  "look_nodes")  # and the look-only nodes the verifies fed besides the w verified

N = TypeVar("N", int, float)


class StatsBase(TypedDict):
    """The call_stats keys every row version holds (see CallStats)."""

    iterations: dict[str, int]  # draft length w (a string) -> iterations
    reached: list[int]  # per draft position i = 1..: the iterations that verified it
    accepted: list[int]  # per draft position i = 1..: the iterations that accepted it
    verify_s: dict[str, float]  # per w: the summed verify seconds
    draft_s: dict[str, float]  # per w: the summed draft seconds


class CallStats(StatsBase, total=False):
    """A run's sufficient statistics (module docstring): the row fields call_stats and call_seconds together. Rows
    of an older version lack the keys below; merge_stats gives every key."""

    depths: dict[str, int]  # proposal depth D -> iterations (older rows: chains, D = w)
    draft_steps: dict[str, int]  # per w: the draft forwards
    draft_tokens: dict[str, int]  # per w: the tokens they fed per row
    verify_forward_s: dict[str, float]  # per w: the verifier's forwards' seconds
    draft_forward_s: dict[str, float]  # per w: the drafter's forwards' seconds
    host_s: dict[str, float]  # per w: the host work outside every forward
    look_nodes: dict[str, int]  # per w: the look-only nodes its verifies fed per row (Lookahead's window)


class RowCounts(TypedDict):
    """The row field call_stats (COUNTS): the same at every batch size and on every rerun."""

    iterations: dict[str, int]
    depths: dict[str, int]
    reached: list[int]
    accepted: list[int]


class RowSeconds(TypedDict):
    """The row field call_seconds (SECONDS): timings, and the draft forwards and tokens, which differ per batch size."""

    verify_s: dict[str, float]
    draft_s: dict[str, float]
    draft_steps: dict[str, int]
    draft_tokens: dict[str, int]
    verify_forward_s: dict[str, float]
    draft_forward_s: dict[str, float]
    host_s: dict[str, float]
    look_nodes: dict[str, int]


class RowFields(TypedDict):
    """call_stats as the two row fields."""

    call_stats: RowCounts
    call_seconds: RowSeconds


class CallCosts(TypedDict):
    """call_costs: the mean seconds of the calls an iteration makes (see there)."""

    batch_size: int
    target_1: float | None
    target_1_from: str | None
    target_by_width: dict[str, float]
    draft_per_token: float | None


def call_stats(records: list[IterationRecord]) -> CallStats:
    """One generation's sufficient statistics, its first iteration left out: per draft length w (a string key)
    the iterations and their summed SECONDS fields; per draft position i = 1.. how often it was verified
    (`reached`: positions 1..accepted+1, not past w) and accepted."""
    return merge_stats(cast(CallStats, {"iterations": {str(r.drafted): 1}, "depths": {str(depth(r)): 1},
                                        **{k: {str(r.drafted): getattr(r, k)} for k in SECONDS},
                                        "reached": [1] * min(depth(r), r.accepted + 1), "accepted": [1] * r.accepted})
                       for r in records[1:])


def depth(r: IterationRecord) -> int:
    """The depth D of an iteration's proposal: a chain's is its length."""
    return r.drafted if r.depth is None else r.depth


def row_fields(stats: CallStats) -> RowFields:
    """call_stats as row fields: `call_stats` (counts the same at every batch size and on every rerun) and
    `call_seconds` (timings, which differ per run, and the draft forwards and tokens, which differ per batch size)."""
    return {"call_stats": cast(RowCounts, {k: stats[k] for k in COUNTS}),
            "call_seconds": cast(RowSeconds, {k: stats[k] for k in SECONDS})}


def from_row(row: Mapping[str, Any]) -> CallStats | None:
    """A row's call_stats back from its two fields (None for rows of an older version)."""
    if not row.get("call_stats") or not row.get("call_seconds"):
        return None
    return cast(CallStats, {**row["call_stats"], **row["call_seconds"]})  # JSON fields row_fields wrote (or older)


def merge_stats(stats: Iterable[CallStats | None]) -> CallStats:
    """The sum of several call_stats (None entries, e.g. rows of an older version, are skipped; a key older rows
    lack, e.g. draft_steps, counts as empty)."""
    out: CallStats = {"iterations": {}, "depths": {}, "verify_s": {}, "draft_s": {}, "draft_steps": {},
                      "draft_tokens": {}, "verify_forward_s": {}, "draft_forward_s": {}, "host_s": {},
                      "look_nodes": {}, "reached": [], "accepted": []}
    for s in stats:
        if not s:
            continue
        add(out["depths"], s.get("depths", s["iterations"]))
        given = cast(Mapping[str, Any], s)
        for counts in ("iterations", "draft_steps", "draft_tokens", "look_nodes"):
            add(out[counts], given.get(counts, {}))
        for seconds in ("verify_s", "draft_s", "verify_forward_s", "draft_forward_s", "host_s"):
            add(out[seconds], given.get(seconds, {}))
        for key in ("reached", "accepted"):
            out[key].extend([0] * (len(s[key]) - len(out[key])))
            for i, n in enumerate(s[key]):
                out[key][i] += n
    return out


def add(into: dict[str, N], more: Mapping[str, N]) -> None:
    """into[w] += more[w] for every w of more (a w into lacks counts from 0)."""
    for w, value in more.items():
        into[w] = into.get(w, 0) + value


def alphas(stats: CallStats) -> list[float]:
    """alpha_i = accepted_i / reached_i for every position i = 1.. up to the deepest verified (0 where never
    reached; accepted counts stop at the deepest position ever accepted)."""
    accepted = stats["accepted"]
    return [(accepted[i] if i < len(accepted) else 0) / r if r else 0.0 for i, r in enumerate(stats["reached"])]


def expected_tokens(alpha: list[float], w: int) -> float:
    """E[T | w] = 1 + sum_{k=1..w} prod_{i=1..k} alpha_i: tokens one iteration of draft length w commits."""
    total, prod = 1.0, 1.0
    for i in range(w):
        prod *= alpha[i] if i < len(alpha) else 0.0
        total += prod
    return total


def call_costs(stats: CallStats, target_1: float | None = None, batch_size: int = 1) -> CallCosts:
    """CallCosts: mean seconds of a target call by the tokens a row verified ({"w+1": s}), draft seconds per
    drafted token, and target_1 from the stats when B = 1 and observed (iterations of w = 0 that fed one token, not
    Lookahead's window), else the `target_1` given (a calibration)."""
    n = stats["iterations"]
    by_width = {str(int(w) + 1): stats["verify_s"][w] / n[w] for w in sorted(n, key=int)}
    drafted = sum(int(w) * k for w, k in n.items())
    # at B > 1 a row's one-token verify shared a wider call; a w = 0 verify that fed look-only nodes is wider too
    one_token = batch_size == 1 and not stats.get("look_nodes", {}).get("0")
    observed = by_width.get("1") if one_token else None
    return {"batch_size": batch_size, "target_1": observed if observed is not None else target_1,
            "target_1_from": "rows" if observed is not None else "calibration" if target_1 is not None else None,
            "target_by_width": by_width,
            "draft_per_token": sum(stats["draft_s"][w] for w in by_key(stats["draft_s"])) / drafted if drafted
            else None}


def by_key(counts: Mapping[str, object]) -> list[str]:
    """A per-width dict's keys in numeric order: sums over them do not depend on the order rows listed them."""
    return sorted(counts, key=int)


def predicted_speedup(stats: CallStats, costs: Mapping[str, Any]) -> float | None:
    """sum_iter E[T | D] / sum_iter (w c_draft + c_target(w+1) + h(w)) * (c_target(1) + h_ar); None without drafts
    or costs. h(w) (costs' `host_by_drafted`: mean host seconds of an iteration of w nodes) and h_ar (`host_1`, ar's
    per token) are 0 where absent (the run's own call costs, whose phases' seconds hold most host work)."""
    n, c1, cd = stats["iterations"], costs["target_1"], costs["draft_per_token"]
    if not n or c1 is None or cd is None:
        return None
    alpha, depths = alphas(stats), stats.get("depths") or n  # rows of an older version: chains, D = w
    tokens = sum(depths[d] * expected_tokens(alpha, int(d)) for d in by_key(depths))
    seconds = iteration_seconds(n, costs)
    return tokens / seconds * (c1 + (costs.get("host_1") or 0.0)) if seconds else None


def iteration_seconds(iterations: Mapping[str, int], costs: Mapping[str, Any]) -> float:
    """predicted_speedup's denominator sum_iter (w c_draft + c_target(w+1) + h(w)) over iterations {w: count}."""
    host, cd = costs.get("host_by_drafted") or {}, costs["draft_per_token"]
    return sum(iterations[w] * (int(w) * cd + costs["target_by_width"][str(int(w) + 1)] + host.get(w, 0.0))
               for w in by_key(iterations))
