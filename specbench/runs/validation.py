"""A run's settings checked before anything loads or is written, and the folder's record checked before rows are
added to it: decode settings, CPU threads, the resolved config, the configuration and code version of the rows
already in the folder."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.common.configs import differences
from specbench.common.errors import InputError
from specbench.common.files import write_json_atomic
from specbench.common.options import integer, real, threads_setting
from specbench.decoding.sampling import SamplingParams
from specbench.runs.identity import identity, with_defaults
from specbench.runs.results import CONFIG

log = logging.getLogger(__name__)


def sampling_params(decode: dict) -> SamplingParams:
    """Validated decode settings: each value's type and range, the error naming its `decode.` key."""
    integer(decode["max_new_tokens"], "decode.max_new_tokens", low=1, null=True)  # null: the dataset's
    if "seed" in decode:
        integer(decode["seed"], "decode.seed", low=0, high=2**63 - 1)  # torch seeds are 64-bit
    return SamplingParams(real(decode["temperature"], "decode.temperature", low=0),
                          integer(decode.get("top_k"), "decode.top_k", low=0, null=True),
                          real(decode.get("top_p"), "decode.top_p", low=0, high=1, low_open=True, null=True))


def free_cpus() -> int:
    """The CPUs not already busy: round(CPUs this process may run on - 1-minute load average), at least 1.
    Intra-op threads beyond the idle cores spin against other processes: on a 2-core machine with one busy core,
    vanilla on the toy pair ran 7x slower with 2 threads than with 1 (docs/results/harness.md)."""
    return max(1, round(len(os.sched_getaffinity(0)) - os.getloadavg()[0]))


def set_threads(value: int | str | None) -> int:
    """Set torch's CPU threads from the top-level key `threads` (N, auto = free_cpus(), or null = torch's
    default); returns the number that runs."""
    value = threads_setting(value)
    if value is not None:
        torch.set_num_threads(value if isinstance(value, int) else free_cpus())  # an int, else auto
    return torch.get_num_threads()


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain values with interpolations resolved, without the hydra node (which only resolves
    inside a Hydra app): what config.json records."""
    return {str(k): OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in cfg.items() if k != "hydra"}


def check_resume(run_dir: Path, record: dict) -> dict:
    """Refuse to append to a folder whose rows came from a different configuration; returns the folder's
    record (config.json, written from `record` for a new folder)."""
    path = run_dir / CONFIG
    if path.exists():
        old = json.loads(path.read_text())
        saved, now = identity(old["config"]), identity(record["config"])  # no resumable keys
        if saved != now:
            diff = "; ".join(differences(with_defaults(saved), with_defaults(now)))
            raise InputError(f"{run_dir} holds results of a different configuration (saved vs now: {diff}); refusing "
                             f"to mix them. Use another output folder (hydra.run.dir=...) or delete it. Saved: {path}")
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
    """Refuse to add rows of another code version (git hash and dirty flag, as recorded: uncommitted changes
    themselves cannot be compared) unless `allow` (resume_any_version=true), which appends the new version to
    config.json's `resumed_versions`; returns the folder's record."""
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


def new_measurement(run_dir: Path, saved: dict, rows: list[dict]) -> dict:
    """remeasure=true: start a new set of repeats after every row in the folder (nothing is deleted);
    config.json's `measure_from` names its first repeat index. Returns the folder's record."""
    first = 1 + max((r.get("repeat", 0) for r in rows), default=-1)
    log.info("%s: remeasure=true: a new set of repeats from index %d (the %d rows before it stay)", run_dir, first,
             len(rows))
    saved = {**saved, "measure_from": first}
    write_json_atomic(run_dir / CONFIG, saved)
    return saved


def choices(cfg: DictConfig) -> dict[str, str]:
    """hydra.runtime.choices: from the composed config (tests) or the running Hydra app."""
    if "hydra" in cfg and cfg.hydra.get("runtime"):
        return dict(cfg.hydra.runtime.choices)
    try:
        from hydra.core.hydra_config import HydraConfig

        return dict(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}

