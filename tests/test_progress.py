"""Progress bars (rate and ETA) on a terminal, nothing in non-interactive output: examples, toy training, sweeps.

A terminal is stood in for by a text buffer whose isatty() is True (what tqdm checks); the
non-interactive case is pytest's captured stderr, as for output sent to a file or a SLURM log.
"""

import io
import pickle
import re
import sys
import time

import pytest
from transformers.utils import logging as hf_logging

from helpers import compose_cfg, small
from specbench.models import toy
from specbench.runs.runner import run
from specbench.runs.slurm import SweepProgress, sweep_jobs

RATE_ETA = r"\[\d\d:\d\d<\d\d:\d\d, +[\d.]+(?:{unit}/s|s/{unit})[,\]]"  # tqdm: [elapsed<remaining, rate(, postfix)]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Returns a function that makes sys.stderr a terminal for the rest of the test (set in the test's body:
    pytest's capture resets sys.stderr between a fixture's setup and the test call)."""

    def make() -> Terminal:
        term = Terminal()
        monkeypatch.setattr(sys, "stderr", term)
        return term

    yield make
    hf_logging.enable_progress_bar()  # what the runner may have switched off for transformers


def bar_lines(text: str) -> list[str]:
    return [s for s in re.split(r"[\r\n]", text) if "%|" in s]


def test_examples_bar_on_a_terminal_only(tmp_path, terminal):
    job = ["limit=3", "decode.max_new_tokens=4", "progress=auto"]
    term = terminal()
    run(small(*job), tmp_path / "tty")
    last = bar_lines(term.getvalue())[-1]
    assert last.startswith("vanilla: 100%") and "3/3" in last and re.search(RATE_ETA.format(unit="ex"), last), last
    sys.stderr = io.StringIO()  # a file or a pipe: isatty() is False
    run(small(*job), tmp_path / "pipe")
    assert sys.stderr.getvalue() == ""  # no bar, and no transformers bars either
    assert not hf_logging.is_progress_bar_enabled()
    terminal()
    run(small(*job[:-1], "progress=false"), tmp_path / "off")  # progress=false: no bar even on a terminal
    assert bar_lines(sys.stderr.getvalue()) == []
    sys.stderr = io.StringIO()
    run(small(*job[:-1], "progress=true"), tmp_path / "forced")  # progress=true: a bar even in a log
    assert bar_lines(sys.stderr.getvalue())[-1].startswith("vanilla: 100%")


def test_toy_training_bar_on_a_terminal_only(terminal):
    tok = toy.train_tokenizer(0, 300, 200)
    arch = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1}
    train = {"steps": {"draft": 3}, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "weight_decay": 0.0}
    term = terminal()
    toy.train_model("draft", arch, tok, train, 0)
    last = bar_lines(term.getvalue())[-1]
    assert last.startswith("training toy draft: 100%") and re.search(RATE_ETA.format(unit="step"), last), last
    sys.stderr = io.StringIO()
    toy.train_model("draft", arch, tok, train, 0)
    assert sys.stderr.getvalue() == ""


def test_sweep_bar_counts_jobs_on_a_terminal_only(terminal, tmp_path):
    cfg = compose_cfg("experiment=adasd_table1")
    n = len(sweep_jobs(cfg))
    term = terminal()
    cb = SweepProgress()
    cb.on_multirun_start(cfg)
    assert pickle.loads(pickle.dumps(cb))._bar is None  # submitit pickles callbacks: the bar stays here
    for _ in range(n):
        cb.on_job_end(cfg, None)
    cb.on_multirun_end(cfg)
    last = bar_lines(term.getvalue())[-1]
    assert last.startswith("sweep: 100%") and f"{n}/{n}" in last and re.search(RATE_ETA.format(unit="job"), last)
    sys.stderr = io.StringIO()
    cb = SweepProgress()
    cb.on_multirun_start(cfg)
    cb.on_job_end(cfg, None)
    cb.on_multirun_end(cfg)
    assert sys.stderr.getvalue() == ""


def test_sweep_bar_follows_submitit_result_files(terminal, tmp_path):
    """With a submitit launcher jobs end elsewhere: the bar counts the result files they leave."""
    cfg = compose_cfg("experiment=sd2_table5", "hydra/launcher=local", f"hydra.sweep.dir={tmp_path}")
    term = terminal()
    cb = SweepProgress(poll_s=0.02)
    cb.on_multirun_start(cfg)
    (tmp_path / ".submitit/123").mkdir(parents=True)
    (tmp_path / ".submitit/123/123_0_result.pkl").write_bytes(b"x")
    for _ in range(500):
        if cb._bar.n == 1:
            break
        time.sleep(0.01)
    assert cb._bar.n == 1
    cb.on_multirun_end(cfg)
    assert bar_lines(term.getvalue())[-1].startswith("sweep: 100%")
