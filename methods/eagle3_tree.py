"""`eagle3_tree`: EAGLE-3's head growing EAGLE-2's dynamic tree (EAGLE-3 as published: its head with EAGLE-2's
draft tree), verified in one target forward.

Growth and reranking are dyn_tree's (specbench.methods.dyn_tree: expand the top_k nodes of best cumulative draft
log-probability per depth, verify the total_nodes best); each depth's nodes are one head forward with tree attention
over the head's cache (specbench.decoding.head_drafts). Children are distinct and ranked by q, so the `rejection`
rule verifies them by recursive rejection with one-hot q (lossless). The head as `eagle3`'s; one row, eager path.
"""

from __future__ import annotations

from typing import Any

from specbench.decoding.head_drafts import Eagle3Draft
from specbench.decoding.method import METHODS, Binding, Method
from specbench.methods.dyn_tree import DynTree
from specbench.methods.spec_tree import refuse_tree_models
from specbench.methods.eagle3 import Dependent


@METHODS.register("eagle3_tree")
class Eagle3Tree(Dependent, DynTree):
    """EAGLE-2's dynamic tree (depth, top_k, total_nodes) from an EAGLE-3 head (`head`)."""

    name = "eagle3_tree"
    kind = "eagle3"

    def __init__(self, depth: int = 5, top_k: int = 4, total_nodes: int = 16, rule: str = "rejection",
                 head: Any = None, **options: Any) -> None:
        super().__init__(depth=depth, top_k=top_k, total_nodes=total_nodes, rule=rule, **options)
        self.kind = "eagle3"
        self.head = self.check_head(head)

    def bind(self, binding: Binding) -> None:
        self.steered = None
        Method.bind(self, self.bind_head(binding, self.head))
        refuse_tree_models(self.name, self.bound, ("target",))

    def draft_source(self, states: dict[str, Any]) -> Eagle3Draft:
        self.source = Eagle3Draft(states["draft"], self.grower())
        return self.source
