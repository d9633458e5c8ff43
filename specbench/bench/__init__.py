"""Benchmarks of the engine and the methods (a CLI, so it prints): `python -m specbench.bench SUBCOMMAND --help`.

One module per subcommand, their shared pieces in `common`, the command line in `cli`.

`engine` measures, on one pair and the first N prompts of a dataset (smoke by default) at temperature 0, for
`vanilla` (γ) and `ar` on the eager path and (unless --no-compile) the compiled one (engine.compile=true):
  (a) the median cost of single model calls (target 1 token, target γ+1 tokens, draft 1 token), per path;
  (b) engine overhead = 1 - (model-call seconds) / decode wall seconds, per engine;
  (c) throughput of each engine and of transformers' `generate(assistant_model=...)` with a constant schedule
      of the same γ and the confidence stop off, all interleaved per prompt (the order rotated), after a warm-up
      over every prompt (which builds the compiled graphs); every generation's token ids are checked against
      transformers' (exit status 1 if any differ);
  (d) vanilla's measured speedup over ar beside Leviathan et al.'s expected speedup for the measured acceptance
      rate and cost ratio, and the compiled / eager throughput ratios.

`verify` measures the target's verify cost against the number of drafted nodes verified: the median ms of one
forward of the root's token and w nodes after a cached prompt, the nodes fed as a chain (causal) and as a tree
(tree attention: a complete binary tree in breadth-first order, specbench.decoding.tree_state), each relative to
a one-token forward (ar's call, w = 0), for w in --nodes.

`methods` runs each method through the runner on one pair and dataset and prints the docs/design.md metric table.

`batch` runs `ar`, `vanilla`, `gammatune` and `adasd` on the toy pair at batch sizes 1..32, each (method,
batch size) as its own `python run.py` process (peak memory is per process), and prints per batch size and
method: tokens/s (total new tokens / total decode wall time), speedup over `ar` at the same batch size,
acceptance rate, τ and peak memory, then the batch size at which `vanilla` stops beating `ar` and the
throughput ratio ar(B=8) / ar(B=1).

`overhead` (specbench.bench.overhead) measures the engine's own share of the decode time (1 - model seconds / decode
seconds) and vanilla's tokens/s at batch sizes 1, 8, 32, 64, greedy and sampled, in one process.

`gpu` (specbench.bench.gpu) is the GPU characterisation in one command: random-weight pairs with real pairs' shapes
built on the GPU, per-call costs, `engine`'s figures eager and compiled against transformers, ar / vanilla / trees at
batch sizes, the CUDA test lane, into a markdown report written as it goes.
"""

from specbench.bench.cli import main, parser
from specbench.bench.common import dataset_prompts, load, smoke_prompts

__all__ = ["dataset_prompts", "load", "main", "parser", "smoke_prompts"]
