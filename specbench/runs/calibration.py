"""The target_1 calibration: the seconds of a target call verifying one token per row, measured once per set of
repeats and batch size and recorded in the folder (specbench.runs.measurements) when a run's rows cannot give it."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from statistics import median
from typing import Any

from specbench.data.dataset import Example
from specbench.runs import measurements
from specbench.runs.binding import build_method, make_engine
from specbench.runs.job import Job, fit_prompt

log = logging.getLogger(__name__)


PASSES = 3  # calibration passes: their median is target_1, their range its spread


def calibrate_target_1(job: Job, examples: list[Example], tokens: int = 32, passes: int = PASSES) -> dict[str, Any]:
    """The fields of a `target_1` record: the seconds of a target call verifying one token per row, `ar` decoding
    `tokens` tokens of `examples` together `passes` times, each pass's median over the iterations every row took
    part in but the first (the prompts'); `seconds` is the median of the passes, `spread` their [min, max], and
    `load_average` the machine's 1-minute load after them. A warm-up on the prompts cut to `tokens` tokens comes
    first (the one-time costs need no long prefill: a warm-up on the whole prompts doubled an 8000-token
    calibration, 15 min more at one CPU thread)."""
    engine = make_engine(job.pair, build_method({"name": "ar"}), job.method.bound.params, (), job.engine.compile)
    prompts = [fit_prompt(job.encode(ex, []), engine.context_length, tokens, job.on_long, f"example {ex.id!r}")[0]
               for ex in examples]
    engine.generate_batch([p[:tokens] for p in prompts], tokens)
    medians = []
    for _ in range(passes):
        gens = engine.generate_batch(prompts, tokens)
        together = min(len(g.records) for g in gens)  # iterations 0..together-1 ran over every row
        seconds = [gens[0].records[i].verify_s for i in range(1, together)] or [gens[0].records[0].verify_s]
        medians.append(median(seconds))  # [records[0]]: EOS at once
    return {"seconds": median(medians), "spread": [min(medians), max(medians)], "passes": passes,
            "load_average": round(os.getloadavg()[0], 2), "rows": len(examples),
            "examples": [ex.id for ex in examples], "tokens": tokens, "calls": len(seconds)}


def recorded_target_1(job: Job, examples: list[Example], run_dir: Path, measure_from: int, batch_size: int
                      ) -> dict[str, Any] | None:
    """The calibrated target_1 record of the set `measure_from` at `batch_size`, read from the folder's
    measurements; measured (calibrate_target_1 on the first batch's examples) and recorded the first time only."""
    record = measurements.target_1(run_dir, measure_from, batch_size)
    if record is None and examples:
        record = measurements.append(run_dir, {"kind": "target_1", "measure_from": measure_from,
                                               "batch_size": batch_size, "device": str(job.engine.device),
                                               "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                               **calibrate_target_1(job, examples[:batch_size])})
        log.info("%s: target_1 calibrated at batch_size %d: %.3g s per call (passes %.3g-%.3g s, load %.2f; "
                 "recorded in %s)", run_dir, batch_size, record["seconds"], *record["spread"],
                 record["load_average"], measurements.MEASUREMENTS)
    return record
