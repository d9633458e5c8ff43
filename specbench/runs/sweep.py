"""What a failed job and a sweep with failed jobs report: a user error as Hydra's one-line message, the job's
traceback in its log file only, a read-only or full results folder named before Hydra writes there, and every
failed job of a sweep with its error."""

from __future__ import annotations

import atexit
import logging
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from specbench.common.errors import UserError
from specbench.common.files import FULL, FolderNotWritable, check_writable
from specbench.runs.slurm import result_files, submitit_results, sweep_jobs

log = logging.getLogger(__name__)


class JobError(CompactHydraException):
    """A job's user error as Hydra reports it: the message alone (HYDRA_FULL_ERROR=1 still prints the chain)."""


def for_hydra(err: BaseException) -> BaseException:
    """What main() raises for `err`: JobError(message) for a user error, else `err` itself."""
    return JobError(str(err)) if isinstance(err, UserError) else err


def describe(err: BaseException) -> str:
    """A job's error in one message: the text of a user error, else '<type>: <text>'."""
    return str(err) if isinstance(err, (UserError, JobError)) else f"{type(err).__name__}: {err}"


class JobLog(logging.FileHandler):
    """The job's log file: a line the disk has no room for is dropped quietly (the run's error says why)."""

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if not (isinstance(err, OSError) and err.errno in FULL):
            super().handleError(record)


def log_job_error(err: BaseException) -> None:
    """`err` with its traceback into the log files of the running job (the root logger's file handlers), not
    onto the console, where Hydra shows the message."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "job failed: %s", (describe(err),),
                            (type(err), err, err.__traceback__))
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def job_label(ret: JobReturn) -> str:
    """'#<n> <overrides> (<folder>)' for a job's return."""
    num = OmegaConf.select(ret.hydra_cfg, "hydra.job.num") if ret.hydra_cfg is not None else None
    folder = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir") if ret.hydra_cfg is not None else None
    where = "" if folder is None else f" ({folder}{'' if Path(folder).is_dir() else ': removed, it held no results'})"
    return f"#{num} {' '.join(filter_overrides(ret.overrides or []))}{where}"


def failure(ret: JobReturn) -> tuple[str, str]:
    """(label, error message) of a failed job's return. Hydra keeps the error in `_return_value`: its
    `return_value` property would raise it."""
    return job_label(ret), describe(ret._return_value)


def submitit_failures(pattern: str, since: float) -> list[tuple[str, str]]:
    """(label, error) of the failed jobs among submitit's result files matching `pattern`, written since `since`."""
    from submitit.core.utils import pickle_load

    out = []
    for path in result_files(pattern, since):
        outcome, value = pickle_load(path)
        if outcome == "success" and isinstance(value, JobReturn) and value.status is JobStatus.FAILED:
            out.append(failure(value))
        elif outcome == "error":  # the job died outside Hydra's run_job: submitit keeps its traceback
            out.append((f"submitit job {Path(path).name.removesuffix('_result.pkl')}", str(value).strip()))
    return out


def summary(failures: list[tuple[str, str]], total: int | None) -> str:
    """The sweep's closing report: how many jobs failed, then each job and its error, indented (an error
    already shown for an earlier job is named by that job's label, not repeated)."""
    of = f" of {total}" if total else ""
    lines = [f"sweep: {len(failures)}{of} jobs failed (a kept job folder's log file holds its traceback):"]
    shown: dict[str, str] = {}
    for label, message in failures:
        if message in shown:
            lines += [label, f"    the same error as {shown[message]}"]
        else:
            lines += [label, *("    " + line for line in message.splitlines())]
            shown[message] = label.split(" ")[0]
    return "\n".join(lines)


class WritableFolders(Callback):
    """Fails a run (a sweep) whose folder (paths.results) may not be written or has no room, naming it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from specbench.runs.layout import job_dir

        self.check(job_dir(config))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.check(Path(config.paths.results))

    @staticmethod
    def check(folder: Path) -> None:
        """Exit with the message alone unless `folder` may be written and has room."""
        try:
            check_writable(folder)
        except FolderNotWritable as err:  # Hydra turns a callback's exceptions into warnings and goes on
            raise SystemExit(str(err)) from None


class SweepFailures(Callback):
    """Ends a multirun with every failed job and its error (logged at ERROR, once, after Hydra's own report). Hydra
    shows only the first failed job's error and raises, so `on_multirun_end` never runs for a sweep with a failed
    job: the summary is also registered with `atexit`. A submitit launcher's jobs end in other processes: their
    results are read from submitit's result files (a JobReturn, or the traceback of a job that died outside Hydra)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.failures: list[tuple[str, str]] = []
        self.total: int | None = None
        self.pattern: str | None = None
        self.folder: str | None = None  # submitit's folder pattern (.../.submitit/%j)
        self.since = 0.0
        self.pending = False

    def __getstate__(self) -> dict:
        """Submitit pickles the launcher with its callbacks: a job's process starts with a fresh one."""
        return {}

    def __setstate__(self, state: dict) -> None:
        self._reset()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._reset()
        self.pending, self.since, self.pattern = True, time.time(), submitit_results(config)
        folder = config.hydra.launcher.get("submitit_folder")
        self.folder = str(folder) if folder else None
        try:
            self.total = len(sweep_jobs(config))
        except Exception as e:  # noqa: BLE001 - a sweeper other than the basic one: the count is left out
            log.debug("sweep size unknown: %s", e)
        atexit.register(self.report)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self.pending and job_return.status is JobStatus.FAILED:
            self.failures.append(failure(job_return))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.report()

    def report(self) -> None:
        """Log the summary of the failed jobs, once; nothing when every job succeeded."""
        if not self.pending:
            return
        self.pending = False
        placeholder = Path(self.folder) if self.folder and "%j" in self.folder else None
        if placeholder is not None and placeholder.is_dir() and not any(placeholder.iterdir()):
            placeholder.rmdir()  # submitit makes the pattern's literal `%j` folder when it starts; nothing is in it
        failures = self.failures + (submitit_failures(self.pattern, self.since) if self.pattern else [])
        if failures:
            log.error(summary(failures, self.total))
