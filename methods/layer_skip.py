"""`layer_skip`: self-speculation by layer skipping: the target's first `exit_layer` layers, its final norm and its
head draft (transformers' `assistant_early_exit`, LayerSkip's self-speculative decoding); the full target verifies.

The draft model is an early-exit view of the target (specbench.models.early_exit: shared weights, its own KV
cache), in the pair's draft role, so its calls and seconds are draft calls; the pair needs no draft model.
Drafting is vanilla's: γ tokens per iteration, `rejection`, lossless. Models trained for early exit (e.g.
facebook/layerskip-llama3.2-1B) draft well; on other models the early layers' predictions are poor and
acceptance is low. Equal to hf_assisted's early exit token for token, candidates, matches and calls on transformers
5.24.0 (tests/test_draft_sources.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specbench.decoding.method import METHODS, Binding
from specbench.methods.vanilla import Vanilla


@METHODS.register("layer_skip")
class LayerSkip(Vanilla):
    """Vanilla γ / `rejection` with the target's first exit_layer layers (default: half of them) as the drafter."""

    name = "layer_skip"
    pair_draft = False

    def __init__(self, gamma: int = 5, exit_layer: int | None = None, rule: str = "rejection", **options: Any) -> None:
        super().__init__(gamma=gamma, rule=rule, **options)
        self.exit_layer = exit_layer

    def bind(self, binding: Binding) -> None:
        """Bind with the early-exit view of the target in the draft role."""
        from specbench.models.early_exit import early_exit, exit_layers

        target = binding.models["target"]
        draft = early_exit(target, exit_layers(target) // 2 if self.exit_layer is None else self.exit_layer)
        super().bind(replace(binding, models={**binding.models, "draft": draft}))
