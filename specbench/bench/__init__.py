"""Benchmarks of the engine and the methods (a CLI, so it prints): `python -m specbench.bench SUBCOMMAND --help`.

One module per subcommand (engine and verify in `engine`; methods, batch, overhead, gpu, kit, rules), their shared
pieces in `common`, the command line in `cli`. What each measures: docs/gpu.md, "Engine benchmark" and "GPU and the
compiled path".
"""

from specbench.bench.cli import main, parser
from specbench.bench.common import dataset_prompts, load, smoke_prompts

__all__ = ["dataset_prompts", "load", "main", "parser", "smoke_prompts"]
