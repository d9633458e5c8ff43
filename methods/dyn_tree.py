"""`dyn_tree`: EAGLE-2's dynamic tree of drafts (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees"), grown from the draft model and verified in one target forward.

A node's score is its cumulative draft log-probability, sum over its root path of log q(x) (q at each parent).
Expansion: the root's `top_k` most likely children form depth 1; at each depth d = 2..`depth` the `top_k` nodes of
depth d - 1 with the highest scores are fed to the draft in one forward and each gets its `top_k` most likely
children. Reranking: of all the nodes grown, the `total_nodes` with the highest scores are verified (a child
never scores above its parent, since log q <= 0, so the best nodes form a tree). Children are distinct and chosen
deterministically from q, so the `rejection` rule verifies them by recursive rejection with one-hot q (lossless);
greedy decoding follows the target's argmax. Drafter options, batch size and compile as `spec_tree`.
"""

from __future__ import annotations

from typing import Any

import torch

from specbench.common.options import integer
from specbench.decoding.method import METHODS, check_option
from specbench.decoding.tree_drafts import MAX_NODES, Grown, closed, ranked
from specbench.methods.spec_tree import SpecTree


MAX_DEPTH, MAX_TOP_K = 64, 32  # a tree grows top_k + (depth - 1) top_k^2 nodes before the best are kept


class DynamicShape:
    """EAGLE-2's grower: expand the top_k best-scored nodes per depth, verify the total best overall."""

    def __init__(self, depth: int, top_k: int, total: int) -> None:
        self.depth, self.top_k, self.total = depth, top_k, total

    def children(self, t: Grown, node: int, q: torch.Tensor) -> list[tuple[int, int]]:
        return list(enumerate(ranked(q, self.top_k)))

    def expand(self, t: Grown, new: list[int]) -> list[int]:
        return sorted(sorted(new, key=lambda j: (-t.scores[j], j))[: self.top_k])

    def select(self, t: Grown, cap: int) -> list[int]:
        best = sorted(range(len(t.tokens)), key=lambda j: (-t.scores[j], j))[: min(self.total, cap)]
        return closed(t, best)


@METHODS.register("dyn_tree")
class DynTree(SpecTree):
    """EAGLE-2's dynamic tree from the draft model (or a trained drafter): depth, top_k, total_nodes."""

    name = "dyn_tree"

    def __init__(self, depth: int = 5, top_k: int = 4, total_nodes: int = 16, rule: str = "rejection",
                 drafter: str | None = None, drafter_kind: str = "distilled", **options: Any) -> None:
        super().__init__(branching=[1], rule=rule, drafter=drafter, drafter_kind=drafter_kind, **options)
        self.dynamic = DynamicShape(check_option(self.name, integer, depth, "depth", low=1, high=MAX_DEPTH),
                                    check_option(self.name, integer, top_k, "top_k", low=1, high=MAX_TOP_K),
                                    check_option(self.name, integer, total_nodes, "total_nodes", low=1,
                                                 high=MAX_NODES))

    def grower(self) -> DynamicShape:
        return self.dynamic

    def window(self) -> int:
        return self.dynamic.total
