"""Shared fixtures: the real Hydra config, composed and shrunk for CPU tests (helpers live in tests/helpers.py)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from helpers import compose_cfg


@pytest.fixture(scope="session")
def tiny_pair():
    """The tiny_random pair as configured in conf/pair/tiny_random.yaml."""
    from specbench.models.pairs import load_pair

    cfg = compose_cfg("pair=tiny_random")
    return load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device("cpu"))

