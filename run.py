"""The only entry point: python run.py [overrides]; python run.py -m ... for sweeps."""

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specbench.common.errors import UserError
from specbench.runs.layout import discard_job_dir  # also registers the resolvers conf/config.yaml's folders use
from specbench.runs.overrides import check_option_overrides
from specbench.runs.runner import run
from specbench.runs.sweep import for_hydra, log_job_error

log = logging.getLogger(__name__)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except BaseException as err:
        log_job_error(err)  # with its traceback, into the job's log; Hydra shows the message on stderr
        hc = HydraConfig.get()
        if discard_job_dir(Path(hc.runtime.output_dir), Path(hc.runtime.cwd) / cfg.paths.results,
                           {hc.output_subdir or "", f"{hc.job.name}.log"}):
            log.info("removed %s: the job failed before its first row", hc.runtime.output_dir)
        raise for_hydra(err) from err  # a user error: its message, without a traceback


if __name__ == "__main__":
    try:  # a mistyped method or dataset option key: its message with the valid keys, before Hydra composes
        sys.argv[1:] = check_option_overrides(sys.argv[1:])  # method.<key> overrides as ++method.<key>
    except UserError as err:  # also a plugin file that does not import, named with its line
        sys.exit(str(err))
    main()
