"""Decoding methods, one file each, registered in `specbench.method.METHODS` under their config name."""

from specbench.method import METHODS

from methods import ar, draft_only, vanilla  # noqa: F401  (import registers)

__all__ = ["METHODS"]
