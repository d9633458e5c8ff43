"""The only entry point: python run.py [overrides]; python run.py -m ... for sweeps."""

import logging
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specbench.common.options import OptionError
from specbench.runs.overrides import check_option_overrides
from specbench.runs.results import LOCK, FolderLocked, folder_lock
from specbench.runs.runner import run
from specbench.runs.sweep import for_hydra, log_job_error

log = logging.getLogger(__name__)


def discard_job_dir(job_dir: Path, root: Path, hydra_files: set[str]) -> bool:
    """Remove a failed job's folder if it holds only what Hydra (and the folder lock) put there, then its
    parents left empty, up to but not including `root`; returns whether it was removed.

    Hydra creates the folder, `.hydra/` and the job's log before the job runs, so a job refused for bad
    input would otherwise leave a result folder with no results. A folder holding anything else (rows,
    config.json of an earlier run) is kept, and so is one another run holds the lock of.
    """
    job_dir, root = job_dir.resolve(), root.resolve()
    if job_dir == root or not job_dir.is_dir():
        return False
    try:
        with folder_lock(job_dir, timeout=0):  # not while another run is using the folder
            if any(p.name not in hydra_files | {LOCK} for p in job_dir.iterdir()):
                return False
            shutil.rmtree(job_dir)
    except FolderLocked:
        return False
    for parent in job_dir.parents:  # only inside the results root, and only empty folders
        if parent == root or root not in parent.parents:
            break
        try:
            parent.rmdir()
        except OSError:  # not empty (other results) or already gone
            break
    return True


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except BaseException as err:
        log_job_error(err)  # with its traceback, into the job's log; Hydra shows the message on stderr
        hc = HydraConfig.get()
        if discard_job_dir(Path(hc.runtime.output_dir), Path(hc.runtime.cwd) / hc.sweep.dir,
                           {hc.output_subdir or "", f"{hc.job.name}.log"}):
            log.info("removed %s: the job failed before writing anything", hc.runtime.output_dir)
        raise for_hydra(err) from err  # a user error: its message, without a traceback


if __name__ == "__main__":
    try:  # a mistyped method or dataset option key: its message with the valid keys, before Hydra composes
        check_option_overrides(sys.argv[1:])
    except OptionError as err:
        sys.exit(str(err))
    main()
