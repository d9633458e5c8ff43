"""`medusa`: Medusa-1's heads proposing Medusa's tree, verified in one target forward.

At the last committed position's state, head i ranks the candidates of the token i positions after the committed
ones (specbench.models.medusa); the tree's root paths list sibling ranks as Medusa's `medusa_choices` do ([0] the
first head's most likely token, [0, 1] the second head's second most likely after it, ...): a node at depth d
gets its children from head d + 1, whatever its own token (specbench.decoding.head_drafts). Children are
distinct, so the `rejection` rule verifies them by recursive rejection with one-hot q, which keeps the target's
distribution (Medusa's own typical acceptance does not; it is not offered). `head`: a finished
`task=distill task.kind=medusa` folder, a folder in Medusa's release layout, or a hub id. One row, eager path.
"""

from __future__ import annotations

from typing import Any

from specbench.decoding.head_drafts import MedusaDraft
from specbench.decoding.method import METHODS, Binding, Method, option_error
from specbench.methods.eagle3 import Dependent
from specbench.methods.spec_tree import SpecTree, refuse_tree_models


@METHODS.register("medusa")
class Medusa(Dependent, SpecTree):
    """Medusa's tree (`paths`, or `branching` children per depth) from Medusa heads (`head`)."""

    name = "medusa"
    kind = "medusa"

    def __init__(self, branching: list[int] | None = (3, 2, 2, 1), paths: list[list[int]] | None = None,
                 rule: str = "rejection", head: Any = None, **options: Any) -> None:
        super().__init__(branching=branching, paths=paths, rule=rule, **options)
        self.kind = "medusa"
        self.head = self.check_head(head)

    def bind(self, binding: Binding) -> None:
        self.steered = None
        binding = self.bind_head(binding, self.head)
        heads = binding.models["draft"].head.config.num_heads
        if self.shape.depth > heads:
            raise option_error(self.name, f"method.paths / method.branching: the tree is {self.shape.depth} deep but "
                                          f"the head {self.head!r} has {heads} heads (one per depth)")
        Method.bind(self, binding)
        refuse_tree_models(self.name, binding, ("target",))

    def draft_source(self, states: dict[str, Any]) -> MedusaDraft:
        self.source = MedusaDraft(states["draft"], self.grower())
        return self.source
