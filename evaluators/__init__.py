"""Benchmarks, one file each, registered in `specbench.data.DATASETS` under their config name."""

from evaluators import smoke  # noqa: F401  (import registers)
