"""`python run.py [-m] OVERRIDES --dry-run`: every job the command would run, its folder, and what each lacks (weights,
trained drafters, datasets, GPUs, memory) in one pass, with the commands that fetch them; nothing is loaded, written
or downloaded (the hub is not asked: a model counts as present when it is a local folder or in the local cache).
Exit status 0 when every job can run here as configured, else 1."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser

from specbench.common.configs import compose_config, plain
from specbench.common.errors import UserError
from specbench.common.hub import cached_config, download_command
from specbench.data.dataset import build_dataset
from specbench.models.pairs import HEADROOM, gpus_needed, pair_files, weights_gb
from specbench.runs.layout import job_dir
from specbench.runs.results import ROWS
from specbench.runs.slurm import sweep_jobs
from specbench.runs.validation import resolved

FLAGS = ("-m", "--multirun", "--dry-run")


@dataclass
class JobCheck:
    """One job: its overrides, its folder (None if its config does not compose), what it lacks, how to fetch it."""

    overrides: list[str]
    folder: Path | None = None
    rows: int = 0  # rows already in the folder (a run resumes them)
    lacks: list[str] = field(default_factory=list)
    fetch: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def jobs(args: list[str]) -> list[list[str]]:
    """Each job's overrides: with -m the sweep's (the command's and its experiment's hydra.sweeper.params), else
    the command's own."""
    lines = [a for a in args if a not in FLAGS]
    if not any(a in ("-m", "--multirun") for a in args):
        return [lines]
    fixed = [o.input_line for o in OverridesParser.create().parse_overrides(lines) if not o.is_sweep_override()]
    base = compose_config([x for x in fixed if x is not None], hydra=True)
    base.hydra.overrides.task = lines
    return sweep_jobs(base)


def where(folder: Path) -> str:
    """`folder` relative to the working directory when below it."""
    try:
        return str(folder.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(folder)


def model_lacks(pair: dict[str, Any], check: JobCheck) -> None:
    """Models and tokenizers of a hub pair neither local folders nor in the local Hugging Face cache."""
    if pair.get("builder") != "hub":
        return  # the toy pair ships or trains its weights; random pairs are built
    for path, revision in dict.fromkeys(pair_files(pair).values()):
        if not Path(path).is_dir() and cached_config(path, revision) is None:
            check.lacks.append(f"weights: {path} is not in the local Hugging Face cache")
            check.fetch.append(download_command(path, revision))


def in_cache(path: str) -> bool:
    """Is `path` a hub id whose config.json the local Hugging Face cache holds?"""
    try:
        return cached_config(path) is not None
    except ValueError:  # not a hub id (huggingface_hub's HFValidationError)
        return False


def drafter_lacks(c: dict[str, Any], check: JobCheck) -> None:
    """A trained drafter or head the method names (method.drafter / method.head): a folder that does not exist yet
    (trained by task=synth then task=distill), or a hub id not in the local cache."""
    method, pair = c["method"], c["pair"]["name"]
    for key in ("drafter", "head"):
        path = method.get(key)
        if not isinstance(path, str) or Path(path).is_dir() or in_cache(path):
            continue
        check.lacks.append(f"trained drafter: method.{key}={path} is neither a folder nor in the local cache")
        if path.count("/") == 1 and not path.startswith((".", "/")):  # a hub id (owner/name)
            check.fetch.append(download_command(path))
            continue
        kind = ("eagle3" if "eagle3" in method["name"] else "medusa") if key == "head" else \
            ("sd2" if method["name"] == "sd2" else "distilled")
        check.fetch.append(f"python run.py task=synth pair={pair} && python run.py task=distill task.kind={kind} "
                           f"pair={pair}")


def dataset_lacks(c: dict[str, Any], check: JobCheck, seen: dict[str, str | None]) -> None:
    """The dataset's examples cannot be read (a missing local copy, a hub set not cached): its error, once per set."""
    key = json.dumps(c["dataset"], sort_keys=True, default=str)
    if key not in seen:
        try:
            build_dataset(c["dataset"]).examples()
            seen[key] = None
        except UserError as err:
            seen[key] = str(err)
    message = seen[key]
    if message:
        check.lacks.append(f"dataset {c['dataset']['name']}: {message}")
        check.fetch += [line.strip() for line in message.splitlines() if line.startswith("  ")]  # its commands


def memory_gb() -> float:
    """This machine's memory in GB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def hardware_lacks(c: dict[str, Any], launcher: dict[str, Any], check: JobCheck) -> None:
    """GPUs and memory for the pair's weights x HEADROOM: the SLURM job's gpus_per_node, else this machine's."""
    pair, gpus, device = c["pair"], torch.cuda.device_count(), str(c.get("device", "auto"))
    slurm = "slurm" in str(launcher.get("_target_", "")).lower()
    if device.startswith("cuda") and not gpus and not slurm:
        check.lacks.append(f"GPUs: device={device}, but this machine has no CUDA GPU")
    need, gb = gpus_needed(pair), weights_gb(pair)
    if need is None or gb is None:
        return  # a pair of unrecorded size (toy, random): it runs anywhere
    weights = f"pair {pair['name']} has {gb:.0f} GB of weights (x {HEADROOM}: {need} GPUs of 80 GB)"
    if slurm:
        asked = launcher.get("gpus_per_node") or 0
        if asked < need:
            check.lacks.append(f"GPUs: {weights}; the job asks for {asked} (hydra.launcher.gpus_per_node)")
    elif gpus and device != "cpu":
        have = sum(torch.cuda.get_device_properties(i).total_memory for i in range(gpus)) / 1e9
        if have < gb * HEADROOM:
            check.lacks.append(f"GPUs: {weights}; this machine has {gpus} GPUs, {have:.0f} GB")
    elif gb * HEADROOM > (ram := memory_gb()):
        check.lacks.append(f"memory: {weights}; this machine has {ram:.0f} GB and no GPU (submit it to "
                           "SLURM: hydra/launcher=slurm)")
    else:
        check.notes.append("no GPU here: runs on the CPU")


def check_job(overrides: list[str], seen: dict[str, str | None]) -> JobCheck:
    """The job's folder and everything it lacks; a config that does not compose or validate is one lack."""
    from specbench.runs.runner import checked  # the runner's own checks, which need no model

    check = JobCheck(overrides)
    try:
        cfg = compose_config(overrides, hydra=True)
        check.folder = job_dir(cfg)
        c = resolved(cfg)
    except Exception as err:  # noqa: BLE001 - Hydra's composition errors have no common user-error type
        check.lacks.append(f"config: {err}")
        return check
    rows = check.folder / ROWS
    check.rows = len(rows.read_text().splitlines()) if rows.is_file() else 0
    dataset_lacks(c, check, seen)
    model_lacks(c["pair"], check)
    drafter_lacks(c, check)
    hardware_lacks(c, plain(cfg.hydra.launcher), check)
    if not check.lacks:
        try:
            checked(c)
        except UserError as err:
            check.lacks.append(f"config: {err}")
    return check


def report(checks: list[JobCheck]) -> str:
    """Every job with its folder and lacks, then the commands that fetch what is lacking, each once."""
    lines = [f"{len(checks)} job{'s' * (len(checks) != 1)} (nothing loaded, written or downloaded):"]
    shown: dict[str, int] = {}
    for i, ch in enumerate(checks):
        state = f"resumes {ch.rows} rows" if ch.rows else "new"
        folder = "(no folder: the config does not compose)" if ch.folder is None else f"{where(ch.folder)} ({state})"
        lines.append(f"#{i} {' '.join(ch.overrides) or '(defaults)'}\n    -> {folder}")
        for lack in ch.lacks:  # a lack shown for an earlier job in full is named by its first line
            first = lack.splitlines()[0]
            lines.append(f"    lacks {first[:100]}{'...' * (len(first) > 100)} (as #{shown[lack]})" if lack in shown
                         else "    lacks " + lack.replace("\n", "\n      "))
            shown.setdefault(lack, i)
        lines += [f"    note: {x}" for x in ch.notes]
    fetch = list(dict.fromkeys(f for ch in checks for f in ch.fetch))
    ready = sum(not ch.lacks for ch in checks)
    lines.append(f"{ready} of {len(checks)} jobs can run here as configured.")
    if fetch:
        lines += ["Fetch what is lacking (where the hub is reachable; an offline node needs the cache copied to it):",
                  *(f"  {f}" for f in fetch)]
    return "\n".join(lines)


def main(args: list[str]) -> int:
    """Print the dry run of `args` (run.py's overrides and flags); 0 when every job can run, else 1."""
    before = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # the local caches only: a dry run downloads nothing (common.hub reads it now)
    try:
        seen: dict[str, str | None] = {}
        checks = [check_job(job, seen) for job in jobs(args)]
    finally:
        os.environ.pop("HF_HUB_OFFLINE") if before is None else os.environ.update(HF_HUB_OFFLINE=before)
    print(report(checks))
    return 0 if all(not ch.lacks for ch in checks) else 1

