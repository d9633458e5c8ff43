"""Drafter `eagle3`: EAGLE-3's head (specbench.models.eagle3) drafting a chain (the SD² paper's EAGLE-3*: EAGLE-3
restricted to chain drafting; conf/method/eagle3.yaml, γ = 8) or growing the shape's tree (EAGLE-3 as published:
its head with EAGLE-2's dynamic tree, conf/method/eagle3_tree.yaml), verified by the method's rule.

The head reads the target's states at three layers, handed over with each drafting request from the last verify
forward (no extra target call; specbench.decoding.head_drafts), and its own outputs while drafting. `head` is a
finished `task=distill task.kind=eagle3` folder, a folder in the EAGLE-3 release or `speculators` layout, or a hub
id (specbench.models.heads). The pair's draft model is not loaded. One row at a time, eager path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specbench.decoding.drafts import DraftSource
from specbench.decoding.head_drafts import DraftHead, Eagle3Draft, head_state
from specbench.decoding.method import Binding
from specbench.decoding.parts import DRAFTERS, Drafter, Needs, Shape
from specbench.decoding.state import Counted


class Head(Drafter):
    """A head drafting on the target's states (eagle3, medusa): checks `head` before any model loads, binds the
    loaded head in the draft role and reads the states of the layers it was trained on."""

    # the head replaces the pair's draft model and grows its tree over its own cache (the target's mask is checked)
    needs = Needs(pair_draft=False, reads_states=True, tree_role="")
    distill_kind = ""  # the task=distill task.kind (and head format) it loads

    def __init__(self, head: Any = None) -> None:
        from specbench.models.heads import check_head_source

        check_head_source(self.distill_kind, head, self.distill_kind)  # a hub id neither cached nor downloadable fails now
        self.head = head
        self.head_layers: tuple[int, ...] = ()

    def bind(self, binding: Binding, shape: Shape) -> Binding:
        """The binding with the loaded head in the draft role."""
        from specbench.models.heads import load_head

        module, self.head_layers, name, folder = load_head(self.head, binding, self.distill_kind)
        return replace(binding, models={**binding.models, "draft": DraftHead(module, name, folder)})

    @property
    def layers(self) -> tuple[int, ...]:
        return self.head_layers


@DRAFTERS.register("eagle3")
class Eagle3(Head):
    """EAGLE-3's head: chains x_i ~ q_i, or trees grown by the shape."""

    distill_kind = "eagle3"

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        return Eagle3Draft(head_state(states["draft"]), shape.grower())
