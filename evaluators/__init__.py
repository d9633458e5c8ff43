"""Benchmarks, one file each, registered in `specbench.data.DATASETS` under their config name."""

from evaluators import alpaca, gsm8k, humaneval, mmlu, mt_bench, smoke, spec_bench, ultrachat, xsum  # noqa: F401
from evaluators import toy_arith  # noqa: F401
