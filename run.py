"""The only entry point: python run.py [overrides]; python run.py -m ... for sweeps."""

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specbench.runs.layout import discard_job_dir  # also registers the resolvers conf/config.yaml's folders use
from specbench.runs.runner import run

log = logging.getLogger(__name__)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except BaseException:
        hc = HydraConfig.get()  # the error itself is reported by Hydra on stderr
        if discard_job_dir(Path(hc.runtime.output_dir), Path(hc.runtime.cwd) / cfg.paths.results,
                           {hc.output_subdir or "", f"{hc.job.name}.log"}):
            log.info("removed %s: the job failed before its first row", hc.runtime.output_dir)
        raise


if __name__ == "__main__":
    main()
