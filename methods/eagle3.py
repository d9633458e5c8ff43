"""`eagle3`: EAGLE-3's head drafting a chain (the SD² paper's EAGLE-3*: EAGLE-3 restricted to chain drafting),
γ = 8 tokens per iteration, verified by the `rejection` rule (lossless).

The head (specbench.models.eagle3) reads the target's states at three layers through the engine's verify forward
(no extra target call) and its own outputs while drafting (specbench.decoding.head_drafts). `head` is a finished
`task=distill task.kind=eagle3` folder, a folder in the EAGLE-3 release or `speculators` layout, or a hub id
(specbench.models.heads). The pair's draft model is not loaded. One row at a time, eager path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from specbench.common.options import OptionError
from specbench.decoding.head_drafts import DraftHead, Eagle3Draft
from specbench.decoding.method import METHODS, Binding
from specbench.methods.vanilla import Vanilla


class Dependent:
    """A method drafting with a head on the target's states (eagle3, eagle3_tree, medusa): binds the head in the
    draft role, asks for the states it reads and hands them to its proposer."""

    name: str
    kind: str  # the head's kind: eagle3 | medusa
    pair_draft = False  # the head replaces the pair's draft model
    source: Any = None  # the proposer of the current generation

    def check_head(self, head: Any) -> Any:
        """Fail now (before any model loads) when `head` is a hub id that is neither cached nor downloadable."""
        from specbench.models.heads import check_head_source

        check_head_source(self.name, head, self.kind)
        return head

    def bind_head(self, binding: Binding, head: Any) -> Binding:
        """The binding with the loaded head in the draft role; hidden_layers = the target states it reads."""
        from specbench.models.heads import load_head

        module, self.hidden_layers, name, folder = load_head(head, binding, self.kind)
        return replace(binding, models={**binding.models, "draft": DraftHead(module, name, folder)})

    def observe_hidden(self, states: torch.Tensor) -> None:
        """The target's states [len(layers), m, H] at the positions the last verify committed."""
        self.source.observe(states)

    def check_batch(self, batch_size: int) -> None:
        if batch_size > 1:
            raise OptionError(f"method {self.name!r} drafts with a head that keeps one row's states and cache; got "
                              f"batch_size={batch_size}: set batch_size=1")

    def check_compile(self) -> None:
        raise OptionError(f"method {self.name!r} reads the target's hidden states, which the compiled decode path does "
                          "not return: set engine.compile=false")


@METHODS.register("eagle3")
class Eagle3(Dependent, Vanilla):
    """γ drafts per iteration from an EAGLE-3 head (`head`), `rejection` by default."""

    name = "eagle3"
    kind = "eagle3"

    def __init__(self, gamma: int = 8, rule: str = "rejection", head: Any = None, **options: Any) -> None:
        super().__init__(gamma=gamma, rule=rule, **options)
        self.head = self.check_head(head)

    def bind(self, binding: Binding) -> None:
        super().bind(self.bind_head(binding, self.head))

    def draft_source(self, states: dict[str, Any]) -> Eagle3Draft:
        self.source = Eagle3Draft(states["draft"])
        return self.source
