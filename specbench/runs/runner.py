"""One run: config -> lock the folder -> seed -> pair -> method -> examples -> warm-up -> decode a batch, score,
append its rows -> summary. Its steps' concerns are modules of their own: the settings and the folder's record
(specbench.runs.validation), the bound method (binding), the decoding job (job), the target_1 calibration
(calibration) and the summary (summary)."""

from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from specbench.runs import provenance
from specbench.runs import wandb_log
from specbench.data.dataset import Evaluator, Example, build_dataset, check_selection, select
from specbench.decoding.compose import check_draft
from specbench.decoding.records import Generation
from specbench.decoding.method import Method
from specbench.decoding.metrics import example_metrics, summarize
from specbench.decoding.sampling import SamplingParams
from specbench.common.configs import plain
from specbench.common.errors import InputError
from specbench.common.options import check_mandatory, check_run_settings, engine_compile, max_new_tokens, stop_strings
from specbench.models.pairs import check_cross_tokenizer, load_pair, resolve_device
from specbench.common.progress import progress_bar, switch_progress
from specbench.common.registry import Registry
from specbench.common.aggregate import repeat_spread
from specbench.runs.binding import build_method, decoder_device, make_engine
from specbench.runs.job import Dialogue, Job, example_seed, finish, next_prompt
from specbench.runs.results import SUMMARY, RowWriter, folder_lock, lock_timeout, measured_rows, read_rows
from specbench.runs.summary import (load_summary, predicted_words, recorded_processes, rounded,
                                    speedup_summary)
from specbench.runs.validation import (check_resume, check_version, choices, code_version, new_measurement, resolved,
                                       sampling_params, set_threads)
from specbench.common.files import write_json_atomic
from specbench.runs.slurm import export_distributed
from specbench.runs.traces import trace_path, write_trace

log = logging.getLogger(__name__)

# What `python run.py task=<name>` runs (conf/task/): `bench` below; specbench.training registers synth and distill
TASKS: Registry = Registry("task", plugins="specbench.training")
MULTI_PROCESS = ("distill",)  # the tasks that run on several processes (the others: one)


def output_dir(out_dir: str | Path | None) -> Path:
    """`out_dir`, else the running Hydra job's output folder."""
    if out_dir is not None:
        return Path(out_dir)
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def restore_carried(method: Method, rows: list[dict], run_dir: Path) -> None:
    """Before resuming: give a method that carries state across examples the state saved with the last row."""
    if method.carried_state() is None or not rows:
        return
    last = rows[-1]  # rows are appended in decode order
    if "carried_state" not in last:
        raise InputError(f"{run_dir}: method {method.name!r} carries state from one example to the next, but the "
                         f"row of {last['id']!r} has no 'carried_state' (an older version wrote it), so resuming "
                         "would not continue as an uninterrupted run. Rerun it in another folder "
                         "(hydra.run.dir=...) or delete this one.")
    state = last["carried_state"]
    if isinstance(state, dict) and isinstance(state.get("outputs"), int):  # the first k observed outputs, by count
        outputs = [list(r["token_ids"]) for r in rows]
        if len(outputs) < state["outputs"]:
            raise InputError(f"{run_dir}: the row of {last['id']!r} names {state['outputs']} earlier outputs of method "
                             f"{method.name!r} but the folder holds {len(outputs)} rows before it; rerun in another "
                             "folder (hydra.run.dir=...)")
        state = {**state, "outputs": outputs[: state["outputs"]]}
    method.restore_state(state)


def start_repeat(method: Method, initial: dict | None, rows: list[dict], repeat: int, run_dir: Path) -> None:
    """Before decoding the rows of `repeat`: the carried state of a method that has one, as an uninterrupted
    pass over the examples would have it (the state before the first example, then that repeat's last row's)."""
    if initial is None:
        return
    method.restore_state(initial)
    restore_carried(method, [r for r in rows if r.get("repeat", 0) == repeat], run_dir)


@dataclass
class Batch:
    """A chunk of one repeat's examples, decoded together: its index among the repeat's chunks and its examples."""

    repeat: int
    index: int
    examples: list[Example]


def batches(examples: list[Example], repeats: range, size: int) -> list[Batch]:
    """Each repeat's examples cut into consecutive chunks of `size` (the last may be shorter), repeat by repeat."""
    return [Batch(k, i, examples[start : start + size])
            for k in repeats for i, start in enumerate(range(0, len(examples), size))]


def decode_batch(job: Job, examples: list[Example], trace: bool) -> list[tuple[Generation, dict[str, Any]]]:
    """Decode `examples` together turn by turn (one Engine.generate_batch per turn over the examples that have
    it), each with its own per-example generator; per example its merged Generation and row fields."""
    dialogues = [Dialogue(ex, torch.Generator(device=decoder_device(job.engine)).manual_seed(
        example_seed(job.seed, ex.id))) for ex in examples]
    for k in range(max((d.n_turns for d in dialogues), default=0)):
        active = [d for d in dialogues if d.n_turns > k]
        prompts = [next_prompt(job, d) for d in active]
        for d, g in zip(active, job.engine.generate_batch(prompts, job.max_new, [d.generator for d in active], trace)):
            d.turns.append(g)
    return [finish(d) for d in dialogues]


def warm_up(job: Job, chunks: list[list[Example]]) -> None:
    """Decode the `chunks` (batches) through the same path without recording them; the method's carried state
    is kept."""
    saved = job.method.carried_state()
    for examples in chunks:
        decode_batch(job, examples, False)
    if saved is not None:
        job.method.restore_state(saved)


def missing(writer: RowWriter, batch: Batch) -> list[Example]:
    """The examples of `batch` whose row the folder lacks (all or none of them, unless rows were edited by hand)."""
    return [ex for ex in batch.examples if not writer.has(ex.id, batch.repeat)]


def untraced(writer: RowWriter, batch: Batch, run_dir: Path) -> dict[str, dict]:
    """The rows of `batch` the folder holds without their trace (a run without trace=true wrote them), by id."""
    ids = {ex.id for ex in batch.examples
           if writer.has(ex.id, batch.repeat) and not trace_path(run_dir, ex.id, batch.repeat).exists()}
    return {r["id"]: r for r in writer.rows if ids and r["id"] in ids and r.get("repeat", 0) == batch.repeat}


def batch_rows(job: Job, batch: Batch, wanted: set[str], c: dict, run_dir: Path, retrace: dict[str, dict]
               ) -> list[dict[str, Any]]:
    """Decode `batch` whole; the rows of its examples whose id is `wanted` (their traces written first with
    trace=true), and the traces of the rows in `retrace` (in the folder without one; the rows are kept)."""
    rows = []
    for ex, (g, info) in zip(batch.examples, decode_batch(job, batch.examples, job.trace)):
        if ex.id in retrace or (job.trace and ex.id in wanted):
            write_trace(run_dir, ex.id, g.records, batch.repeat)
        kept = list(retrace.get(ex.id, {}).get("token_ids") or [])
        if ex.id in retrace and kept != list(g.token_ids):
            log.warning("%s: example %r (repeat %d) decoded again for its trace gave other tokens than its row "
                        "(%d new tokens, the row %d): the trace is not of the row's decode", run_dir, ex.id,
                        batch.repeat, len(g.token_ids), len(kept))
        if ex.id not in wanted:
            continue
        job.method.observe_output(g.token_ids)  # before make_row takes the carried state after this example
        rows.append({**make_row(job, ex, g, info, c), "repeat": batch.repeat, "batch": batch.index,
                     "batch_size": len(batch.examples)})
    return rows


def make_row(job: Job, ex: Example, g: Generation, info: dict[str, Any], c: dict) -> dict[str, Any]:
    """The result row of one example: ids, output, metrics (docs/design.md section 5), scores and, for a method
    that carries state across examples, that state after this example (`carried_state`)."""
    carried = job.method.carried_state()
    return {"id": ex.id, "method": job.method.name, "pair": c["pair"]["name"], "dataset": job.evaluator.name,
            **info, "output": g.text, "token_ids": g.token_ids, "lossless": job.method.plan.lossless, "seed": job.seed,
            **example_metrics(g), **job.evaluator.score(ex, g.text),
            "truncated": job.evaluator.truncated(ex, g.text, g.stop_reasons),
            "load_average": round(os.getloadavg()[0], 2),  # the machine's 1-minute load when the row was written
            **({"carried_state": carried} if carried is not None else {})}


def run(cfg: DictConfig, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Run one job of the config (its `task`) holding its output folder's lock (a busy folder: results.folder_lock
    with `wait_for_lock`); returns the summary. A mandatory value left unset (???) fails first, naming its key."""
    check_mandatory({k: v for k, v in plain(cfg, resolve=False).items() if k != "hydra"})
    task = cfg.task.name if "task" in cfg else "bench"
    fn, timeout = TASKS.get(task), lock_timeout(cfg.get("wait_for_lock", False))
    run_dir = output_dir(out_dir)
    if export_distributed() > 1 and task not in MULTI_PROCESS:
        raise InputError(f"task={task} runs on one process, not {os.environ['WORLD_SIZE']} (torchrun, accelerate launch "
                         f"or SLURM tasks); only {', '.join(MULTI_PROCESS)} trains on several")
    main = int(os.environ.get("RANK", "0")) == 0  # the other processes of a torchrun share the main one's folder
    with folder_lock(run_dir, timeout) if main else nullcontext():
        return fn(cfg, run_dir)


@dataclass
class Settings:
    """A run's settings, every one checked before any model loads."""

    params: SamplingParams
    max_new: int
    seed: int
    batch_size: int
    compile: bool
    method: Method
    evaluator: Evaluator
    examples: list[Example]


def checked(c: dict[str, Any]) -> Settings:
    """The resolved config's settings, the cheap checks first; a bad value fails naming its key."""
    check_run_settings(c)
    check_selection(c.get("limit"), c.get("shard"))
    params = sampling_params(c["decode"])
    method = build_method(c["method"])
    batch_size = int(c.get("batch_size", 1))  # an integer >= 1: check_run_settings checked it
    compile_ = engine_compile(c)
    method.plan.refuse(method.name, batch_size, compile_, params)
    check_cross_tokenizer(c["pair"], method.name, "draft" in method.plan.roles, method.plan.cross_tokenizer)
    check_draft(c["pair"], method)
    evaluator = build_dataset(c["dataset"])
    stop_strings(list(evaluator.stop_strings), "dataset.stop_strings")  # the top-level key's: check_run_settings
    examples = select(evaluator.examples(), c.get("limit"), c.get("shard"), evaluator.stratum)
    return Settings(params, max_new_tokens(c["decode"], c["dataset"]), int(c["decode"]["seed"]), batch_size, compile_,
                    method, evaluator, examples)


@dataclass
class Plan:
    """The batches a run still decodes (with trace=true also those whose rows lack their trace), by repeat."""

    todo: list[Batch]
    retrace: dict[tuple[int, int], dict[str, dict]]
    wanted: int  # rows the run's examples and repeats make
    to_decode: int  # rows not in the folder yet
    repeats: range


def plan(job: Job, writer: RowWriter, examples: list[Example], repeats: range, batch_size: int, run_dir: Path) -> Plan:
    """What is left to decode of `repeats` over `examples`, logged (a resume reuses the folder's rows)."""
    all_batches = batches(examples, repeats, batch_size)
    retrace = {(b.repeat, b.index): untraced(writer, b, run_dir) for b in all_batches} if job.trace else {}
    todo = [b for b in all_batches if missing(writer, b) or retrace.get((b.repeat, b.index))]
    p = Plan(todo, retrace, len(examples) * len(repeats), sum(len(missing(writer, b)) for b in todo), repeats)
    retraced = sum(len(r) for r in retrace.values())
    if retraced:
        log.warning("%s: trace=true: %d rows in the folder have no trace (a run without trace=true wrote them); "
                    "decoding their examples again for their traces (their rows are kept)", run_dir, retraced)
    log.info("%s: %d examples, %d already done, %d to decode%s%s", run_dir, p.wanted, p.wanted - p.to_decode,
             p.to_decode, f" ({len(examples)} examples x {len(repeats)} repeats)" if len(repeats) > 1 else "",
             f" in {len(todo)} batches of up to {batch_size}" if batch_size > 1 else "")
    if p.wanted > p.to_decode:
        log.warning("%s: reusing %d rows already in the folder (resume); to measure again, rerun with "
                    "remeasure=true (a new set of repeats; nothing is deleted)", run_dir, p.wanted - p.to_decode)
    return p


def selected_rows(rows: list[dict], examples: list[Example], repeats: range, run_dir: Path
                  ) -> tuple[list[dict], dict[str, list[str]]]:
    """The rows of the run's selection (its examples' ids, its repeats; as recorded: a resume reads the same rows
    back) and, when the folder holds more (an earlier run without limit=, say), `selected_ids` for the summary."""
    ids = {ex.id for ex in examples}
    kept = [r for r in rows if r["id"] in ids and r.get("repeat", 0) in repeats]
    if len(kept) == len(rows):
        return rows, {}
    log.warning("%s: the folder holds %d rows; this run's settings (limit=, shard=, repeats=) select %d of them: the "
                "summary covers those (the report compares runs on the example ids they share)", run_dir, len(rows),
                len(kept))
    return kept, {"selected_ids": [ex.id for ex in examples]}


def decode(job: Job, p: Plan, writer: RowWriter, s: Settings, c: dict[str, Any], run_dir: Path) -> None:
    """The warm-up, then each batch of the plan decoded and its rows appended in one write (a crash leaves whole
    batches), a method's carried state restored before a batch that does not follow the one decoded last."""
    initial = s.method.carried_state()
    warm_up(job, [b.examples for b in p.todo if b.repeat == p.todo[0].repeat][: int(c.get("warmup", 0))])
    previous = None
    with progress_bar(None, c.get("progress", "auto"), total=p.to_decode, desc=s.method.name, unit="ex") as bar:
        for b in p.todo:
            if (b.repeat, b.index - 1) != previous:  # a new repeat, or after batches not decoded: the state before b
                before = {ex.id for ex in s.examples[: b.index * s.batch_size]}
                start_repeat(s.method, initial, [r for r in writer.rows if r["id"] in before], b.repeat, run_dir)
            previous = (b.repeat, b.index)
            new = batch_rows(job, b, {ex.id for ex in missing(writer, b)}, c, run_dir,
                             p.retrace.get((b.repeat, b.index), {}))
            writer.append_many(new)
            bar.update(len(new))


@TASKS.register("bench")
def bench(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The benchmark run of one config into run_dir (whose lock the caller holds); returns the summary
    (also written to run_dir/summary.json)."""
    switch_progress(cfg.get("progress", "auto"))
    c = resolved(cfg)
    s = checked(c)  # everything cheap, before loading models
    device = resolve_device(c.get("device", "auto"))
    threads = set_threads(c.get("threads", "auto"))
    torch.manual_seed(s.seed)
    pair = load_pair(c["pair"], device)
    stops = tuple(s.evaluator.stop_strings) + tuple(c.get("stop_strings") or ())
    decoder = make_engine(pair, s.method, s.params, stops, s.compile)
    job = Job(decoder, decoder.method, pair, s.evaluator, c["dataset"],
              s.max_new, s.seed, c.get("on_long_prompt", "error"), bool(c.get("trace", False)))
    job.check_prompts(s.examples)
    # everything is validated: only now write to the output folder (folder_lock removes it again if left empty)
    record = {"config": c, "choices": choices(cfg), "seed": s.seed, **provenance.code_record(job.method),
              "versions": provenance.package_versions(), "device_info": provenance.device_info(device),
              "runtime": provenance.runtime(job.method.bound.models, threads, pair, job.method.plan.layers)}
    any_version = bool(c.get("resume_any_version", False))  # a boolean: check_run_settings checked it
    saved = check_resume(run_dir, record)
    writer = RowWriter(run_dir)
    if c.get("remeasure", False):  # the version check first: a refused run leaves config.json as it was
        saved = new_measurement(run_dir, check_version(run_dir, saved, record, any_version), writer.rows)
    first = saved.get("measure_from", 0)
    p = plan(job, writer, s.examples, range(first, first + int(c.get("repeats", 1))), s.batch_size, run_dir)
    if p.todo:
        saved = check_version(run_dir, saved, record, any_version)
    decode(job, p, writer, s, c, run_dir)
    rows, selection = selected_rows(measured_rows(read_rows(writer.path), saved), s.examples, p.repeats, run_dir)
    process = recorded_processes(run_dir, first, p.to_decode, device)  # before a calibration adds to the peak
    summary = {**summarize(rows), **repeat_spread(rows), "decoded": p.to_decode, "resumed": len(rows) - p.to_decode,
               "measure_from": first, "batch_size": s.batch_size,
               **speedup_summary(job, rows, s.examples, run_dir, first, s.batch_size),
               "method": s.method.name, "pair": c["pair"]["name"], "dataset": s.evaluator.name,
               "lossless": s.method.plan.lossless, **load_summary(rows), **process, **record,
               **code_version(saved), **{k: saved[k] for k in ("resumed_versions",) if k in saved}, **selection}
    write_json_atomic(run_dir / SUMMARY, summary)
    wandb_log.log_run(c.get("logger"), run_dir, summary, rows)  # best effort: never raises
    log.info("%s: %d rows (%d decoded, %d resumed), %.1f tok/s, acceptance %s, score %s, predicted speedup %s",
             run_dir, summary["n_examples"], summary["decoded"], summary["resumed"], summary["tokens_per_s"] or 0,
             rounded(summary["acceptance_rate"]), rounded(summary["score"]), predicted_words(summary))
    return summary
