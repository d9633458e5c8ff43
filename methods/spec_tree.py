"""Shape `static_tree`: a fixed tree of drafts verified in one target forward (SpecInfer, Medusa's and EAGLE's
published trees; conf/method/spec_tree.yaml grows it from the draft model, conf/method/medusa.yaml from Medusa heads).

The shape is a config value: `branching` [k_1..k_D] gives every node at depth d - 1 its k_d most likely children
(the root is depth 0), or `paths` lists the root paths as Medusa and EAGLE publish them, each a list of sibling
ranks ([0] the root's most likely child, [0, 1] that child's second, ...; every prefix of a path must be listed
too). Children are ranked by the draft distribution at their parent (specbench.decoding.tree_drafts), so under
greedy decoding the rank-0 chain is vanilla's chain and the accepted path is the longest one the target's argmax
follows; under sampling the rule verifies the distinct children by recursive rejection with one-hot q, which keeps
the target distribution (specbench.decoding.trees). Its budget is the number of nodes verified per call. Trees
are verified one row at a time on the eager path: batch_size 1, engine.compile=false (specbench.decoding.parts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specbench.common.options import OptionError, integer
from specbench.decoding.parts import SHAPES, Shape
from specbench.decoding.tree_drafts import MAX_NODES, Grown, closed, ranked


def branching_paths(branching: list[int]) -> list[tuple[int, ...]]:
    """The root paths of the tree whose every node at depth d - 1 has branching[d-1] children, by depth."""
    level: list[tuple[int, ...]] = [()]
    out: list[tuple[int, ...]] = []
    for k in branching:
        level = [p + (r,) for p in level for r in range(k)]
        out += level
    return out


def check_paths(paths: Any) -> list[tuple[int, ...]]:
    """Root paths as tuples, sorted by depth (stable); each a non-empty list of ranks >= 0 whose prefixes are listed."""
    if not isinstance(paths, (list, tuple)) or not paths:
        raise OptionError(f"method.paths must be a non-empty list of root paths such as [[0], [1], [0, 0]], got "
                          f"{paths!r}")
    out = []
    for p in paths:
        if not isinstance(p, (list, tuple)) or not p or any(type(r) is not int or r < 0 for r in p):
            raise OptionError(f"method.paths: each path is a non-empty list of sibling ranks >= 0, got {p!r}")
        out.append(tuple(p))
    given = set(out)
    for p in out:
        if p[:-1] and p[:-1] not in given:
            raise OptionError(f"method.paths: {list(p)} is listed but its parent path {list(p[:-1])} is not")
    if len(given) < len(out):
        raise OptionError("method.paths lists a path twice")
    return sorted(out, key=len)


class StaticShape:
    """The grower of a fixed set of root paths."""

    def __init__(self, paths: list[tuple[int, ...]]) -> None:
        self.paths = paths
        self.depth = max(len(p) for p in paths)
        self.kids: dict[tuple[int, ...], list[int]] = {}
        for p in paths:
            self.kids.setdefault(p[:-1], []).append(p[-1])

    def children(self, t: Grown, node: int, q: torch.Tensor) -> list[tuple[int, int]]:
        """The listed ranks under this node's path: the rank-r most likely token of q [V] for each r."""
        ranks = self.kids.get(t.path(node) if node >= 0 else (), [])
        top = ranked(q, max(ranks) + 1) if ranks else []
        return [(r, top[r]) for r in ranks if r < len(top)]

    def expand(self, t: Grown, new: list[int]) -> list[int]:
        return [j for j in new if t.path(j) in self.kids]

    def select(self, t: Grown, cap: int) -> list[int]:
        return closed(t, list(range(min(cap, len(t.tokens)))))


@SHAPES.register("static_tree")
class StaticTree(Shape):
    """A fixed tree: `branching` children per depth, or `paths` (root paths of sibling ranks) when set."""

    name = "static_tree"
    kind = "grown"

    def __init__(self, branching: Sequence[int] | None = (2, 2, 1, 1, 1), paths: Sequence[Sequence[int]] | None = None
                 ) -> None:
        if paths is None:
            if not isinstance(branching, (list, tuple)) or not branching:
                raise OptionError(f"method.branching must be a non-empty list of children per depth such as "
                                  f"[2, 2, 1], or set method.paths; got {branching!r}")
            paths = branching_paths([integer(k, "method.branching", low=1) for k in branching])
        if len(paths) > MAX_NODES:
            raise OptionError(f"method.branching / method.paths: {len(paths)} nodes per tree; at most {MAX_NODES} are "
                              "verified per call")
        self.static = StaticShape(check_paths(paths))

    def grower(self) -> StaticShape:
        return self.static

    def budget(self, window: int) -> int:
        """Nodes verified per target call: the tree's."""
        return len(self.static.paths)

    def state(self) -> dict[str, float]:
        return {"nodes": len(self.static.paths), "depth": self.static.depth}
