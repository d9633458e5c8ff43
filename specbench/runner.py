"""One run: config -> seed -> pair -> method -> examples -> warm-up -> decode, score, append -> summary."""

from __future__ import annotations

import logging
import time
import zlib
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specbench import provenance
from specbench.data import Evaluator, Example, build_dataset, select
from specbench.engine import Engine, Generation
from specbench.method import METHODS, Method
from specbench.metrics import example_metrics, summarize
from specbench.pairs import Pair, load_pair, resolve_device
from specbench.prompting import encode
from specbench.results import CONFIG, SUMMARY, RowWriter, write_json_atomic
from specbench.sampling import Sampler, SamplingParams
from specbench.traces import write_trace

log = logging.getLogger(__name__)

# Keys that may change between a run and its resumption without changing any row.
RESUMABLE_KEYS = {("dataset", "limit"), ("warmup",), ("progress",), ("trace",)}


def build_method(cfg: dict) -> Method:
    """The registered method cfg['name'] built with the remaining keys as options."""
    import methods  # noqa: F401  (import registers)

    return METHODS.get(cfg["name"])(**{k: v for k, v in cfg.items() if k != "name"})


def sampling_params(decode: dict) -> SamplingParams:
    """Validated decode settings."""
    if int(decode["max_new_tokens"]) <= 0:
        raise ValueError(f"decode.max_new_tokens must be >= 1, got {decode['max_new_tokens']}")
    return SamplingParams(float(decode["temperature"]), decode.get("top_k"), decode.get("top_p"))


def example_seed(seed: int, example_id: str) -> int:
    """Per-example RNG seed: the same for an example whether or not the run was resumed."""
    return zlib.crc32(f"{seed}:{example_id}".encode())


def _identity(cfg: dict) -> dict:
    """The config without the keys a resumed run may change."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg.items()}
    for path in RESUMABLE_KEYS:
        d = out
        for k in path[:-1]:
            d = d.get(k, {})
        d.pop(path[-1], None)
    return out


def check_resume(run_dir: Path, record: dict) -> None:
    """Refuse to append to a folder whose rows came from a different configuration."""
    path = run_dir / CONFIG
    if path.exists():
        import json

        old = json.loads(path.read_text())
        if _identity(old["config"]) != _identity(record["config"]):
            raise ValueError(
                f"{run_dir} holds results of a different configuration; refusing to mix them. "
                f"Use another output folder (hydra.run.dir=...) or delete it. Saved: {path}"
            )
    else:
        write_json_atomic(path, record)


def make_engine(pair: Pair, method: Method, params: SamplingParams, stop_strings: tuple[str, ...]) -> Engine:
    """The engine for `method` on `pair`: verifier = target (or the draft for draft_only)."""
    verifier = pair.model(method.verifier)
    drafter = pair.model("draft") if method.uses_draft else None
    models = [m for m in (verifier, drafter) if m is not None]
    eos = pair.tokenizer.eos_token_id
    eos_ids = set()
    for m in models:
        e = m.generation_config.eos_token_id if m.generation_config is not None else None
        eos_ids |= set(e if isinstance(e, list) else [e]) - {None}
    if eos is not None:
        eos_ids.add(eos)
    return Engine(verifier, drafter, Sampler(params, pair.vocab_size), eos_ids, pair.tokenizer,
                  stop_strings, pair.context_length(models))


def prepare_prompts(pair: Pair, evaluator: Evaluator, examples: list[Example], dcfg: dict, max_new: int,
                    context: int | None, on_long: str) -> dict[str, tuple[list[int], int | None]]:
    """Token ids per example id, checked against the context before any decoding starts."""
    if on_long not in ("error", "truncate"):
        raise ValueError(f"on_long_prompt must be 'error' or 'truncate', got {on_long!r}")
    out = {}
    for ex in examples:
        ids = encode(pair.tokenizer, ex, dcfg.get("system_prompt"), dcfg.get("chat_template", "auto"))
        truncated = None
        if context is not None and len(ids) >= context:
            if on_long == "error":
                raise ValueError(
                    f"example {ex.id!r} of dataset {evaluator.name!r}: the prompt has {len(ids)} tokens but the "
                    f"model context is {context}; set on_long_prompt=truncate to keep its last tokens"
                )
            keep = max(1, context - max_new) if context > max_new else context // 2
            truncated, ids = len(ids), ids[-keep:]
        out[ex.id] = (ids, truncated)
    return out


def decode_one(engine: Engine, method: Method, ids: list[int], max_new: int, seed: int, trace: bool) -> Generation:
    """Decode one prompt with a fresh per-example generator."""
    gen = torch.Generator(device=engine.device).manual_seed(seed)
    return engine.generate(ids, method, max_new, generator=gen, trace=trace)


def run(cfg: DictConfig, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Run one job of the config; returns the summary (also written to out_dir/summary.json)."""
    choices = _choices(cfg)
    c = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
         for k, v in cfg.items() if k != "hydra"}  # the hydra node only resolves inside a Hydra app
    if out_dir is None:
        from hydra.core.hydra_config import HydraConfig

        out_dir = HydraConfig.get().runtime.output_dir
    run_dir = Path(out_dir)
    # validate everything cheap before loading models
    params = sampling_params(c["decode"])
    max_new, seed = int(c["decode"]["max_new_tokens"]), int(c["decode"]["seed"])
    method = build_method(c["method"])
    evaluator = build_dataset(c["dataset"])
    examples = select(evaluator.examples(), c["dataset"].get("limit"), c["dataset"].get("shard"))
    device = resolve_device(c.get("device", "auto"))
    torch.manual_seed(seed)

    pair = load_pair(c["pair"], device)
    stops = tuple(evaluator.stop_strings) + tuple(c.get("stop_strings") or ())
    engine = make_engine(pair, method, params, stops)
    prompts = prepare_prompts(pair, evaluator, examples, c["dataset"], max_new, engine.context_length,
                              c.get("on_long_prompt", "error"))
    # everything is validated: only now touch the output folder
    record = {"config": c, "choices": choices, "seed": seed, **provenance.git_info(),
              "versions": provenance.package_versions(), "device_info": provenance.device_info(device)}
    run_dir.mkdir(parents=True, exist_ok=True)
    check_resume(run_dir, record)
    writer = RowWriter(run_dir)
    todo = [e for e in examples if e.id not in writer.done]
    log.info("%s: %d examples, %d already done, %d to decode", run_dir, len(examples), len(examples) - len(todo), len(todo))
    trace = bool(c.get("trace", False))
    for ex in todo[: int(c.get("warmup", 0))]:  # same path, not recorded
        decode_one(engine, method, prompts[ex.id][0], max_new, example_seed(seed, ex.id), False)

    progress = c.get("progress", "auto")
    bar = tqdm(todo, desc=f"{method.name}", unit="ex", disable=None if progress == "auto" else not progress)
    for ex in bar:
        ids, truncated = prompts[ex.id]
        gen = decode_one(engine, method, ids, max_new, example_seed(seed, ex.id), trace)
        row = {"id": ex.id, "method": method.name, "pair": c["pair"]["name"], "dataset": evaluator.name,
               "prompt_tokens": len(ids), "prompt_truncated_from": truncated, "output": gen.text,
               "token_ids": gen.token_ids, "lossless": method.lossless, "seed": seed,
               **example_metrics(gen, method.verifier), **evaluator.score(ex, gen.text)}
        if trace:
            write_trace(run_dir, ex.id, gen.records)
        writer.append(row)

    summary = {**summarize(writer.rows), "method": method.name, "pair": c["pair"]["name"], "dataset": evaluator.name,
               "lossless": method.lossless, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               **provenance.peak_memory(device), **record}
    write_json_atomic(run_dir / SUMMARY, summary)
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
