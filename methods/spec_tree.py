"""`spec_tree`: a static tree of drafts from the draft model, verified in one target forward (SpecInfer, Medusa's and
EAGLE's published trees).

The shape is a config value: `branching` [k_1..k_D] gives every node at depth d - 1 its k_d most likely children
(the root is depth 0), or `paths` lists the root paths as Medusa and EAGLE publish them, each a list of sibling
ranks ([0] the root's most likely child, [0, 1] that child's second, ...; every prefix of a path must be listed
too). Children are ranked by the draft distribution at their parent (specbench.decoding.tree_drafts), so under
greedy decoding the rank-0 chain is vanilla's chain and the accepted path is the longest one the target's argmax
follows; under sampling the rule verifies the distinct children by recursive rejection with one-hot q, which keeps
the target distribution (specbench.decoding.trees). Its window() is the number of nodes verified per call.
The drafter is the pair's draft, or a trained one (`drafter`: a task=distill folder of kind `drafter_kind`,
distilled or sd2; an sd2 drafter is steered by the verifier's hidden states as in `sd2`). Trees are verified one
row at a time on the eager path: batch_size 1, engine.compile=false.
"""

from __future__ import annotations

from typing import Any

import torch

from specbench.common.options import OptionError
from specbench.decoding import trees
from specbench.decoding.method import METHODS, Binding, Method, check_gamma, option_error
from specbench.decoding.tree_drafts import MAX_NODES, Grown, TreeDraft, closed, ranked
from specbench.methods.distilled import Distilled
from specbench.methods.sd2 import SD2

KINDS = ("distilled", "sd2")


def refuse_tree_models(name: str, binding: Binding, roles: tuple[str, ...]) -> None:
    """Before decoding: the models that verify (target) or grow (draft) a tree must take a tree attention mask."""
    from specbench.decoding.tree_state import tree_mask_refusal

    for role in roles:
        model = binding.models.get(role)
        why = tree_mask_refusal(model) if model is not None else None
        if why is not None:
            label = getattr(model, "name_or_path", "") or role
            raise OptionError(f"method {name!r} verifies trees with tree attention over the {role} model {label!r}, "
                              f"but {why}; use a chain method (vanilla, eagle3) with this pair")


def branching_paths(branching: list[int]) -> list[tuple[int, ...]]:
    """The root paths of the tree whose every node at depth d - 1 has branching[d-1] children, by depth."""
    level: list[tuple[int, ...]] = [()]
    out: list[tuple[int, ...]] = []
    for k in branching:
        level = [p + (r,) for p in level for r in range(k)]
        out += level
    return out


def check_paths(name: str, paths: Any) -> list[tuple[int, ...]]:
    """Root paths as tuples, sorted by depth (stable); each a non-empty list of ranks >= 0 whose prefixes are listed."""
    if not isinstance(paths, (list, tuple)) or not paths:
        raise option_error(name, f"method.paths must be a non-empty list of root paths such as [[0], [1], [0, 0]], "
                                 f"got {paths!r}")
    out = []
    for p in paths:
        if not isinstance(p, (list, tuple)) or not p or any(type(r) is not int or r < 0 for r in p):
            raise option_error(name, f"method.paths: each path is a non-empty list of sibling ranks >= 0, got {p!r}")
        out.append(tuple(p))
    given = set(out)
    for p in out:
        if p[:-1] and p[:-1] not in given:
            raise option_error(name, f"method.paths: {list(p)} is listed but its parent path {list(p[:-1])} is not")
    if len(given) < len(out):
        raise option_error(name, "method.paths lists a path twice")
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


@METHODS.register("spec_tree")
class SpecTree(SD2):
    """A static tree from the draft model (or a trained drafter), `rejection` (recursive, one-hot) by default."""

    name = "spec_tree"
    kind = "distilled"  # the drafter kind of the class (an instance's is its drafter_kind)

    def __init__(self, branching: list[int] | None = (2, 2, 1, 1, 1), paths: list[list[int]] | None = None,
                 rule: str = "rejection", drafter: str | None = None, drafter_kind: str = "distilled",
                 **options: Any) -> None:
        Method.__init__(self, rule=rule, **options)
        if self.rule.name not in trees.KINDS:
            raise option_error(self.name, f"method.rule must be one of {', '.join(trees.KINDS)} for a tree (a relaxed "
                                          f"rule compares one draft per position), got {rule!r}")
        self.folder = drafter
        if drafter_kind not in KINDS:
            raise option_error(self.name, f"method.drafter_kind must be one of {', '.join(KINDS)}, got {drafter_kind!r}")
        self.kind = drafter_kind
        if paths is None:
            if not isinstance(branching, (list, tuple)) or not branching:
                raise option_error(self.name, f"method.branching must be a non-empty list of children per depth such "
                                              f"as [2, 2, 1], or set method.paths; got {branching!r}")
            paths = branching_paths([check_gamma(self.name, k, "branching") for k in branching])
        if len(paths) > MAX_NODES:
            raise option_error(self.name, f"method.branching / method.paths: {len(paths)} nodes per tree; at most "
                                          f"{MAX_NODES} are verified per call")
        self.shape = StaticShape(check_paths(self.name, paths))

    def grower(self) -> Any:
        """The tree shape this method grows."""
        return self.shape

    def window(self) -> int:
        """Nodes verified per target call."""
        return len(self.shape.paths)

    def state(self) -> dict[str, float]:
        return {"nodes": self.window(), "depth": self.grower().depth}

    def bind(self, binding: Binding) -> None:
        """Bind with the pair's draft, or with a trained drafter (and an sd2 drafter's steering)."""
        self.steered = None
        self.hidden_layers = ()
        if self.folder in (None, ""):
            Method.bind(self, binding)
        else:
            Distilled.bind(self, binding)
            if self.steered is not None:
                self.hidden_layers = self.steered.steering.layers
        refuse_tree_models(self.name, self.bound, ("target", "draft"))

    def draft_source(self, states: dict[str, Any]) -> TreeDraft:
        return TreeDraft(states["draft"], self.grower())

    def check_batch(self, batch_size: int) -> None:
        if batch_size > 1:
            raise OptionError(f"method {self.name!r} verifies a tree of drafts one row at a time (tree attention over "
                              f"one row's cache); got batch_size={batch_size}: set batch_size=1")

    def check_compile(self) -> None:
        raise OptionError(f"method {self.name!r}: the compiled decode path verifies chains only (static widths, no tree "
                          "attention mask): set engine.compile=false")
