"""Shared fixtures: the real Hydra config, composed and shrunk for CPU tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub
os.environ.setdefault("WANDB_MODE", "disabled")
torch.set_num_threads(1)  # tiny models: thread start-up costs more than it saves on 2 cores

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
# The local benchmark copies the tests read: $SPECBENCH_TEST_DATA, by default ../shared/data beside the clone.
DATA = Path(os.environ.get("SPECBENCH_TEST_DATA") or ROOT.parent / "shared" / "data")


def require_data(*parts: str) -> Path:
    """DATA/<parts>; a test that needs it is skipped when it is missing, and fails instead under CI (CI set)."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        message = f"local benchmark data {path} not found; set SPECBENCH_TEST_DATA to the folder of local copies"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{message} (CI runs every test that reads it)", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture
def local_data() -> Path:
    """The local data folder DATA (see require_data); a module uses it with pytest.mark.usefixtures("local_data")."""
    return require_data()


def compose_cfg(*overrides: str) -> DictConfig:
    """conf/config.yaml composed with overrides (hydra node included, as under @hydra.main)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def small(*overrides: str) -> DictConfig:
    """The default config shrunk for tests: tiny_random on smoke, CPU, no warm-up, no progress bar."""
    return compose_cfg("pair=tiny_random", "dataset=smoke", "device=cpu", "warmup=0", "progress=false", *overrides)


@pytest.fixture(scope="session")
def tiny_pair():
    """The tiny_random pair as configured in conf/pair/tiny_random.yaml."""
    from specbench.models.pairs import load_pair

    cfg = compose_cfg("pair=tiny_random")
    return load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device("cpu"))
