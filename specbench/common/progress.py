"""The `progress` config key (auto | true | false): every progress bar, and the switch for transformers' own.

Free of torch and transformers imports at import time: the sweep callback (specbench.runs.slurm) uses it cheaply.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


def bar_disabled(progress: Any) -> bool | None:
    """tqdm's `disable`: auto (or None) -> None (bars on a terminal only, none in logs), else not progress."""
    return None if progress in (None, "auto") else not bool(progress)


def progress_bar(iterable: Iterable | None = None, progress: Any = "auto", **kwargs: Any) -> Any:
    """A tqdm bar over `iterable` (or of kwargs' `total`) shown as `progress` says (bar_disabled)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=bar_disabled(progress), **kwargs)


def switch_progress(progress: Any) -> None:
    """Make transformers' own bars (loading and saving weights) follow `progress`; code that gets no
    config (the toy pair's training) follows them through library_progress."""
    from transformers.utils import logging as hf_logging

    disable = bar_disabled(progress)
    if disable or (disable is None and not sys.stderr.isatty()):
        hf_logging.disable_progress_bar()
    else:
        hf_logging.enable_progress_bar()


def library_progress() -> str | bool:
    """The `progress` value last set by switch_progress, read back from transformers: auto while its
    bars are on (a bar on a terminal only), else False."""
    from transformers.utils import logging as hf_logging

    return "auto" if hf_logging.is_progress_bar_enabled() else False
