"""Drafter `medusa`: Medusa-1's heads proposing Medusa's tree (conf/method/medusa.yaml), verified in one target forward.

At the last committed position's state, head i ranks the candidates of the token i positions after the committed
ones (specbench.models.medusa); the tree's root paths list sibling ranks as Medusa's `medusa_choices` do ([0] the
first head's most likely token, [0, 1] the second head's second most likely after it, ...): a node at depth d
gets its children from head d + 1, whatever its own token (specbench.decoding.head_drafts). Children are
distinct, so the `rejection` rule verifies them by recursive rejection with one-hot q, which keeps the target's
distribution (Medusa's own typical acceptance does not; it is not offered). `head`: a finished
`task=distill task.kind=medusa` folder, a folder in Medusa's release layout, or a hub id. The shape is a static
tree (`paths` or `branching`); one row, eager path.
"""

from __future__ import annotations

from dataclasses import replace

from specbench.decoding.drafts import DraftSource
from specbench.decoding.head_drafts import DraftHead, MedusaDraft, head_state
from specbench.decoding.method import Binding
from specbench.common.options import OptionError
from specbench.decoding.parts import DRAFTERS, Shape
from specbench.methods.eagle3 import Head
from specbench.decoding.state import Counted
from specbench.models.medusa import MedusaHeads


@DRAFTERS.register("medusa")
class Medusa(Head):
    """Medusa heads: a static tree whose depth d children come from head d + 1."""

    distill_kind = "medusa"
    needs = replace(Head.needs, proposes=("static_tree",))

    def bind(self, binding: Binding, shape: Shape) -> Binding:
        """The loaded heads in the draft role; a tree deeper than the heads are many is refused."""
        binding = super().bind(binding, shape)
        draft = binding.models["draft"]
        module = draft.head if isinstance(draft, DraftHead) else draft
        if not isinstance(module, MedusaHeads):
            raise OptionError(f"method.head: {self.head!r} loaded a {type(module).__name__}, not Medusa heads")
        grower = shape.grower()
        assert grower is not None  # the plan: a static tree
        heads, depth = module.config.num_heads, grower.depth
        if depth > heads:
            raise OptionError(f"method.paths / method.branching: the tree is {depth} deep but the head {self.head!r} "
                              f"has {heads} heads (one per depth)")
        return binding

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        return MedusaDraft(head_state(states["draft"]), shape.grower())
