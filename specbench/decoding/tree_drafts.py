"""A draft model growing one row's tree of drafts depth by depth (the proposer of spec_tree and dyn_tree; heads
override how q is computed at the root and at grown nodes, specbench.decoding.head_drafts).

Growth (B >= 1 rows in lockstep, tree attention on the draft's own cache, specbench.decoding.tree_state):
  depth 0: one forward of the rows' uncached committed tokens gives q at each root;
  depth d = 1..D: each node expanded at depth d - 1 gets the children a `Grower` picks from q there (distinct,
    ranked by q, chosen deterministically: siblings TOP_K, verified by recursive rejection with one-hot q); the new
    nodes the grower expands (never an EOS), of every row, are fed in one forward, each attending to its row's prefix
    and its ancestors (a row with nothing to expand stops growing);
  then the grower selects the nodes to verify (ancestor-closed, at most the row's cap): the Proposal, in growth
  order (a node after its parent).
After the verify the draft cache keeps each row's prefix plus its accepted path's expanded nodes (TreeState.keep_paths).
A node's score is its cumulative draft log-probability, sum of log q(x) along its root path (EAGLE-2's ranking).
"""

from __future__ import annotations

import math
from typing import Generic, Protocol, TypeVar

import torch

from specbench.decoding.drafts import DraftSource, Drafting
from specbench.decoding.proposal import TOP_K, Proposal, chain
from specbench.decoding.state import Counted, ModelState
from specbench.decoding.tree_state import tree_state

MAX_NODES = 1024  # nodes verified per call: beyond any published tree (EAGLE ~60, Sequoia <= 768)


class Grown:
    """The nodes grown so far: token, parent (-1 root), rank among its siblings, score, q at its parent."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.ranks: list[int] = []
        self.scores: list[float] = []
        self.qs: list[torch.Tensor] = []  # [V] each

    def add(self, x: int, parent: int, rank: int, q: torch.Tensor) -> int:
        """Append node x under `parent`, drawn from q [V] at the parent as its rank-th child; its index."""
        base = self.scores[parent] if parent >= 0 else 0.0
        self.tokens.append(x)
        self.parents.append(parent)
        self.ranks.append(rank)
        self.scores.append(base + min(0.0, math.log(float(q[x]))))  # log q(x) <= 0: a child never outranks its parent
        self.qs.append(q)
        return len(self.tokens) - 1

    def path(self, j: int) -> tuple[int, ...]:
        """The sibling ranks from the root to node j (Medusa's and EAGLE's way of writing a static tree)."""
        out: list[int] = []
        while j >= 0:
            out.append(self.ranks[j])
            j = self.parents[j]
        return tuple(reversed(out))


class Grower(Protocol):
    """A tree shape: which children each expanded node gets, which new nodes to expand, which to verify."""

    depth: int  # the deepest level grown

    def children(self, t: Grown, node: int, q: torch.Tensor) -> list[tuple[int, int]]:
        """(rank, token) of the children of `node` (-1: root) from q [V] at it, best first."""
        ...

    def expand(self, t: Grown, new: list[int]) -> list[int]:
        """Of the nodes just added, those whose children the next depth grows (increasing)."""
        ...

    def select(self, t: Grown, cap: int) -> list[int]:
        """The nodes to verify, at most cap of them, ancestor-closed, increasing."""
        ...


def ranked(q: torch.Tensor, k: int) -> list[int]:
    """The k most likely tokens of q [V] with q > 0, best first (ties: lower id)."""
    values, ids = torch.topk(q, min(k, q.shape[-1]))
    return [int(i) for v, i in zip(values.tolist(), ids.tolist()) if v > 0]


def closed(t: Grown, chosen: list[int]) -> list[int]:
    """The chosen nodes (increasing) without any whose parent is not chosen: an ancestor-closed tree."""
    keep: set[int] = set()
    for j in sorted(chosen):
        if t.parents[j] < 0 or t.parents[j] in keep:
            keep.add(j)
    return sorted(keep)


S = TypeVar("S", bound=Counted)


class GrowingDraft(DraftSource, Generic[S]):
    """Each row's tree grown by `grower` over the drafter's state S, the rows depth by depth in lockstep: a draft
    model's (TreeDraft, B >= 1) or a head's (specbench.decoding.head_drafts.HeadDraft, one row), which give q at the
    roots and at the grown nodes."""

    def __init__(self, state: S, grower: Grower | None) -> None:
        self.state = state
        self.grower = grower
        self.index: list[list[int] | None] = []  # per row: proposal node -> grown node, of the last proposal
        self.steps = 0  # draft forwards of the last proposal (the batch's)

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        """Row b's tree of at most d.w_max[b] nodes after buf[b, :L_b]."""
        g, B = self.grower, len(d.L)
        self.index, self.steps = [None] * B, 0
        live = [b for b in range(B) if d.w_max[b] > 0]
        roots = {b: q for b, q in self.roots(buf, d, live).items() if q is not None} if live else {}
        if roots and g is None:
            raise TypeError(f"{type(self).__name__} grows a tree: it needs the shape's grower")
        trees = {b: Grown() for b in roots}
        expanded = {b: {-1: q} for b, q in roots.items()}  # q at the root [V]
        for depth in range(1, (g.depth if g is not None else 0) + 1):
            assert g is not None
            grow: dict[int, list[int]] = {}
            for b, t in trees.items():
                new = [t.add(x, node, rank, q) for node, q in expanded[b].items() for rank, x in g.children(t, node, q)]
                expanded[b] = {}
                if depth < g.depth and new:  # nothing follows an EOS
                    grow_b = g.expand(t, [j for j in new if t.tokens[j] not in d.eos_ids])
                    if grow_b:
                        grow[b] = grow_b
            if not grow:
                break
            qs = self.grow(trees, grow, buf, d)  # row b: [len(grow[b]), V]
            expanded.update({b: {j: qs[b][k] for k, j in enumerate(js)} for b, js in grow.items()})
        return [self.proposal(trees.get(b), b, d) for b in range(B)]

    def proposal(self, t: Grown | None, b: int, d: Drafting) -> Proposal:
        """Row b's proposal: the nodes the grower selects of its tree t (None: it drafted nothing), in growth order."""
        if d.w_max[b] <= 0:  # steps: the batch's draft forwards, which every row takes part in
            return chain([], why="length", steps=self.steps)
        if t is None or self.grower is None:
            return chain([], why="source", steps=self.steps)
        keep = self.grower.select(t, d.w_max[b])
        self.index[b] = keep
        new_id = {j: k for k, j in enumerate(keep)}
        parents = [new_id[t.parents[j]] if t.parents[j] >= 0 else -1 for j in keep]
        q = torch.stack([t.qs[j] for j in keep]) if keep else None
        return Proposal([t.tokens[j] for j in keep], parents, q, "window", TOP_K, self.steps)

    def roots(self, buf: torch.Tensor, d: Drafting, live: list[int]) -> dict[int, torch.Tensor | None]:
        """q at the root [V] of each row in `live` (None: nothing to draft from)."""
        raise NotImplementedError

    def grow(self, trees: dict[int, Grown], grow: dict[int, list[int]], buf: torch.Tensor, d: Drafting
             ) -> dict[int, torch.Tensor]:
        """q [len(grow[b]), V] at row b's grown nodes grow[b], for each row that grows."""
        raise NotImplementedError

    def select(self, rows: list[int]) -> None:
        self.index = [self.index[b] for b in rows] if self.index else []


class TreeDraft(GrowingDraft[ModelState]):
    """A draft model's trees for B rows, grown with tree attention on its own cache, one forward per depth."""

    def roots(self, buf: torch.Tensor, d: Drafting, live: list[int]) -> dict[int, torch.Tensor | None]:
        """q at the root [V] of each live row: one forward of their uncached committed tokens."""
        s, B, before = tree_state(self.state), len(d.L), list(self.state.fed)
        upto = [d.L[b] if b in live else before[b] for b in range(B)]
        if upto == before:
            return {b: None for b in live}
        self.steps += 1
        q = d.sampler.probs(s.feed_trees(buf, upto, [[]] * B, [[]] * B, True)[:, -1])  # [B, V]
        return {b: q[b] if upto[b] > before[b] else None for b in live}

    def grow(self, trees: dict[int, Grown], grow: dict[int, list[int]], buf: torch.Tensor, d: Drafting
             ) -> dict[int, torch.Tensor]:
        """q at the grown nodes, every row's fed in one forward (tree attention)."""
        s, B = tree_state(self.state), len(d.L)
        js = [grow.get(b, []) for b in range(B)]
        logits = s.feed_trees(buf, list(s.fed), [[trees[b].tokens[j] for j in js[b]] for b in range(B)],
                              [[trees[b].parents[j] for j in js[b]] for b in range(B)], False, nodes=js)
        self.steps += 1
        return {b: d.sampler.probs(logits[b, logits.shape[1] - len(js[b]) :]) for b in grow}

    def rollback(self, lengths: list[int], paths: list[list[int]]) -> None:
        """Each row's draft cache keeps the prefix and the accepted path's expanded nodes."""
        if any(i is not None for i in self.index):
            tree_state(self.state).keep_paths(lengths, [[ix[j] for j in p] if ix is not None else []
                                            for ix, p in zip(self.index, paths)])
