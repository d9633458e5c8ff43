"""The `progress` config key (auto | true | false) as tqdm's `disable`, in one place for every bar.

Kept free of torch and transformers imports so that the sweep callback (specbench.runs.slurm) can use it
in Hydra's launching process cheaply.
"""

from __future__ import annotations

import sys
from typing import Any


def bar_disabled(progress: Any) -> bool | None:
    """tqdm's `disable`: auto (or None) -> None (bars on a terminal only, none in logs), else not progress."""
    return None if progress in (None, "auto") else not bool(progress)


def progress_bars(progress: Any) -> bool | None:
    """bar_disabled(progress), and transformers' own bars (loading and saving weights) and the toy pair's
    training bar switched to follow it."""
    from transformers.utils import logging as hf_logging

    disable = bar_disabled(progress)
    if disable or (disable is None and not sys.stderr.isatty()):
        hf_logging.disable_progress_bar()
    else:
        hf_logging.enable_progress_bar()
    return disable
