"""A run's numbers from its rows: the one aggregation behind summary.json, `bench methods` and the report.

Every number is pooled over the run's tokens and iterations (a ratio of sums over the rows), never a mean of
per-example ratios, so that #match / #cand = AccRate holds for the run; the plain per-example means stay in
summary.json under `example_means` (specbench.decoding.metrics.summarize).
"""

from __future__ import annotations

import logging
from statistics import median
from typing import Any, TypedDict

log = logging.getLogger(__name__)

COUNT = "draft_iterations"  # the row field: iterations that drafted anything (the divisor of #cand, #match)

# A run whose share of truncated rows (stopped at max_new_tokens before the answer was complete) is above
# this gets a warning, in its log and in the report: its scores measure the token budget more than the model.
TRUNCATED_WARN_FRAC = 0.05


def ratio(a: float, b: float) -> float | None:
    """a / b, or None where b is 0 (no data)."""
    return a / b if b else None


def total(rows: list[dict[str, Any]], key: str) -> float:
    """Σ rows[key] (a missing or null value counts 0)."""
    return sum(r.get(key) or 0 for r in rows)


def draft_iterations(rows: list[dict[str, Any]], source: str = "rows") -> int | None:
    """Σ draft_iterations; None (with a warning) if a row that drafted lacks it (rows of an older version)."""
    lacking = [r for r in rows if r.get("drafted") and r.get(COUNT) is None]
    if lacking:
        log.warning("%s: %d of %d rows that drafted have no %r (written by an older version); mean_drafted and "
                    "mean_accepted are left empty: rerun into a new folder to fill them", source, len(lacking),
                    sum(bool(r.get("drafted")) for r in rows), COUNT)
        return None
    return int(total(rows, COUNT))


def iteration_mean(rows: list[dict[str, Any]], key: str) -> float | None:
    """Σ row mean · iterations / Σ iterations over the rows that report `key` (a per-iteration mean)."""
    have = [r for r in rows if r.get(key) is not None]
    return ratio(sum(r[key] * r["iterations"] for r in have), sum(r["iterations"] for r in have))


def run_metrics(rows: list[dict[str, Any]], source: str = "rows") -> dict[str, Any]:
    """A run's numbers from its rows (None where undefined), with k = Σ draft_iterations:

    total_new_tokens = Σ new_tokens;  total_decode_s = Σ decode_s;
    tokens_per_s = Σ new_tokens / Σ decode_s (token-weighted throughput);
    mean_drafted (#cand) = Σ drafted / k;  mean_accepted (#match) = Σ accepted / k;
    acceptance_rate = Σ accepted / Σ drafted;  block_efficiency τ = Σ new_tokens / Σ target_calls;
    nodes_per_call = Σ drafted / Σ target_calls (the drafted nodes a target call verifies: a tree's width);
    mean_t_v, mean_t_g = Σ mean·iterations / Σ iterations over the rows reporting them;
    score = mean over the scored rows;  engine_overhead = 1 - Σ model_s / Σ decode_s.
    `source` names the rows in warnings (e.g. a rows.jsonl path).
    """
    new, seconds, drafted, accepted = (total(rows, k) for k in ("new_tokens", "decode_s", "drafted", "accepted"))
    k = draft_iterations(rows, source)
    scored = [r["score"] for r in rows if r.get("score") is not None]
    return {
        "total_new_tokens": new,
        "total_decode_s": seconds,
        "tokens_per_s": ratio(new, seconds),
        "mean_drafted": None if k is None else ratio(drafted, k),
        "mean_accepted": None if k is None else ratio(accepted, k),
        "acceptance_rate": ratio(accepted, drafted),
        "block_efficiency": ratio(new, total(rows, "target_calls")),
        "nodes_per_call": ratio(drafted, total(rows, "target_calls")),
        "mean_t_v": iteration_mean(rows, "mean_t_v"),
        "mean_t_g": iteration_mean(rows, "mean_t_g"),
        "score": ratio(sum(scored), len(scored)),
        "engine_overhead": 1 - total(rows, "model_s") / seconds if seconds else None,
    }


def repeat_spread(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Timing noise over repeats: each repeat's tokens_per_s = Σ new_tokens / Σ decode_s over its rows, and
    `repeats` (how many), `tokens_per_s_median` and `tokens_per_s_spread` {min, max} of those."""
    by_repeat: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_repeat.setdefault(r.get("repeat", 0), []).append(r)
    rates = [x for x in (ratio(total(v, "new_tokens"), total(v, "decode_s")) for v in by_repeat.values()) if x is not None]
    return {"repeats": len(by_repeat), "tokens_per_s_median": median(rates) if rates else None,
            "tokens_per_s_spread": {"min": min(rates), "max": max(rates)} if rates else None}


COUNT_FIELDS = {"N": "new_tokens", "C": "target_calls", "I": "iterations", "A": "accepted", "D": "drafted",
                "k": "draft_iterations"}


def counts(rows: list[dict]) -> dict[str, float]:
    """The pooled counts N, C, I, A, D, k of `rows` (a field a row lacks counts 0)."""
    return {c: float(sum(r.get(f) or 0 for r in rows)) for c, f in COUNT_FIELDS.items()}


def accept_length(c: dict[str, float]) -> float | None:
    """(A + I) / I of pooled counts (`counts`): the tokens each verify step yields, its accepted drafts plus the bonus
    token, over every step and with no stop cut: Spec-Bench's #Mean Accepted Tokens, EAGLE's τ, SGLang's accept len."""
    return ratio(c["A"] + c["I"], c["I"])


class PositionCounts(TypedDict):
    """What `positions` reads of merged call_stats (the required keys of specbench.decoding.speedup.CallStats)."""

    iterations: dict[str, int]  # draft length w -> iterations
    reached: list[int]  # per draft position: the iterations that verified it
    accepted: list[int]  # per draft position: the iterations that accepted it


def positions(stats: PositionCounts, alpha: list[float]) -> dict[str, list[float]]:
    """Acceptance per draft position of merged call_stats (specbench.decoding.speedup.merge_stats) and their alpha_i
    (speedup.alphas): with reached_i / acc_i the iterations that verified / accepted position i and K those that
    drafted,

        alpha_i = acc_i / reached_i   P(i accepted | 1..i-1 accepted)     at_least_i = acc_i / K   P(>= i accepted)
        hist_n  = (acc_n - acc_{n+1}) / K, acc_0 = K                       the accepted-length histogram, n = 0..

    {"alpha", "at_least", "hist"}, every verified position listed (zeros included); {} when no iteration drafted."""
    drafting = sum(n for w, n in stats["iterations"].items() if int(w) > 0)
    if not drafting:
        return {}
    acc = [float(a) for a in stats["accepted"]]
    acc += [0.0] * (len(stats["reached"]) - len(acc))  # verified, never accepted: zeros
    upto = [float(drafting), *acc, 0.0]
    return {"alpha": list(alpha), "at_least": [a / drafting for a in acc],
            "hist": [(upto[n] - upto[n + 1]) / drafting for n in range(len(acc) + 1)]}
