"""Shape `dynamic_tree`: EAGLE-2's dynamic tree of drafts (Li et al. 2024, "EAGLE-2: Faster Inference of Language
Models with Dynamic Draft Trees"), verified in one target forward (conf/method/dyn_tree.yaml grows it from the draft
model, conf/method/eagle3_tree.yaml from an EAGLE-3 head).

A node's score is its cumulative draft log-probability, sum over its root path of log q(x) (q at each parent).
Expansion: the root's `top_k` most likely children form depth 1; at each depth d = 2..`depth` the `top_k` nodes of
depth d - 1 with the highest scores are fed to the draft in one forward and each gets its `top_k` most likely
children. Reranking: of all the nodes grown, the `total_nodes` with the highest scores are verified (a child
never scores above its parent, since log q <= 0, so the best nodes form a tree). Children are distinct and chosen
deterministically from q, so the `rejection` rule verifies them by recursive rejection with one-hot q (lossless);
greedy decoding follows the target's argmax. One row, eager path, as every tree (specbench.decoding.parts).
"""

from __future__ import annotations

import torch

from specbench.common.options import integer
from specbench.decoding.parts import SHAPES, Shape
from specbench.decoding.tree_drafts import MAX_NODES, Grown, closed, ranked


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


@SHAPES.register("dynamic_tree")
class DynamicTree(Shape):
    """EAGLE-2's dynamic tree: `depth`, `top_k`, `total_nodes`."""

    name = "dynamic_tree"
    kind = "grown"

    def __init__(self, depth: int = 5, top_k: int = 4, total_nodes: int = 16) -> None:
        self.dynamic = DynamicShape(integer(depth, "method.depth", low=1, high=MAX_DEPTH),
                                    integer(top_k, "method.top_k", low=1, high=MAX_TOP_K),
                                    integer(total_nodes, "method.total_nodes", low=1, high=MAX_NODES))

    def grower(self) -> DynamicShape:
        return self.dynamic

    def budget(self, window: int) -> int:
        """Nodes verified per target call: total_nodes."""
        return self.dynamic.total

    def state(self) -> dict[str, float]:
        return {"nodes": self.dynamic.total, "depth": self.dynamic.depth}
