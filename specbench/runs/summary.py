"""A run's summary beyond its pooled metrics: the predicted speedup and its call costs, acceptance by depth and
category, the processes' peak memory, all from what the folder recorded (the same rows give the same summary on
every resume)."""

from __future__ import annotations

import statistics

import time
from pathlib import Path
from typing import Any

import torch

from specbench.common.aggregate import positions
from specbench.data.dataset import Example
from specbench.decoding import speedup
from specbench.runs import measurements, provenance
from specbench.runs.calibration import recorded_target_1
from specbench.runs.job import Job


def speedup_summary(job: Job, rows: list[dict], examples: list[Example], run_dir: Path, measure_from: int,
                    batch_size: int) -> dict[str, Any]:
    """`call_costs` and `predicted_speedup` of a drafting run from its rows' call_stats (null for ar and
    draft_only, or rows without call_stats) and, for a target_1 the rows cannot give, the folder's calibration. At
    batch_size > 1 c_target / c_draft are the costs of a call over the batch, and target_1 is a calibrated call over
    a batch of that size (speedup.call_costs)."""
    stats = speedup.merge_stats(speedup.from_row(r) for r in rows)
    if job.method.plan.kind == "none" or not stats["iterations"]:
        return {"call_costs": None, "predicted_speedup": None, "predicted_speedup_spread": None,
                "acceptance_by_depth": None, "reach_by_depth": None,
                "accepted_length_hist": None, "positions_by_category": None}
    costs, spread = speedup.call_costs(stats, None, batch_size), None
    if costs["target_1"] is None:
        record = recorded_target_1(job, examples, run_dir, measure_from, batch_size)
        costs = speedup.call_costs(stats, None if record is None else record["seconds"], batch_size)
        spread = None if record is None else record.get("spread")  # None: a record of an older version
    predicted = speedup.predicted_speedup(stats, costs)
    at = positions(stats, speedup.alphas(stats))
    return {"call_costs": costs, "predicted_speedup": predicted,
            # the prediction at the calibration passes' fastest and slowest target_1 (it is linear in target_1)
            "predicted_speedup_spread": None if predicted is None or not spread else
            [speedup.predicted_speedup(stats, {**costs, "target_1": t}) for t in spread],
            "acceptance_by_depth": at.get("alpha"),  # alpha_i: P(depth i accepted | depth i - 1 accepted)
            "reach_by_depth": at.get("at_least"), "accepted_length_hist": at.get("hist"),  # P(>= i), h(n)
            "positions_by_category": category_positions(rows)}


def category_positions(rows: list[dict]) -> dict[str, dict[str, list[float]]] | None:
    """{category: aggregate.positions of its rows} for rows with a `category` (Spec-Bench, SPEED-Bench), else None."""
    cats = sorted({str(r["category"]) for r in rows if r.get("category") is not None})
    out = {}
    for cat in cats:
        stats = speedup.merge_stats(speedup.from_row(r) for r in rows if str(r.get("category")) == cat)
        if stats["iterations"]:
            out[cat] = positions(stats, speedup.alphas(stats))
    return out or None


def recorded_processes(run_dir: Path, measure_from: int, decoded: int, device: torch.device) -> dict[str, Any]:
    """The summary's peak memory and `finished` from the set's `process` records (specbench.runs.measurements),
    this process's appended first when it decoded rows or the set has none yet (a folder of an older version)."""
    if decoded or not measurements.processes(run_dir, measure_from):
        measurements.append(run_dir, {"kind": "process", "measure_from": measure_from, "decoded": decoded,
                                      **provenance.peak_memory(device),
                                      "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return measurements.peak_and_finished(measurements.processes(run_dir, measure_from))


def rounded(x: float | None, digits: int = 3) -> float | None:
    """x rounded for the log line (None stays None)."""
    return None if x is None else round(x, digits)


def predicted_words(summary: dict[str, Any]) -> str:
    """The predicted speedup for the log: with the range its target_1 calibration passes give, and whose call costs
    it comes from (a model of the run's costs, not a measurement: on a shared CPU the two differ by the load)."""
    value, spread = summary.get("predicted_speedup"), summary.get("predicted_speedup_spread")
    if value is None:
        return "none (no drafts, or no call costs)"
    costs = summary.get("call_costs") or {}
    where = "the calibration" if costs.get("target_1_from") == "calibration" else "the rows' own one-token verifies"
    band = f", {spread[0]:.2f}-{spread[1]:.2f} over the calibration passes" if spread else ""
    return f"{value:.2f} (from call costs, target_1 from {where}{band}; not a measurement)"


def load_summary(rows: list[dict]) -> dict[str, float | None]:
    """The machine's 1-minute load average while the rows were written (each row's `load_average`): median and
    maximum, None for rows older than the field. A speedup between runs at different loads is not a clean one."""
    loads = [r["load_average"] for r in rows if r.get("load_average") is not None]
    return {"load_average_median": statistics.median(loads) if loads else None,
            "load_average_max": max(loads) if loads else None}
