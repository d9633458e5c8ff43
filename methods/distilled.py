"""`distilled`: vanilla speculative decoding (γ = 8) with a drafter fine-tuned on the verifier's samples
(SD²'s "Distilled" row, after DistillSpec: KL(π_V || π_D) on verifier-generated data)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specbench.methods.vanilla import Vanilla
from specbench.decoding.method import METHODS, Binding


@METHODS.register("distilled")
class Distilled(Vanilla):
    """Vanilla γ / `rejection` with the drafter a `task=distill task.kind=distilled` run wrote to `drafter`."""

    name = "distilled"
    kind = "distilled"  # the task=distill task.kind whose folders this method loads
    steered = None  # sd2: the specbench.models.steering.SteeredDrafter on the loaded drafter

    def __init__(self, gamma: int = 8, rule: str = "rejection", drafter: str | None = None, **options: Any) -> None:
        super().__init__(gamma=gamma, rule=rule, **options)
        self.folder = drafter

    def bind(self, binding: Binding) -> None:
        """Bind with the trained drafter in the draft role (and for sd2 its steering, `steered`)."""
        from specbench.models.drafters import load_trained

        drafter, self.steered = load_trained(self.folder, binding.pair, self.kind)
        super().bind(replace(binding, models={**binding.models, "draft": drafter}))
