"""One run: config -> lock the folder -> seed -> pair -> method -> examples -> warm-up -> decode a batch, score,
append its rows -> summary."""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from statistics import median
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.runs import measurements, provenance
from specbench.runs import wandb_log
from specbench.data.dataset import Evaluator, Example, build_dataset, check_selection, select
from specbench.decoding.decoders import Decoder, make_decoder
from specbench.decoding.records import Generation, concat_generations
from specbench.decoding.method import Binding, Method
from specbench.decoding.metrics import example_metrics, summarize
from specbench.decoding import speedup
from specbench.common.errors import InputError, UserError
from specbench.common.options import (check_mandatory, check_run_settings, engine_compile, integer,
                                      max_new_tokens, real, stop_strings, threads_setting)
from specbench.models.pairs import Pair, check_cross_tokenizer, load_pair, resolve_device
from specbench.common.progress import progress_bar, switch_progress
from specbench.data.prompting import encode
from specbench.common.registry import Registry
from specbench.common.aggregate import positions, repeat_spread
from specbench.runs.results import (CONFIG, SUMMARY, RowWriter, folder_lock, lock_timeout, measured_rows,
                                     read_rows)
from specbench.runs.identity import identity, with_defaults
from specbench.common.configs import differences
from specbench.common.files import write_json_atomic
from specbench.decoding.sampling import SamplingParams
from specbench.runs.traces import trace_path, write_trace

log = logging.getLogger(__name__)

# What `python run.py task=<name>` runs (conf/task/): `bench` is `run` below; specbench.training.synth and
# specbench.training.distill register `synth` and `distill`.
TASKS: Registry = Registry("task", plugins="specbench.training")


def output_dir(out_dir: str | Path | None) -> Path:
    """`out_dir`, else the running Hydra job's output folder."""
    if out_dir is not None:
        return Path(out_dir)
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


from specbench.decoding.compose import check_draft  # noqa: E402


def build_method(cfg: dict) -> Method:
    """The method cfg describes, composed from the parts it names (specbench.decoding.compose), each option first
    checked against the type hints of its part's constructor (`method.gamma=true` is not γ=1)."""
    from specbench.decoding.compose import build

    return build(cfg)


def sampling_params(decode: dict) -> SamplingParams:
    """Validated decode settings: each value's type and range, the error naming its `decode.` key."""
    integer(decode["max_new_tokens"], "decode.max_new_tokens", low=1, null=True)  # null: the dataset's
    if "seed" in decode:
        integer(decode["seed"], "decode.seed", low=0, high=2**63 - 1)  # torch seeds are 64-bit
    return SamplingParams(real(decode["temperature"], "decode.temperature", low=0),
                          integer(decode.get("top_k"), "decode.top_k", low=0, null=True),
                          real(decode.get("top_p"), "decode.top_p", low=0, high=1, low_open=True, null=True))


def example_seed(seed: int, example_id: str) -> int:
    """Per-example RNG seed: the same for an example whether or not the run was resumed."""
    return zlib.crc32(f"{seed}:{example_id}".encode())


def free_cpus() -> int:
    """The CPUs not already busy: round(CPUs this process may run on - 1-minute load average), at least 1.

    Intra-op threads beyond the idle cores spin against other processes: on a 2-core machine with
    one busy core, vanilla on the toy pair ran 7x slower with 2 threads than with 1 (docs/results.md).
    """
    return max(1, round(len(os.sched_getaffinity(0)) - os.getloadavg()[0]))


def set_threads(value: int | str | None) -> int:
    """Set torch's CPU threads from the top-level key `threads` (N, auto = free_cpus(), or null = torch's
    default); returns the number that runs."""
    value = threads_setting(value)
    if value is not None:
        torch.set_num_threads(free_cpus() if value == "auto" else value)
    return torch.get_num_threads()


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain values with interpolations resolved, without the hydra node (which only resolves
    inside a Hydra app): what config.json records."""
    return {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in cfg.items() if k != "hydra"}


def check_resume(run_dir: Path, record: dict) -> dict:
    """Refuse to append to a folder whose rows came from a different configuration; returns the folder's
    record (config.json, written from `record` for a new folder)."""
    path = run_dir / CONFIG
    if path.exists():
        old = json.loads(path.read_text())
        saved, now = identity(old["config"]), identity(record["config"])  # no resumable keys
        if saved != now:
            raise InputError(
                f"{run_dir} holds results of a different configuration (saved vs now: "
                f"{'; '.join(differences(with_defaults(saved), with_defaults(now)))}); refusing to mix them. Use another output folder "
                f"(hydra.run.dir=...) or delete it. Saved: {path}"
            )
        return old
    write_json_atomic(path, record)
    return record


def code_version(record: dict) -> dict[str, Any]:
    """The code version a record names: git hash and whether the checkout had uncommitted changes."""
    return {"git_hash": record.get("git_hash"), "git_dirty": record.get("git_dirty")}


def describe_version(version: dict[str, Any]) -> str:
    """A code version in words, e.g. 'git 1a2b... with uncommitted changes'."""
    if not version.get("git_hash"):
        return "an unknown version (not run from a git checkout)"
    return f"git {version['git_hash']}" + (" with uncommitted changes" if version.get("git_dirty") else "")


def check_version(run_dir: Path, saved: dict, record: dict, allow: bool) -> dict:
    """Refuse to add rows of another code version to a folder unless `allow` (resume_any_version=true).

    Versions are compared as recorded (git hash and dirty flag): uncommitted changes themselves cannot
    be compared. An allowed mix appends the new version to config.json's `resumed_versions`; returns
    the folder's record.
    """
    new = code_version(record)
    known = [code_version(saved), *saved.get("resumed_versions", [])]
    if new in known:
        return saved
    if not allow:
        raise InputError(f"{run_dir} holds rows of {describe_version(known[0])}, but this is "
                         f"{describe_version(new)}; refusing to mix rows of different code versions. Rerun with "
                         "resume_any_version=true to add rows anyway (recorded in config.json), or use another "
                         "folder (hydra.run.dir=...)")
    log.warning("%s: adding rows of %s to rows of %s (resume_any_version=true)", run_dir, describe_version(new),
                describe_version(known[0]))
    saved = {**saved, "resumed_versions": [*saved.get("resumed_versions", []), new]}
    write_json_atomic(run_dir / CONFIG, saved)
    return saved


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


def pair_binding(pair: Pair, method: Method, params: SamplingParams) -> Binding:
    """The pair as `method` runs on it: the models of its roles, the tokenizer and vocabulary range, the EOS ids
    and context over those models, and the decode settings."""
    models = {role: pair.model(role) for role in method.roles}
    used = list(models.values())
    same = [m for role, m in models.items() if pair.same_tokenizer(role)]  # EOS ids are ids of the target's tokenizer
    return Binding(models, pair.tokenizer, pair.vocab_size, frozenset(pair.eos_ids(same)), params,
                   pair.context_length(used), pair)


def make_engine(pair: Pair, method: Method, params: SamplingParams, stop_strings: tuple[str, ...],
                compile: bool = False) -> Decoder:
    """Bind `method` to `pair` (Method.bind, once per engine) and build the engine that runs it (compiled: the
    static-cache, torch.compile path)."""
    method.bind(pair_binding(pair, method, params))
    return make_decoder(method, stop_strings, compile)


class PromptTooLong(UserError, ValueError):
    """A prompt does not fit the model context and on_long_prompt=error; the message names the example."""


def fit_prompt(ids: list[int], context: int | None, max_new: int, on_long: str, where: str
               ) -> tuple[list[int], int | None]:
    """The prompt ids [P] if they fit the context; else an error, or its last tokens when truncating."""
    if context is None or len(ids) < context:
        return ids, None
    if on_long == "error":
        raise PromptTooLong(f"{where}: the prompt has {len(ids)} tokens but the model context is {context} (the "
                            "models' max_position_embeddings) and on_long_prompt=error; set on_long_prompt=truncate "
                            "to keep its last tokens, or select other examples (limit, shard)")
    keep = max(1, context - max_new) if context > max_new else context // 2
    return ids[-keep:], len(ids)


@dataclass
class Job:
    """Everything needed to decode and score the examples of one run."""

    engine: Decoder
    method: Method
    pair: Pair
    evaluator: Evaluator
    dataset_cfg: dict
    max_new: int
    seed: int
    on_long: str
    trace: bool

    def encode(self, ex: Example, answers: list[str]) -> list[int]:
        """Prompt ids for the next turn: the example's prompt, or its turns interleaved with the answers so far."""
        if ex.turns:
            msgs = []
            for turn, ans in zip(ex.turns, answers + [None]):
                msgs.append({"role": "user", "content": turn})
                if ans is not None:
                    msgs.append({"role": "assistant", "content": ans})
            ex = Example(id=ex.id, prompt=msgs)
        return encode(self.pair.tokenizer, ex, self.dataset_cfg.get("system_prompt"),
                      self.dataset_cfg.get("chat_template", "auto"))

    def check_prompts(self, examples: list[Example]) -> None:
        """Fail before any decoding if a first-turn prompt does not fit and on_long_prompt=error."""
        for ex in examples:
            fit_prompt(self.encode(ex, []), self.engine.context_length, self.max_new, self.on_long,
                       f"example {ex.id!r} of dataset {self.evaluator.name!r}")


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


@dataclass
class Dialogue:
    """One example of a batch being decoded: its own generator and the Generation of each turn done so far."""

    example: Example
    generator: torch.Generator
    turns: list[Generation] = field(default_factory=list)
    prompt_tokens: int = 0  # summed over its turns' prompts
    truncated_from: int | None = None  # the first truncated prompt's length (on_long_prompt=truncate)

    @property
    def n_turns(self) -> int:
        """How many turns the example has (1 for a single prompt)."""
        return len(self.example.turns) if self.example.turns else 1


def next_prompt(job: Job, d: Dialogue) -> list[int]:
    """The prompt ids [P] of d's next turn (the earlier turns and their answers included), fitted to the context."""
    ids, cut = fit_prompt(job.encode(d.example, [g.text for g in d.turns]), job.engine.context_length, job.max_new,
                          job.on_long, f"example {d.example.id!r} turn {len(d.turns) + 1}")
    d.prompt_tokens += len(ids)
    d.truncated_from = d.truncated_from or cut
    return ids


def finish(d: Dialogue) -> tuple[Generation, dict[str, Any]]:
    """d's turns merged into one Generation, and its row fields: prompt tokens, call stats (each turn's first
    iteration includes its prompt: speedup.call_stats leaves it out)."""
    answers = [g.text for g in d.turns]
    info = {"prompt_tokens": d.prompt_tokens, "prompt_truncated_from": d.truncated_from,
            **speedup.row_fields(speedup.merge_stats(speedup.call_stats(g.records) for g in d.turns))}
    if d.example.turns:
        return concat_generations(d.turns, answers[-1]), {**info, "turn_outputs": answers}
    return d.turns[0], info


def decode_batch(job: Job, examples: list[Example], trace: bool) -> list[tuple[Generation, dict[str, Any]]]:
    """Decode `examples` together turn by turn (one Engine.generate_batch per turn over the examples that have
    it), each with its own per-example generator; per example its merged Generation and row fields."""
    dialogues = [Dialogue(ex, torch.Generator(device=job.engine.device).manual_seed(example_seed(job.seed, ex.id)))
                 for ex in examples]
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


def new_measurement(run_dir: Path, saved: dict, rows: list[dict]) -> dict:
    """remeasure=true: start a new set of repeats after every row in the folder (nothing is deleted);
    config.json's `measure_from` names its first repeat index. Returns the folder's record."""
    first = 1 + max((r.get("repeat", 0) for r in rows), default=-1)
    log.info("%s: remeasure=true: a new set of repeats from index %d (the %d rows before it stay)", run_dir, first,
             len(rows))
    saved = {**saved, "measure_from": first}
    write_json_atomic(run_dir / CONFIG, saved)
    return saved


def start_repeat(method: Method, initial: dict | None, rows: list[dict], repeat: int, run_dir: Path) -> None:
    """Before decoding the rows of `repeat`: the carried state of a method that has one, as an uninterrupted
    pass over the examples would have it (the state before the first example, then that repeat's last row's)."""
    if initial is None:
        return
    method.restore_state(initial)
    restore_carried(method, [r for r in rows if r.get("repeat", 0) == repeat], run_dir)


def calibrate_target_1(job: Job, examples: list[Example], tokens: int = 32) -> dict[str, Any]:
    """Median seconds of a target call verifying one token per row: `ar` decoding `tokens` tokens of `examples`
    together (a batch of the run's size) after a warm-up on the prompts cut to their first `tokens` tokens (the
    one-time costs need no long prefill: a warm-up on the whole prompts doubled an 8000-token calibration, 15 min
    more at one CPU thread); only the iterations every row took part in, each generation's first (the prompts')
    left out. Returns the fields of a `target_1` record (specbench.runs.measurements)."""
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


def speedup_summary(job: Job, rows: list[dict], examples: list[Example], run_dir: Path, measure_from: int,
                    batch_size: int) -> dict[str, Any]:
    """`call_costs` and `predicted_speedup` of a drafting run from its rows' call_stats (null for ar and
    draft_only, or rows without call_stats) and, for a target_1 the rows cannot give, the folder's calibration.

    At batch_size > 1 the rows' call times are those of batched calls, so c_target / c_draft are the costs of a
    call over the batch, and target_1 is a calibrated call over a batch of that size (speedup.call_costs).
    Everything comes from what the folder recorded: the same rows give the same numbers on every resume.
    """
    stats = speedup.merge_stats(speedup.from_row(r) for r in rows)
    if not job.method.uses_draft or not stats["iterations"]:
        return {"call_costs": None, "predicted_speedup": None, "acceptance_by_depth": None, "reach_by_depth": None,
                "accepted_length_hist": None, "positions_by_category": None}
    costs = speedup.call_costs(stats, None, batch_size)
    if costs["target_1"] is None:
        costs = speedup.call_costs(stats, recorded_target_1(job, examples, run_dir, measure_from, batch_size),
                                   batch_size)
    at = positions(stats, speedup.alphas(stats))
    return {"call_costs": costs, "predicted_speedup": speedup.predicted_speedup(stats, costs),
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


def missing(writer: RowWriter, batch: Batch) -> list[Example]:
    """The examples of `batch` whose row the folder lacks (all or none of them, unless rows were edited by hand)."""
    return [ex for ex in batch.examples if not writer.has(ex.id, batch.repeat)]


def untraced(writer: RowWriter, batch: Batch, run_dir: Path) -> dict[str, dict]:
    """The rows of `batch` the folder holds without their trace (a run without trace=true wrote them), by id."""
    ids = {ex.id for ex in batch.examples
           if writer.has(ex.id, batch.repeat) and not trace_path(run_dir, ex.id, batch.repeat).exists()}
    return {r["id"]: r for r in writer.rows if ids and r["id"] in ids and r.get("repeat", 0) == batch.repeat}


def batch_rows(job: Job, batch: Batch, wanted: set[str], c: dict, run_dir: Path,
               retrace: dict[str, dict] | None = None) -> list[dict[str, Any]]:
    """Decode `batch` whole; the rows of its examples whose id is `wanted` (their traces written first with
    trace=true), and the traces of the rows in `retrace` (in the folder without one; the rows are kept)."""
    rows = []
    for ex, (g, info) in zip(batch.examples, decode_batch(job, batch.examples, job.trace)):
        if ex.id in (retrace or {}):
            write_trace(run_dir, ex.id, g.records, batch.repeat)
            if list(retrace[ex.id].get("token_ids") or []) != list(g.token_ids):
                log.warning("%s: example %r (repeat %d) decoded again for its trace gave other tokens than its row "
                            "(%d new tokens, the row %d): the trace is not of the row's decode", run_dir, ex.id,
                            batch.repeat, len(g.token_ids), len(retrace[ex.id].get("token_ids") or []))
        if ex.id not in wanted:
            continue
        if job.trace:
            write_trace(run_dir, ex.id, g.records, batch.repeat)
        job.method.observe_output(g.token_ids)  # before make_row takes the carried state after this example
        rows.append({**make_row(job, ex, g, info, c), "repeat": batch.repeat, "batch": batch.index,
                     "batch_size": len(batch.examples)})
    return rows


def make_row(job: Job, ex: Example, g: Generation, info: dict[str, Any], c: dict) -> dict[str, Any]:
    """The result row of one example: ids, output, metrics (docs/design.md section 5), scores and, for a method
    that carries state across examples, that state after this example (`carried_state`)."""
    carried = job.method.carried_state()
    return {"id": ex.id, "method": job.method.name, "pair": c["pair"]["name"], "dataset": job.evaluator.name,
            **info, "output": g.text, "token_ids": g.token_ids, "lossless": job.method.lossless, "seed": job.seed,
            **example_metrics(g), **job.evaluator.score(ex, g.text),
            "truncated": job.evaluator.truncated(ex, g.text, g.stop_reasons),
            **({"carried_state": carried} if carried is not None else {})}


def run(cfg: DictConfig, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Run one job of the config (its `task`) holding its output folder's lock; returns the summary.

    A mandatory value left unset (???) fails first, naming its key. One writer per folder: a second
    process on a busy folder fails at once naming the holder, or waits for it with `wait_for_lock`
    (true, or a number of seconds).
    """
    check_mandatory({k: v for k, v in OmegaConf.to_container(cfg).items() if k != "hydra"})
    task = cfg.task.name if "task" in cfg else "bench"
    fn, timeout = TASKS.get(task), lock_timeout(cfg.get("wait_for_lock", False))
    run_dir = output_dir(out_dir)
    with folder_lock(run_dir, timeout):
        return fn(cfg, run_dir)


@TASKS.register("bench")
def bench(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The benchmark run of one config into run_dir (whose lock the caller holds); returns the summary
    (also written to run_dir/summary.json)."""
    switch_progress(cfg.get("progress", "auto"))
    choices = _choices(cfg)
    c = resolved(cfg)
    # validate everything cheap before loading models
    check_run_settings(c)
    check_selection(c.get("limit"), c.get("shard"))
    params = sampling_params(c["decode"])
    max_new, seed = max_new_tokens(c["decode"], c["dataset"]), int(c["decode"]["seed"])
    method = build_method(c["method"])
    batch_size = int(c.get("batch_size", 1))  # an integer >= 1: check_run_settings checked it
    method.check_batch(batch_size)
    method.check_decode(params)
    compile_ = engine_compile(c)
    if compile_:
        method.check_compile()
    check_cross_tokenizer(c["pair"], method.name, "draft" in method.roles, method.cross_tokenizer)
    check_draft(c["pair"], method)
    any_version = bool(c.get("resume_any_version", False))  # a boolean: check_run_settings checked it
    evaluator = build_dataset(c["dataset"])
    stop_strings(list(evaluator.stop_strings), "dataset.stop_strings")  # the top-level key's: check_run_settings
    examples = select(evaluator.examples(), c.get("limit"), c.get("shard"), evaluator.stratum)
    device = resolve_device(c.get("device", "auto"))
    threads = set_threads(c.get("threads", "auto"))
    torch.manual_seed(seed)

    pair = load_pair(c["pair"], device)
    stops = tuple(evaluator.stop_strings) + tuple(c.get("stop_strings") or ())
    job = Job(make_engine(pair, method, params, stops, compile_), method, pair, evaluator, c["dataset"], max_new, seed,
              c.get("on_long_prompt", "error"), bool(c.get("trace", False)))
    job.check_prompts(examples)
    # everything is validated: only now write to the output folder (folder_lock removes it again if left empty)
    record = {"config": c, "choices": choices, "seed": seed, **provenance.git_info(),
              "versions": provenance.package_versions(), "device_info": provenance.device_info(device),
              "runtime": provenance.runtime(method.bound.models, threads, pair, tuple(method.hidden_layers))}
    saved = check_resume(run_dir, record)
    writer = RowWriter(run_dir)
    if c.get("remeasure", False):  # the version check first: a refused run leaves config.json as it was
        saved = new_measurement(run_dir, check_version(run_dir, saved, record, any_version), writer.rows)
    first = saved.get("measure_from", 0)
    repeats = range(first, first + int(c.get("repeats", 1)))
    # repeat by repeat; with trace=true also the batches of rows without their trace (decoded again for it)
    all_batches = batches(examples, repeats, batch_size)
    retrace = {(b.repeat, b.index): untraced(writer, b, run_dir) for b in all_batches} if job.trace else {}
    todo = [b for b in all_batches if missing(writer, b) or retrace.get((b.repeat, b.index))]
    wanted, to_decode = len(examples) * len(repeats), sum(len(missing(writer, b)) for b in todo)
    retraced = sum(len(r) for r in retrace.values())
    if retraced:
        log.warning("%s: trace=true: %d rows in the folder have no trace (a run without trace=true wrote them); "
                    "decoding their examples again for their traces (their rows are kept)", run_dir, retraced)
    log.info("%s: %d examples, %d already done, %d to decode%s%s", run_dir, wanted, wanted - to_decode, to_decode,
             f" ({len(examples)} examples x {len(repeats)} repeats)" if len(repeats) > 1 else "",
             f" in {len(todo)} batches of up to {batch_size}" if batch_size > 1 else "")
    if wanted > to_decode:
        log.warning("%s: reusing %d rows already in the folder (resume); to measure again, rerun with "
                    "remeasure=true (a new set of repeats; nothing is deleted)", run_dir, wanted - to_decode)
    initial = method.carried_state()
    if todo:
        saved = check_version(run_dir, saved, record, any_version)
    warm_up(job, [b.examples for b in todo if b.repeat == todo[0].repeat][: int(c.get("warmup", 0))])
    previous = None
    with progress_bar(None, cfg.get("progress", "auto"), total=to_decode, desc=method.name, unit="ex") as bar:
        for b in todo:
            if (b.repeat, b.index - 1) != previous:  # a new repeat, or after batches not decoded: the state before b
                before = {ex.id for ex in examples[: b.index * batch_size]}
                start_repeat(method, initial, [r for r in writer.rows if r["id"] in before], b.repeat, run_dir)
            previous = (b.repeat, b.index)
            new = batch_rows(job, b, {ex.id for ex in missing(writer, b)}, c, run_dir, retrace.get((b.repeat, b.index)))
            writer.append_many(new)  # one write: a crash leaves whole batches
            bar.update(len(new))

    rows = measured_rows(read_rows(writer.path), saved)  # as recorded: a resume reads the same rows back
    process = recorded_processes(run_dir, first, to_decode, device)  # before a calibration adds to the peak
    summary = {**summarize(rows), **repeat_spread(rows), "decoded": to_decode, "resumed": len(rows) - to_decode,
               "measure_from": first, "batch_size": batch_size,
               **speedup_summary(job, rows, examples, run_dir, first, batch_size),
               "method": method.name, "pair": c["pair"]["name"], "dataset": evaluator.name,
               "lossless": method.lossless, **process, **record,
               **code_version(saved), **{k: saved[k] for k in ("resumed_versions",) if k in saved}}
    write_json_atomic(run_dir / SUMMARY, summary)
    wandb_log.log_run(c.get("logger"), run_dir, summary, rows)  # best effort: never raises
    log.info("%s: %d rows (%d decoded, %d resumed), %.1f tok/s, acceptance %s, score %s, predicted speedup %s",
             run_dir, summary["n_examples"], summary["decoded"], summary["resumed"], summary["tokens_per_s"] or 0,
             rounded(summary["acceptance_rate"]), rounded(summary["score"]), rounded(summary["predicted_speedup"], 2))
    return summary


def rounded(x: float | None, digits: int = 3) -> float | None:
    """x rounded for the log line (None stays None)."""
    return None if x is None else round(x, digits)


def _choices(cfg: DictConfig) -> dict[str, str]:
    """hydra.runtime.choices: from the composed config (tests) or the running Hydra app."""
    if "hydra" in cfg and cfg.hydra.get("runtime"):
        return dict(cfg.hydra.runtime.choices)
    try:
        from hydra.core.hydra_config import HydraConfig

        return dict(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}

