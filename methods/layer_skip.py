"""Drafter `early_exit` (conf/method/layer_skip.yaml): self-speculation by layer skipping: the target's first
`exit_layer` layers, final norm and head draft (transformers' `assistant_early_exit`, LayerSkip's self-speculative
decoding); the full target verifies.

The draft is an early-exit view of the target (specbench.models.early_exit: shared weights, its own KV cache) in
the pair's draft role, so its calls and seconds are draft calls; the pair needs no draft model. Models trained for
early exit (e.g. facebook/layerskip-llama3.2-1B) draft well; on others acceptance is low. Equal to hf_assisted's
early exit token for token, candidates, matches and calls on transformers 5.24.0 (tests/test_draft_sources.py).
"""

from __future__ import annotations

from dataclasses import replace

from transformers import PreTrainedModel

from specbench.common.options import OptionError
from specbench.decoding.drafts import DraftSource
from specbench.decoding.method import Binding
from specbench.decoding.parts import DRAFTERS, Drafter, Needs, Shape, model_source
from specbench.decoding.state import Counted


@DRAFTERS.register("early_exit")
class EarlyExit(Drafter):
    """The target's first exit_layer layers (default: half of them) as the draft model."""

    needs = Needs(pair_draft=False)

    def __init__(self, exit_layer: int | None = None) -> None:
        self.exit_layer = exit_layer  # checked against the target's layers at bind (early_exit)

    def bind(self, binding: Binding, shape: Shape) -> Binding:
        """The early-exit view of the target in the draft role."""
        from specbench.models.early_exit import early_exit, exit_layers

        target = binding.models["target"]
        if not isinstance(target, PreTrainedModel):
            raise OptionError(f"method.exit_layer: an early-exit view copies the first layers of a transformers model; "
                              f"the target is a {type(target).__name__}")
        draft = early_exit(target, exit_layers(target) // 2 if self.exit_layer is None else self.exit_layer)
        return replace(binding, models={**binding.models, "draft": draft})

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        return model_source(states["draft"], shape, fixed_window)
