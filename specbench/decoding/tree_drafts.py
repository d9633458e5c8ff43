"""A draft model growing one row's tree of drafts depth by depth (the proposer of spec_tree and dyn_tree; heads
override how q is computed at the root and at grown nodes, specbench.decoding.head_drafts).

Growth (one row, tree attention on the draft's own cache, specbench.decoding.tree_state):
  depth 0: one forward of the row's uncached committed tokens gives q at the root;
  depth d = 1..D: each node expanded at depth d - 1 gets the children a `Grower` picks from q there (distinct,
    ranked by q, chosen deterministically: siblings TOP_K, verified by recursive rejection with one-hot q); the new
    nodes the grower expands (never an EOS) are fed in one forward, each attending to the prefix and its ancestors;
  then the grower selects the nodes to verify (ancestor-closed, at most the row's cap): the Proposal, in growth
  order (a node after its parent).
After the verify the draft cache keeps the prefix plus the accepted path's expanded nodes (TreeState.keep_path).
A node's score is its cumulative draft log-probability, sum of log q(x) along its root path (EAGLE-2's ranking).
"""

from __future__ import annotations

import math
from typing import Generic, Protocol, TypeVar

import torch

from specbench.decoding.drafts import DraftSource, Drafting
from specbench.decoding.proposal import TOP_K, Proposal, chain
from specbench.decoding.state import Counted
from specbench.decoding.tree_state import TreeState

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
    """One row's tree grown by `grower` over the drafter's state S (batch_size 1: the methods refuse more rows): a
    draft model's (TreeDraft) or a head's (specbench.decoding.head_drafts.HeadDraft), which give q at the root and at
    the grown nodes."""

    def __init__(self, state: S, grower: Grower | None) -> None:
        self.state = state  # one row
        self.grower = grower
        self.index: list[int] | None = None  # proposal node -> grown node, of the last proposal
        self.steps = 0  # draft forwards of the last proposal

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        """One row's tree of at most d.w_max[0] nodes after buf[0, :L]."""
        L, cap, g = d.L[0], d.w_max[0], self.grower
        self.index = None
        if cap <= 0:
            return [chain([], why="length")]
        self.steps = 0
        root = self.root(buf, L, d)
        if root is None:
            return [chain([], why="source")]
        if g is None:
            raise TypeError(f"{type(self).__name__} grows a tree: it needs the shape's grower")
        t = Grown()
        expanded = {-1: root}  # q at the root [V]
        for depth in range(1, g.depth + 1):
            new = [t.add(x, node, rank, q) for node, q in expanded.items() for rank, x in g.children(t, node, q)]
            if depth == g.depth or not new:
                break
            grow = g.expand(t, [j for j in new if t.tokens[j] not in d.eos_ids])  # nothing follows an EOS
            if not grow:
                break
            qs = self.grow(t, grow, buf, L, d)  # [len(grow), V]
            expanded = {j: qs[k] for k, j in enumerate(grow)}
        keep = g.select(t, cap)
        self.index = keep
        new_id = {j: k for k, j in enumerate(keep)}
        parents = [new_id[t.parents[j]] if t.parents[j] >= 0 else -1 for j in keep]
        q = torch.stack([t.qs[j] for j in keep]) if keep else None
        return [Proposal([t.tokens[j] for j in keep], parents, q, "window", TOP_K, self.steps)]

    def root(self, buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor | None:
        """q at the root [V] (None: nothing to draft from)."""
        raise NotImplementedError

    def grow(self, t: Grown, grow: list[int], buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor:
        """q [len(grow), V] at the grown nodes `grow`."""
        raise NotImplementedError


class TreeDraft(GrowingDraft[TreeState]):
    """A draft model's tree for one row, grown with tree attention on its own cache."""

    def root(self, buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor | None:
        """q at the root [V]: one forward of the row's uncached committed tokens (None: nothing to draft from)."""
        self.steps += 1
        return d.sampler.probs(self.state.feed_tree(buf, L, [], [], [], True)[0, :1])[0]

    def grow(self, t: Grown, grow: list[int], buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor:
        """q [len(grow), V] at the grown nodes `grow`: they are fed in one forward (tree attention)."""
        s = self.state
        logits = s.feed_tree(buf, L, [t.tokens[j] for j in grow], [t.parents[j] for j in grow], list(s.tree_nodes),
                             False, nodes=grow)
        self.steps += 1
        return d.sampler.probs(logits[0])

    def rollback(self, lengths: list[int], paths: list[list[int]]) -> None:
        """The draft cache keeps the prefix and the accepted path's expanded nodes."""
        if self.index is not None:
            self.state.keep_path(lengths[0], [self.index[j] for j in paths[0]])
