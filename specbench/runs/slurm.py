"""Sweeps on Hydra launchers (the basic in-process one, SLURM or local processes through submitit): the jobs a
sweep runs, whether a SLURM cluster is reachable, and a progress bar over a sweep's jobs.

Requeue safety (SLURM) needs nothing here: submitit's `checkpoint` resubmits the same job with the same overrides,
hence the same results folder (a run folder's name holds no timestamp; only the sweep's own folder does), and the
runner resumes it from rows.jsonl. Folder names: specbench.runs.layout.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from specbench.common.configs import plain
from specbench.common.progress import progress_bar

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def export_distributed() -> int:
    """The number of processes of this run. In a submitit SLURM job of several tasks (hydra.launcher.tasks_per_node,
    nodes) it first exports the torch distributed environment torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT; submitit's TorchDistributedEnvironment), so accelerate sees one process per task, each
    picking its GPU by LOCAL_RANK."""
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and "RANK" not in os.environ:
        from submitit import JobEnvironment
        from submitit.helpers import TorchDistributedEnvironment

        if JobEnvironment().num_tasks > 1:
            TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return int(os.environ.get("WORLD_SIZE", "1"))


def sweep_jobs(cfg: DictConfig) -> list[list[str]]:
    """Each job's overrides, as BasicSweeper builds them from hydra.sweeper.params and the task overrides."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    node = cfg.hydra.sweeper.get("params")
    params = plain(node, resolve=False) if node is not None else {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(cfg.hydra.overrides.task)
    overrides = OverridesParser.create().parse_overrides(lines)
    return BasicSweeper.split_arguments(overrides, None)[0]


def job_pairs(cfg: DictConfig) -> list[str]:
    """The pair each job of a sweep runs: its `pair=` override, else the composed config's pair."""
    default = str(cfg.pair.name) if "pair" in cfg else "toy"
    return [next((o.split("=", 1)[1] for o in job if o.startswith("pair=")), default) for job in sweep_jobs(cfg)]


def sweep_gpus(*, _root_: DictConfig) -> int | None:
    """The launcher's default gpus_per_node: the most GPUs a job of the sweep needs (pairs.gpus_needed of each job's
    pair in conf/pair/), None (none asked) when every pair runs on a CPU. submitit asks the same of every job."""
    from specbench.common.files import CONF_DIR
    from specbench.models.pairs import gpus_needed

    files = [CONF_DIR / "pair" / f"{name}.yaml" for name in dict.fromkeys(job_pairs(_root_))]
    needs = [gpus_needed(yaml.safe_load(f.read_text())) for f in files if f.is_file()]
    return max((n for n in needs if n is not None), default=None)


OmegaConf.register_new_resolver("specbench.sweep_gpus", sweep_gpus, replace=True)


def slurm_unavailable(timeout_s: float = 15.0) -> str | None:
    """None if `sinfo` reaches a controller that has a node able to run jobs; else the reason why not."""
    if shutil.which("sinfo") is None:
        return "no SLURM client here (sinfo not found on PATH)"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"sinfo did not answer within {timeout_s:.0f} s"
    if p.returncode != 0:
        return f"sinfo failed (exit {p.returncode}): {p.stderr.strip()[:300]}"
    states = p.stdout.split()
    if not any(s.rstrip("*~#") in ("idle", "mixed", "allocated", "completing") for s in states):
        return f"no SLURM node is up (node states: {', '.join(states) or 'none'})"
    return None


def submitit_results(config: DictConfig) -> str | None:
    """The glob of the result files a submitit launcher writes, one per finished job (None for other launchers)."""
    folder = config.hydra.launcher.get("submitit_folder")
    return str(Path(str(folder).replace("%j", "*")) / "*_result.pkl") if folder else None


def result_files(pattern: str, since: float) -> list[str]:
    """The submitit result files matching `pattern` written since `since` (a time.time()), sorted."""
    return sorted(f for f in glob.glob(pattern) if os.stat(f).st_mtime >= since)


class SweepProgress(Callback):
    """A progress bar over the jobs of a multirun (rate and ETA), on a terminal only (tqdm's `disable=None`); with a
    submitit launcher, whose jobs end in other processes, a thread counts submitit's result files. Any failure in it
    is logged and ignored: a progress bar never fails a sweep."""

    def __init__(self, poll_s: float = 5.0) -> None:
        self._reset(poll_s)

    def _reset(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self._bar: Any = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict:
        """Submitit pickles the launcher with its callbacks: send only the settings, not the bar or thread."""
        return {"poll_s": self.poll_s}

    def __setstate__(self, state: dict) -> None:
        self._reset(**state)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self._start(config)
        except Exception as e:  # noqa: BLE001 - a progress bar must never fail a sweep
            log.warning("sweep progress bar disabled: %s", e)
            self._bar = None

    def _start(self, config: DictConfig) -> None:
        if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER or config.hydra.sweeper.get("max_batch_size"):
            return
        total = len(sweep_jobs(config))
        self._bar = progress_bar(total=total, progress=config.get("progress", "auto"), desc="sweep", unit="job",
                                 dynamic_ncols=True)
        if self._bar.disable:
            self._bar = None
            return
        pattern = submitit_results(config)
        if pattern:  # jobs end in other processes: count submitit's result files
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._poll, args=(pattern, time.time()), daemon=True)
            self._thread.start()

    def _poll(self, pattern: str, since: float) -> None:
        """Advance the bar to the number of result files written since the sweep started."""
        assert self._stop is not None
        while not self._stop.wait(self.poll_s):
            try:
                done = len(result_files(pattern, since))
                if self._bar is not None and done > self._bar.n:
                    self._bar.update(min(done, self._bar.total) - self._bar.n)
            except Exception as e:  # noqa: BLE001
                log.warning("sweep progress bar stopped: %s", e)
                return

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if self._bar is not None and self._thread is None:  # in-process launcher
            self._bar.update(1)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._bar is not None:
            if self._thread is not None:
                self._bar.update(self._bar.total - self._bar.n)  # every job has returned
            self._bar.close()
        self._bar = self._thread = self._stop = None


if __name__ == "__main__":  # `python -m specbench.runs.slurm`: is a cluster reachable from here?
    reason = slurm_unavailable()
    print(reason or "SLURM is reachable")
    sys.exit(1 if reason else 0)
