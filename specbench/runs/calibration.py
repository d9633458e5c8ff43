"""The target_1 calibration: the seconds of a target call verifying one token per row, measured once per set of
repeats and batch size and recorded in the folder (specbench.runs.measurements) when a run's rows cannot give it."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from statistics import median
from typing import Any

from specbench.data.dataset import Example
from specbench.runs import measurements
from specbench.runs.binding import build_method, make_engine
from specbench.runs.job import Job, fit_prompt

log = logging.getLogger(__name__)


def calibrate_target_1(job: Job, examples: list[Example], tokens: int = 32) -> dict[str, Any]:
    """The fields of a `target_1` record: the median seconds of a target call verifying one token per row, `ar`
    decoding `tokens` tokens of `examples` together, only the iterations every row took part in but the first (the
    prompts'), after a warm-up on the prompts cut to `tokens` tokens (the one-time costs need no long prefill: a
    warm-up on the whole prompts doubled an 8000-token calibration, 15 min more at one CPU thread)."""
    engine = make_engine(job.pair, build_method({"name": "ar"}), job.method.bound.params, (), job.engine.compile)
    prompts = [fit_prompt(job.encode(ex, []), engine.context_length, tokens, job.on_long, f"example {ex.id!r}")[0]
               for ex in examples]
    engine.generate_batch([p[:tokens] for p in prompts], tokens)
    gens = engine.generate_batch(prompts, tokens)
    together = min(len(g.records) for g in gens)  # iterations 0..together-1 ran over every row
    seconds = [gens[0].records[i].verify_s for i in range(1, together)] or [gens[0].records[0].verify_s]  # EOS at once
    return {"seconds": median(seconds), "rows": len(examples), "examples": [ex.id for ex in examples],
            "tokens": tokens, "calls": len(seconds)}


def recorded_target_1(job: Job, examples: list[Example], run_dir: Path, measure_from: int, batch_size: int
                      ) -> float | None:
    """The calibrated target_1 of the set `measure_from` at `batch_size`, read from the folder's measurements;
    measured (calibrate_target_1 on the first batch's examples) and recorded the first time only."""
    record = measurements.target_1(run_dir, measure_from, batch_size)
    if record is None and examples:
        record = measurements.append(run_dir, {"kind": "target_1", "measure_from": measure_from,
                                               "batch_size": batch_size, "device": str(job.engine.device),
                                               "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                               **calibrate_target_1(job, examples[:batch_size])})
        log.info("%s: target_1 calibrated at batch_size %d: %.3g s per call (recorded in %s)", run_dir, batch_size,
                 record["seconds"], measurements.MEASUREMENTS)
    return None if record is None else record["seconds"]

