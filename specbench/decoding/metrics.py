"""The metric vocabulary of docs/design.md section 5: per-example fields and per-run aggregates.

A run's numbers are `specbench.common.aggregate.run_metrics` (pooled over tokens and iterations), the
same function the report and `bench methods` use, plus the exact / relaxed split of the acceptance
and the count of truncated rows (`summarize`).
"""

from __future__ import annotations

import logging
from statistics import fmean
from typing import Any

from specbench.common.aggregate import TRUNCATED_WARN_FRAC, ratio, run_metrics, total
from specbench.decoding.records import Generation

log = logging.getLogger(__name__)


def _mean_state(gen: Generation, key: str) -> float | None:
    """Mean of a policy-state value (e.g. t_v) over the iterations that report it."""
    vals = [r.state[key] for r in gen.records if key in r.state]
    return fmean(vals) if vals else None


def example_metrics(gen: Generation) -> dict[str, Any]:
    """Per-example metrics; model calls as the engine counted them, by the pair role of the model called."""
    drafted = sum(r.drafted for r in gen.records)
    accepted = sum(r.accepted for r in gen.records)
    relaxed = sum(r.accepted_relaxed for r in gen.records)
    drafting = [r for r in gen.records if r.drafted]  # iterations that drafted anything
    new = len(gen.token_ids)
    return {
        "new_tokens": new,
        "decode_s": gen.decode_s,
        "latency_s": gen.latency_s,
        "first_block_s": gen.first_block_s,
        "tokens_per_s": ratio(new, gen.decode_s),
        "target_calls": gen.target_calls,
        "draft_calls": gen.draft_calls,
        "iterations": len(gen.records),
        "drafted": drafted,
        "accepted": accepted,
        "accepted_exact": accepted - relaxed,  # the exact rule accepted them (match / rejection test passed)
        "accepted_relaxed": relaxed,  # only the relaxation (AdaSD's d_JS <= T_V) accepted them
        "draft_iterations": len(drafting),  # k: the divisor of mean_drafted / mean_accepted
        "mean_drafted": ratio(drafted, len(drafting)),  # #cand: over iterations that drafted
        "mean_accepted": ratio(accepted, len(drafting)),  # #match
        "acceptance_rate": ratio(accepted, drafted),  # a tree's: accepted path nodes / nodes verified
        "block_efficiency": ratio(new, gen.target_calls),  # tau = new tokens per target call
        "nodes_per_call": ratio(drafted, gen.target_calls),  # drafted nodes verified per target call
        "mean_t_v": _mean_state(gen, "t_v"),
        "mean_t_g": _mean_state(gen, "t_g"),
        "model_s": gen.target_model_s + gen.draft_model_s,  # summed forward time of both models
        "stop_reason": gen.stop_reason,
        # per token: the target's top-2 logit margin where it was chosen (4 decimals), and the positions whose token
        # is not the target's top-1 there (specbench.decoding.margins; the report's divergence classes)
        "top2_margins": [round(m, 4) for m in gen.margins],
        "off_top1": gen.off_top1,
    }


MEAN_FIELDS = ["new_tokens", "decode_s", "first_block_s", "tokens_per_s", "target_calls", "draft_calls", "iterations",
               "drafted", "accepted", "mean_drafted", "mean_accepted", "acceptance_rate", "block_efficiency",
               "mean_t_v", "mean_t_g", "score"]


def acceptance_split(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Pooled acceptance by cause: acceptance_exact = Σ accepted_exact / Σ drafted, acceptance_relaxed =
    Σ accepted_relaxed / Σ drafted (they sum to acceptance_rate)."""
    drafted = total(rows, "drafted")
    return {"acceptance_exact": ratio(total(rows, "accepted_exact"), drafted),
            "acceptance_relaxed": ratio(total(rows, "accepted_relaxed"), drafted)}


def truncation(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """n_truncated = #rows flagged `truncated`, truncated_frac = n_truncated / #rows; a warning above
    TRUNCATED_WARN_FRAC."""
    n = sum(bool(r.get("truncated")) for r in rows)
    frac = ratio(n, len(rows))
    if frac is not None and frac > TRUNCATED_WARN_FRAC:
        log.warning("%d of %d rows (%.0f%%) stopped at max_new_tokens before the answer was complete: their "
                    "scores are cut short; raise dataset.max_new_tokens (or decode.max_new_tokens)", n, len(rows),
                    100 * frac)
    return {"n_truncated": n, "truncated_frac": frac}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's numbers: n_examples, `example_means` (plain means over examples of MEAN_FIELDS), the
    run's pooled numbers `run_metrics` (tokens_per_s, mean_drafted, ..., engine_overhead) at the top, the
    acceptance split (acceptance_split) and the truncated rows (truncation)."""
    means = {}
    for f in MEAN_FIELDS:
        vals = [r[f] for r in rows if r.get(f) is not None]
        means[f] = fmean(vals) if vals else None
    return {"n_examples": len(rows), "example_means": means, **run_metrics(rows), **acceptance_split(rows),
            **truncation(rows)}
