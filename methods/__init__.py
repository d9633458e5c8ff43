"""Decoding methods, one file each, registered in `specbench.method.METHODS` under their config name."""

from specbench.method import METHODS

from methods import ar, draft_only, vanilla  # noqa: F401  (import registers)
from methods import adasd  # noqa: F401  (import registers)
from methods import gammatune  # noqa: F401,E402
from methods import confidence, heuristic, hf_assisted  # noqa: F401,E402  (import registers)
from methods import distilled, sd2  # noqa: F401,E402  (import registers)

__all__ = ["METHODS"]
