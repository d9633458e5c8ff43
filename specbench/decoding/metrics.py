"""The metric vocabulary of design.md section 5: per-example fields and per-run aggregates."""

from __future__ import annotations

from statistics import fmean
from typing import Any

from specbench.decoding.engine import Generation


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


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
        "tokens_per_s": _ratio(new, gen.decode_s),
        "target_calls": gen.target_calls,
        "draft_calls": gen.draft_calls,
        "iterations": len(gen.records),
        "drafted": drafted,
        "accepted": accepted,
        "mean_drafted": _ratio(drafted, len(drafting)),  # #cand: over iterations that drafted
        "mean_accepted": _ratio(accepted, len(drafting)),  # #match
        "acceptance_rate": _ratio(accepted, drafted),
        "block_efficiency": _ratio(new, gen.target_calls),  # tau = new tokens per target call
        "mean_t_v": _mean_state(gen, "t_v"),
        "mean_t_g": _mean_state(gen, "t_g"),
        "model_s": gen.target_model_s + gen.draft_model_s,  # summed forward time of both models
        "stop_reason": gen.stop_reason,
    }


MEAN_FIELDS = ["new_tokens", "decode_s", "prefill_s", "tokens_per_s", "target_calls", "draft_calls", "iterations",
               "drafted", "accepted", "mean_drafted", "mean_accepted", "acceptance_rate", "block_efficiency",
               "mean_t_v", "mean_t_g", "score"]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-run aggregates: `example_means` (plain means over examples) and token-weighted totals."""
    means = {}
    for f in MEAN_FIELDS:
        vals = [r[f] for r in rows if r.get(f) is not None]
        means[f] = fmean(vals) if vals else None
    out: dict[str, Any] = {"n_examples": len(rows), "example_means": means}
    tot = {k: sum(r.get(k) or 0 for r in rows) for k in ("new_tokens", "decode_s", "target_calls", "drafted", "accepted", "model_s")}
    out.update({
        "total_new_tokens": tot["new_tokens"],
        "total_decode_s": tot["decode_s"],
        "tokens_per_s": _ratio(tot["new_tokens"], tot["decode_s"]),  # token-weighted throughput
        "acceptance_rate": _ratio(tot["accepted"], tot["drafted"]),
        "block_efficiency": _ratio(tot["new_tokens"], tot["target_calls"]),
        "engine_overhead": 1 - tot["model_s"] / tot["decode_s"] if tot["decode_s"] else None,
    })
    return out
