"""Shared fixtures: the real Hydra config, composed and shrunk for CPU tests (helpers live in tests/helpers.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import pytest
import torch
from omegaconf import OmegaConf

from helpers import compose_cfg, require_data, small


@pytest.fixture
def local_data() -> Path:
    """The local data folder DATA (see helpers.require_data); a module uses it with pytest.mark.usefixtures("local_data")."""
    return require_data()


@pytest.fixture(scope="session")
def tiny_pair():
    """The tiny_random pair as configured in conf/pair/tiny_random.yaml."""
    from specbench.models.pairs import load_pair

    cfg = compose_cfg("pair=tiny_random")
    return load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device("cpu"))


@pytest.fixture(scope="session")
def trained_drafter(tmp_path_factory) -> Callable[..., Path]:
    """trained_drafter(kind, *pair_overrides): the folder of a two-step `task=distill task.kind=<kind>` run
    on tiny_random (with the overrides) from 8 verifier samples of 16 tokens; each is trained once a session."""
    from specbench.runs.runner import run

    @functools.cache
    def synth(*pair: str) -> Path:
        out = tmp_path_factory.mktemp("synth")
        run(small(*pair, "task=synth", "task.n=8", "task.max_new_tokens=16", "task.batch_size=4"), out)
        return out

    @functools.cache
    def drafter(kind: str, *pair: str) -> Path:
        out = tmp_path_factory.mktemp(kind)
        run(small(*pair, "task=distill", f"task.kind={kind}", f"task.data={synth(*pair)}", "task.val_n=2",
                  "task.max_steps=2", "task.batch_size=2"), out)
        return out

    return drafter
