"""The metric vocabulary of design.md section 5: per-example fields and per-run aggregates.

A run's numbers are `specbench.common.aggregate.run_metrics` (pooled over tokens and iterations), the
same function the report and `bench methods` use.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any

from specbench.common.aggregate import ratio, run_metrics
from specbench.decoding.engine import Generation


def _mean_state(gen: Generation, key: str) -> float | None:
    """Mean of a policy-state value (e.g. t_v) over the iterations that report it."""
    vals = [r.state[key] for r in gen.records if key in r.state]
    return fmean(vals) if vals else None


def example_metrics(gen: Generation) -> dict[str, Any]:
    """Per-example metrics; model calls as the engine counted them, by the pair role of the model called."""
    drafted = sum(r.drafted for r in gen.records)
    accepted = sum(r.accepted for r in gen.records)
    drafting = [r for r in gen.records if r.drafted]  # iterations that drafted anything
    new = len(gen.token_ids)
    return {
        "new_tokens": new,
        "decode_s": gen.decode_s,
        "prefill_s": gen.prefill_s,
        "tokens_per_s": ratio(new, gen.decode_s),
        "target_calls": gen.target_calls,
        "draft_calls": gen.draft_calls,
        "iterations": len(gen.records),
        "drafted": drafted,
        "accepted": accepted,
        "draft_iterations": len(drafting),  # k: the divisor of mean_drafted / mean_accepted
        "mean_drafted": ratio(drafted, len(drafting)),  # #cand: over iterations that drafted
        "mean_accepted": ratio(accepted, len(drafting)),  # #match
        "acceptance_rate": ratio(accepted, drafted),
        "block_efficiency": ratio(new, gen.target_calls),  # tau = new tokens per target call
        "mean_t_v": _mean_state(gen, "t_v"),
        "mean_t_g": _mean_state(gen, "t_g"),
        "model_s": gen.target_model_s + gen.draft_model_s,  # summed forward time of both models
        "stop_reason": gen.stop_reason,
    }


MEAN_FIELDS = ["new_tokens", "decode_s", "prefill_s", "tokens_per_s", "target_calls", "draft_calls", "iterations",
               "drafted", "accepted", "mean_drafted", "mean_accepted", "acceptance_rate", "block_efficiency",
               "mean_t_v", "mean_t_g", "score"]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's numbers: n_examples, `example_means` (plain means over examples of MEAN_FIELDS) and
    the run's pooled numbers `run_metrics` (tokens_per_s, mean_drafted, ..., engine_overhead) at the top."""
    means = {}
    for f in MEAN_FIELDS:
        vals = [r[f] for r in rows if r.get(f) is not None]
        means[f] = fmean(vals) if vals else None
    return {"n_examples": len(rows), "example_means": means, **run_metrics(rows)}
