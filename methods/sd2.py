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
from specbench.decoding.method import METHODS, Binding, Method


@METHODS.register("sd2")
class SD2(Distilled):
    """Vanilla γ / `rejection` with a drafter and steering trained by `task=distill task.kind=sd2` (`drafter`)."""

    name = "sd2"
    kind = "sd2"

    def bind(self, binding: Binding) -> None:
        """Bind with the trained drafter, steered by the verifier's states at the layers it was trained with."""
        super().bind(binding)
        self.hidden_layers = self.steered.steering.layers

    def check_compile(self) -> None:
        """Refused: the steering needs the verifier's hidden states and the drafter's hooks, which the compiled
        forwards do not carry."""
        from specbench.common.options import OptionError

        raise OptionError("method 'sd2' steers its drafter with the verifier's hidden states through forward hooks, "
                          "which the compiled decode path does not carry: set engine.compile=false")

    def reset(self) -> None:
        self.states: torch.Tensor | None = None  # the first block is drafted before the verifier has run
        if self.steered is not None:
            self.steered.clear()

    def observe_hidden(self, states: torch.Tensor) -> None:
        """Keep this row's verifier states [3, H_v] at its last committed position for its next block."""
        self.states = states[:, -1]

    def before_draft(self, rows: list[Method]) -> None:
        """Steer each row's next block from its own states: biases [B, 1, I_D] per drafter layer (g = 0, so
        b = 0, for a row not verified yet); no hook output at all while no row has been verified."""
        if self.steered is None:
            return
        states = [m.states for m in rows]
        if all(s is None for s in states):
            self.steered.clear()
            return
        ref = next(s for s in states if s is not None)
        self.steered.set_block(torch.stack([ref.new_zeros(ref.shape) if s is None else s for s in states]))
