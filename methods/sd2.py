"""`sd2`: steered speculative decoding (SD², sd2.md section 3): chain drafting with γ = 8 and the
`rejection` rule, the drafter steered by the verifier's hidden states (specbench.models.steering).

After every verify the engine hands over the verifier's states at (3, L/2, L-2) (or the layers the
drafter was trained with) at the last accepted position, taken from the verify forward itself (no
extra target call); b_l = W_s^(l) W_hml [h; m; l] is computed once and biases every drafter MLP for
the whole next block. The first block of a generation is drafted before any verify and is not
steered. The rule and the verifier are unchanged, so the method is lossless.
"""

from __future__ import annotations

import torch

from specbench.methods.distilled import Distilled
from specbench.decoding.method import METHODS, Binding


@METHODS.register("sd2")
class SD2(Distilled):
    """Vanilla γ / `rejection` with a drafter and steering trained by `task=distill task.kind=sd2` (`drafter`)."""

    name = "sd2"
    kind = "sd2"

    def bind(self, binding: Binding) -> None:
        """Bind with the trained drafter, steered by the verifier's states at the layers it was trained with."""
        super().bind(binding)
        self.hidden_layers = self.steered.steering.layers

    def reset(self) -> None:
        if self.steered is not None:
            self.steered.clear()  # the first block is drafted before the verifier has run

    def observe_hidden(self, states: torch.Tensor) -> None:
        self.steered.set_block(states)
