"""The only entry point: python run.py [overrides]; python run.py -m ... for sweeps."""

import hydra
from omegaconf import DictConfig

from specbench.runner import run


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
