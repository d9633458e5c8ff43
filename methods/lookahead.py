"""Drafter `lookahead` (conf/method/lookahead.yaml): Lookahead decoding (Fu et al., ICML 2024, "Break the Sequential
Dependency of LLM Inference Using Lookahead Decoding"; the reference is LADE, `lade` 0.0.2 on the package index):
Jacobi iteration over a window of guessed tokens collects n-grams into a pool; the pool's n-grams that start with
the last committed token are the drafts; both ride in the one target forward of each iteration.

One row, its last committed token c (the root), window width W, n-gram size N, at most G n-grams per key (options
`width`, `ngram`, `guesses`; Spec-Bench's Lookahead row: 7, 5, 7):
  window: levels L_0 (W - 1 tokens) and L_1..L_{N-2} (W tokens each); B_0 = [c] + L_0. Level l's column j sits at
    depth j + l under the root: its ancestors are B_0[1..j] and L_1[j]..L_{l-1}[j] (LADE's attention mask, a tree:
    B_0 a chain from the root, each column's higher levels a chain under its B_0 node);
  candidates: pool[c], n-grams of N - 1 tokens, merged into a trie under the root (shared prefixes once);
  one forward feeds the candidates and then the window (look-only nodes: the rule never accepts them, the engine
    hands the target's argmax at them back with the next request, Drafting.looked);
  after it, y_j = the argmax at L_{N-2}[j]: for each column j the n-gram (B_0[j], L_1[j], .., L_{N-2}[j], y_j) enters
    the pool under key B_0[j] (N - 1 tokens after it; a repeat moves to the end, the oldest of G is dropped), then
    the window moves one column (LADE's ALWAYS_FWD_ONE): L_0 <- L_1[1:], L_l <- L_{l+1}, L_{N-2} <- y.
  Warm-up, as LADE: L_0 starts as W + N - 3 tokens drawn from the prompt (random.Random(seed)); for N - 2
    iterations the levels fill one by one from the top level's argmax, each trimming its first token, so the
    window reaches the sizes above; n-grams are collected and candidates proposed once it is full.
Where LADE differs: it is greedy only and verifies a matching n-gram's first N - 2 tokens (its last one is fed next
step); here the trie is verified by the method's rule, every matching token accepted plus the bonus, so sampling
is lossless too (one-hot q, distinct siblings: recursive rejection). The window is not refreshed near the end of a
generation or the context (when its deepest node would pass the row's cap, it skips that iteration).
"""

from __future__ import annotations

import random

import torch

from specbench.common.options import integer
from specbench.decoding.binding import Binding
from specbench.decoding.drafts import DraftSource, Drafting
from specbench.decoding.parts import DRAFTERS, Drafter, Needs, Shape
from specbench.decoding.proposal import TOP_K, Proposal, chain
from specbench.decoding.state import Counted


class Window:
    """The Jacobi window and the n-gram pool of one row (LADE's past_tokens and token_map)."""

    def __init__(self, prompt: list[int], W: int, N: int, G: int, seed: int) -> None:
        rng = random.Random(seed)
        self.W, self.N, self.G = W, N, G
        self.levels: list[list[int] | None] = [[rng.choice(prompt) for _ in range(W + N - 3)]] + [None] * (N - 2)
        self.pool: dict[int, list[tuple[int, ...]]] = {}

    @property
    def full(self) -> bool:
        return self.levels[-1] is not None

    def filled(self) -> list[list[int]]:
        """The levels filled so far, L_0 first."""
        return [lv for lv in self.levels if lv is not None]

    def tree(self) -> tuple[list[int], list[int]]:
        """(tokens, parents) of the window's nodes, L_0 then each level in column order; parents index these nodes
        (-1: the root c)."""
        levels = self.filled()
        tokens, parents, at = list(levels[0]), list(range(-1, len(levels[0]) - 1)), {}
        for j in range(len(levels[0])):
            at[(0, j + 1)] = j  # B_0[j + 1] = L_0[j]
        for lv in range(1, len(levels)):
            for j, x in enumerate(levels[lv]):
                at[(lv, j)] = len(tokens)
                below = at[(lv - 1, j)] if lv > 1 else at.get((0, j), -1)  # L_{l-1}[j], or B_0[j] (c: -1)
                tokens.append(x)
                parents.append(below)
        return tokens, parents

    def depth(self) -> int:
        """The deepest window node's depth under the root (L_0[j] at j + 1, level l's column j at j + l)."""
        levels = self.filled()
        return max([len(levels[0])] + [len(level) - 1 + lev for lev, level in enumerate(levels) if lev])

    def step(self, c: int, top: list[int]) -> None:
        """After a forward whose root was c: `top`, the argmax at the highest filled level's nodes, fills the next level
        (warm-up) or makes the n-grams and moves the window one column."""
        lv, filled = self.levels, self.filled()  # the levels fill in order: filled = lv[:len(filled)]
        if not self.full:
            k = len(filled)
            for i in range(k):
                lv[i] = filled[i][1:]
            lv[k] = top[1:] if k > 1 else top  # LADE's first step keeps the whole new level
            return
        b0 = [c] + filled[0]
        for j in range(self.W):
            self.add(b0[j], tuple(filled[lev][j] for lev in range(1, self.N - 1)) + (top[j],))
        lv[0] = filled[1][1:]
        for lev in range(1, self.N - 2):
            lv[lev] = filled[lev + 1][:]
        lv[self.N - 2] = list(top)

    def add(self, key: int, gram: tuple[int, ...]) -> None:
        """The n-gram after `key` joins the pool: a repeat moves to the end; beyond G the oldest is dropped."""
        grams = self.pool.setdefault(key, [])
        if gram in grams:
            grams.remove(gram)
        elif len(grams) >= self.G:
            grams.pop(0)
        grams.append(gram)


def trie(grams: list[tuple[int, ...]], cap: int, eos_ids: frozenset[int]) -> tuple[list[int], list[int]]:
    """The n-grams merged into a tree under the root (a shared prefix once), in pool order, at most `cap` nodes and
    none below an EOS: (tokens, parents)."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}
    for gram in grams:
        at = -1
        for x in gram:
            if (at, x) not in child:
                if len(tokens) >= cap or (at >= 0 and tokens[at] in eos_ids):
                    break
                child[(at, x)] = len(tokens)
                tokens.append(x)
                parents.append(at)
            at = child[(at, x)]
    return tokens, parents


class LookaheadDraft(DraftSource):
    """One row's window and pool: candidates from the pool, the window as look-only nodes."""

    def __init__(self, part: "Lookahead") -> None:
        self.part = part
        self.window: Window | None = None
        self.last: tuple[int, int] | None = None  # (root c, look-only nodes) of the last proposal with a window

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        L, cap, p = d.L[0], d.w_max[0], self.part
        if self.window is None:
            self.window = Window(buf[0, :L].tolist(), p.width, p.ngram, p.guesses, p.seed)
        w = self.window
        looked = d.looked[0] if d.looked else None
        if self.last is not None and looked is not None:
            c, n = self.last
            top = len(w.filled()[-1])
            w.step(c, looked[n - top :])
        self.last = None
        if cap <= 0:
            return [chain([], why="length")]
        c = int(buf[0, L - 1])
        tokens, parents = trie(w.pool.get(c, []) if w.full else [], cap, d.eos_ids)
        look, look_parents = w.tree()
        if w.depth() > cap:  # the window would reach past the row's length or context: not this iteration
            return [Proposal(tokens, parents, None, "source" if not tokens else "window", TOP_K, 0)]
        self.last = (c, len(look))
        n = len(tokens)
        return [Proposal(tokens + look, parents + [a + n if a >= 0 else -1 for a in look_parents], None,
                         "source" if not tokens else "window", TOP_K, 0, look=len(look))]


@DRAFTERS.register("lookahead")
class Lookahead(Drafter):
    """Lookahead decoding: window width W, n-grams of N tokens, at most G n-grams per key, the window's seed."""

    needs = Needs(proposes=("tree",), pair_draft=False, tree_role="", looks=True,  # candidates and window: one tree
                  one_row="feeds one row's look-ahead window (look-only nodes) in each verify, one row at a time")

    def __init__(self, width: int = 7, ngram: int = 5, guesses: int = 7, seed: int = 10) -> None:
        self.width = integer(width, "method.width", low=2, high=256)
        self.ngram = integer(ngram, "method.ngram", low=3, high=16)
        self.guesses = integer(guesses, "method.guesses", low=1, high=256)
        self.seed = integer(seed, "method.seed", low=0)

    def budget(self, nodes: int) -> int:
        """Never the binding cap (not the policy's window): room for every candidate (G n-grams of N - 1 tokens) and
        for the window's deepest node (W + N - 3); the row's length and context caps still apply."""
        return max(self.guesses * (self.ngram - 1), self.width + self.ngram)

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        return LookaheadDraft(self)
