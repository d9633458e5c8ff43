"""One run: config -> lock the folder -> seed -> pair -> method -> examples -> warm-up -> decode, score,
append -> summary."""

from __future__ import annotations

import json
import logging
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.runs import provenance
from specbench.runs import wandb_log
from specbench.data.dataset import Evaluator, Example, build_dataset, check_selection, max_new_tokens, select
from specbench.decoding.engine import Engine, Generation, concat_generations
from specbench.decoding.method import METHODS, Binding, Method
from specbench.decoding.metrics import example_metrics, summarize
from specbench.common.options import check_mandatory, check_options, check_run_settings, integer, real
from specbench.models.pairs import Pair, load_pair, resolve_device
from specbench.common.progress import progress_bar, switch_progress
from specbench.data.prompting import encode
from specbench.common.registry import Registry
from specbench.runs.results import CONFIG, SUMMARY, RowWriter, folder_lock, lock_timeout, without_keys
from specbench.common.configs import differences
from specbench.common.files import write_json_atomic
from specbench.decoding.sampling import SamplingParams
from specbench.runs.traces import write_trace

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


def build_method(cfg: dict) -> Method:
    """The registered method cfg['name'] built with the remaining keys as options, each first checked
    against the type hints of the method's constructors (`method.gamma=true` is not γ=1)."""
    cls = METHODS.get(cfg["name"])
    options = {k: v for k, v in cfg.items() if k != "name"}
    return cls(**check_options(cls, options, "method", f"method {cfg['name']!r}"))


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
        saved, now = without_keys(old["config"]), without_keys(record["config"])  # identity: no resumable keys
        if saved != now:
            raise ValueError(
                f"{run_dir} holds results of a different configuration (saved vs now: "
                f"{'; '.join(differences(saved, now))}); refusing to mix them. Use another output folder "
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
        raise ValueError(f"{run_dir} holds rows of {describe_version(known[0])}, but this is "
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
        raise ValueError(f"{run_dir}: method {method.name!r} carries state from one example to the next, but the "
                         f"row of {last['id']!r} has no 'carried_state' (an older version wrote it), so resuming "
                         "would not continue as an uninterrupted run. Rerun it in another folder "
                         "(hydra.run.dir=...) or delete this one.")
    method.restore_state(last["carried_state"])


def pair_binding(pair: Pair, method: Method, params: SamplingParams) -> Binding:
    """The pair as `method` runs on it: the models of its roles, the tokenizer and vocabulary range, the EOS ids
    and context over those models, and the decode settings."""
    models = {role: pair.model(role) for role in method.roles}
    used = list(models.values())
    return Binding(models, pair.tokenizer, pair.vocab_size, frozenset(pair.eos_ids(used)), params,
                   pair.context_length(used), pair)


def make_engine(pair: Pair, method: Method, params: SamplingParams, stop_strings: tuple[str, ...]) -> Engine:
    """Bind `method` to `pair` (Method.bind, once per engine) and build the engine that runs it."""
    method.bind(pair_binding(pair, method, params))
    return Engine(method, stop_strings)


def fit_prompt(ids: list[int], context: int | None, max_new: int, on_long: str, where: str
               ) -> tuple[list[int], int | None]:
    """The prompt ids [P] if they fit the context; else an error, or its last tokens when truncating."""
    if context is None or len(ids) < context:
        return ids, None
    if on_long == "error":
        raise ValueError(f"{where}: the prompt has {len(ids)} tokens but the model context is {context}; "
                         "set on_long_prompt=truncate to keep its last tokens")
    keep = max(1, context - max_new) if context > max_new else context // 2
    return ids[-keep:], len(ids)


@dataclass
class Job:
    """Everything needed to decode and score the examples of one run."""

    engine: Engine
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


def decode_example(job: Job, ex: Example, trace: bool) -> tuple[Generation, dict[str, Any]]:
    """Decode every turn of one example with one per-example generator; returns the merged Generation."""
    gen = torch.Generator(device=job.engine.device).manual_seed(example_seed(job.seed, ex.id))
    answers: list[str] = []
    gens: list[Generation] = []
    info: dict[str, Any] = {"prompt_tokens": 0, "prompt_truncated_from": None}
    for k in range(len(ex.turns) if ex.turns else 1):
        ids, cut = fit_prompt(job.encode(ex, answers), job.engine.context_length, job.max_new, job.on_long,
                              f"example {ex.id!r} turn {k + 1}")
        g = job.engine.generate(ids, job.max_new, generator=gen, trace=trace)
        info["prompt_tokens"] += len(ids)
        info["prompt_truncated_from"] = info["prompt_truncated_from"] or cut
        gens.append(g)
        answers.append(g.text)
    if ex.turns:
        info["turn_outputs"] = answers
        return concat_generations(gens, answers[-1]), info
    return gens[0], info


def warm_up(job: Job, examples: list[Example]) -> None:
    """Decode `examples` through the same path without recording them; the method's carried state is kept."""
    saved = job.method.carried_state()
    for ex in examples:
        decode_example(job, ex, False)
    if saved is not None:
        job.method.restore_state(saved)


def make_row(job: Job, ex: Example, g: Generation, info: dict[str, Any], c: dict) -> dict[str, Any]:
    """The result row of one example: ids, output, metrics (design.md section 5), scores and, for a method
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
    any_version = bool(c.get("resume_any_version", False))  # a boolean: check_run_settings checked it
    evaluator = build_dataset(c["dataset"])
    examples = select(evaluator.examples(), c.get("limit"), c.get("shard"))
    device = resolve_device(c.get("device", "auto"))
    if c.get("threads"):  # CPU threads; 1 keeps timings stable on a busy shared machine
        torch.set_num_threads(int(c["threads"]))
    torch.manual_seed(seed)

    pair = load_pair(c["pair"], device)
    stops = tuple(evaluator.stop_strings) + tuple(c.get("stop_strings") or ())
    job = Job(make_engine(pair, method, params, stops), method, pair, evaluator, c["dataset"], max_new, seed,
              c.get("on_long_prompt", "error"), bool(c.get("trace", False)))
    job.check_prompts(examples)
    # everything is validated: only now write to the output folder (folder_lock removes it again if left empty)
    record = {"config": c, "choices": choices, "seed": seed, **provenance.git_info(),
              "versions": provenance.package_versions(), "device_info": provenance.device_info(device)}
    saved = check_resume(run_dir, record)
    writer = RowWriter(run_dir)
    todo = [e for e in examples if e.id not in writer.done]
    log.info("%s: %d examples, %d already done, %d to decode", run_dir, len(examples), len(examples) - len(todo), len(todo))
    if todo:
        saved = check_version(run_dir, saved, record, any_version)
        restore_carried(method, writer.rows, run_dir)
    warm_up(job, todo[: int(c.get("warmup", 0))])
    for ex in progress_bar(todo, cfg.get("progress", "auto"), desc=method.name, unit="ex"):
        g, info = decode_example(job, ex, job.trace)
        if job.trace:
            write_trace(run_dir, ex.id, g.records)
        writer.append(make_row(job, ex, g, info, c))

    summary = {**summarize(writer.rows), "method": method.name, "pair": c["pair"]["name"], "dataset": evaluator.name,
               "lossless": method.lossless, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               **provenance.peak_memory(device), **record,
               **code_version(saved), **{k: saved[k] for k in ("resumed_versions",) if k in saved}}
    write_json_atomic(run_dir / SUMMARY, summary)
    wandb_log.log_run(c.get("logger"), run_dir, summary, writer.rows)  # best effort: never raises
    log.info("%s: %d rows, %.1f tok/s, acceptance %s", run_dir, summary["n_examples"], summary["tokens_per_s"] or 0,
             summary["acceptance_rate"])
    return summary


def _choices(cfg: DictConfig) -> dict[str, str]:
    """hydra.runtime.choices: from the composed config (tests) or the running Hydra app."""
    if "hydra" in cfg and cfg.hydra.get("runtime"):
        return dict(cfg.hydra.runtime.choices)
    try:
        from hydra.core.hydra_config import HydraConfig

        return dict(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}

