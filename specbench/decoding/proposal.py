"""Drafting as values: what a draft source proposes for one row (`Proposal`) and what a rule decides (`Verdict`).

A proposal is a tree of n draft nodes in topological order (every node after its parent). Node j holds a token
x_j, its parent a(j) (-1: the root, which is the row's last committed token) and, when it was drawn from a draft
distribution, q_j = q(. | the prefix and x's ancestors), the distribution at its parent that it was drawn from.
A chain is the tree whose node j has parent j - 1. The target's distributions of a proposal are p [n+1, V]:
p[0] at the root (over the root's children), p[1 + j] at node j (over node j's children). A verdict names the
accepted root path (node indices, root side first) and the next token drawn at its end (the correction, or the
bonus token after a leaf), so one verdict serves chains and trees alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

SAMPLED = "sampled"  # siblings drawn independently from q (a chain's one child is this too)
TOP_K = "top_k"  # siblings chosen without replacement: the top-k of q, or deterministic (one-hot q)
WITHOUT_REPLACEMENT = "without_replacement"  # siblings drawn from q without replacement (q_i: q less c_1..c_{i-1})


@dataclass
class Proposal:
    """One row's drafts for one iteration: tokens [n], parents [n] (-1 = root), q [n, V] or None (one-hot)."""

    tokens: list[int]
    parents: list[int]
    q: torch.Tensor | None = None  # [n, V]; None: a deterministic proposal, q_j = one-hot(x_j)
    why: str = "none"  # why drafting ended: window / eos / policy / length / source / none
    siblings: str = SAMPLED  # how a node's children were chosen: SAMPLED (independent draws) or TOP_K
    steps: int = 0  # draft forwards this row took part in
    look: int = 0  # the last `look` nodes are look-only (Lookahead's window): fed to the verify, never accepted

    def __len__(self) -> int:
        return len(self.tokens)

    def candidates(self) -> "Proposal":
        """The proposal without its look-only nodes (they come last, so the others keep their indices)."""
        if not self.look:
            return self
        n = len(self.tokens) - self.look
        q = self.q[:n] if self.q is not None else None
        return Proposal(self.tokens[:n], self.parents[:n], q, self.why, self.siblings, self.steps)

    @cached_property
    def is_chain(self) -> bool:
        """Is every node the only child of the one before it (parents == [-1, 0, 1, ...])?"""
        return all(a == j - 1 for j, a in enumerate(self.parents))

    def depths(self) -> list[int]:
        """d(j) [n]: 1 for the root's children, d(a(j)) + 1 below (topological order makes one pass enough)."""
        d: list[int] = []
        for a in self.parents:
            d.append(1 if a < 0 else d[a] + 1)
        return d

    def children(self) -> list[list[int]]:
        """The children of the root (entry 0) and of node j (entry 1 + j), in proposal order [n+1][*]."""
        kids: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for j, a in enumerate(self.parents):
            kids[a + 1].append(j)
        return kids

    def q_rows(self, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """q [n, V]: the drafted distributions, or one-hot(x_j) for a deterministic proposal."""
        if self.q is not None:
            return self.q
        return self.one_hot(vocab, device)

    def verify_q(self, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """q [n, V] as the rule must see it: the distributions the nodes were drawn from, or one-hot(x_j) where the
        nodes were chosen, not drawn (a deterministic proposal, or TOP_K children: a rank-1 child is no draw)."""
        return self.q if self.q is not None and self.siblings != TOP_K else self.one_hot(vocab, device)

    def one_hot(self, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """one-hot(x_j) [n, V]."""
        q = torch.zeros((len(self.tokens), vocab), device=device)
        if self.tokens:
            q[torch.arange(len(self.tokens)), torch.tensor(self.tokens)] = 1.0
        return q


def chain(tokens: list[int], q: torch.Tensor | None = None, why: str = "none", steps: int = 0) -> Proposal:
    """The proposal of a chain x_1..x_w (node j's parent is j - 1), q [w, V] or None (one-hot)."""
    return Proposal(list(tokens), list(range(-1, len(tokens) - 1)), q, why, SAMPLED, steps)


def ancestors(parents: list[int]) -> list[list[int]]:
    """Each node's ancestors and itself, root side first [n][d(j)]."""
    out: list[list[int]] = []
    for j, a in enumerate(parents):
        out.append((out[a] if a >= 0 else []) + [j])
    return out


@dataclass
class Verdict:
    """A rule's decision on one row: the accepted root path (node indices) and the next token after it."""

    path: list[int]
    token: int
    relaxed: int = 0  # of the path, nodes accepted only by a relaxation (AdaSD's d_JS <= T_V)
    js: torch.Tensor | None = field(default=None, repr=False)  # d_JS(p_j, q_j) [n] when the rule computed them

    @property
    def accepted(self) -> int:
        """n: the accepted path's length."""
        return len(self.path)
