"""Dependent drafters: heads that read the target's hidden states (EAGLE-3, Medusa) as proposers of one row.

Each drafting request carries the target's states [len(layers), m, H] at the m positions the last verify committed
(Drafting.states); those the head has not read wait in `HeadState.pending`. A generation's first iteration has none:
its proposal is empty (why = "source") and its verify is the prefill, as in EAGLE's and Medusa's own loops, where
the prefill yields the first token and the states the first draft reads.

EAGLE-3 (specbench.models.eagle3), committed L tokens x_0..x_{L-1}, the target's states known at 0..L-2:
  root:  the head reads the pairs (f_t, x_{t+1}) of the positions not read yet (t = fed..L-2, f_t from fc) into
         its cache; its output o_{L-2} gives q at the root, the distribution of x_L;
  nodes: a drafted node j at depth d reads (o_parent, x_j) at head position L - 2 + d (o_root = o_{L-2}) and
         attends to the committed positions, its ancestors' positions and itself; its output gives q at j;
  after the verify the head's cache keeps the committed positions only: the accepted drafts are read again
  with the target's own states in the next root forward, as EAGLE-3 does.
A chain draws x_i ~ q_i (argmax at temperature 0) until the policy stops; a tree grows with a Grower
(specbench.decoding.tree_drafts), children distinct and ranked by q.
Medusa (specbench.models.medusa): at the last committed position's state h, head i gives q_i, the distribution of
x_{L-1+i}; a node at depth d gets its children ranked by q_{d+1}, whatever its parent (Medusa's tree).
Each q is over the target's vocabulary [V] (zero outside an EAGLE-3 head's draft vocabulary).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import torch

from specbench.decoding.drafts import Chain, Drafting
from specbench.decoding.proposal import Proposal, chain
from specbench.decoding.state import Counted, sync
from specbench.decoding.tree_drafts import Grower, Grown, GrowingDraft

T = TypeVar("T")


class HeadCache(Protocol):
    """The keys and values of a head's positions (specbench.models.eagle3.HeadCache)."""

    @property
    def length(self) -> int: ...

    def crop(self, n: int) -> None: ...


class Eagle3Module(Protocol):
    """What EAGLE-3's proposer calls of its head (specbench.models.eagle3.Eagle3Head, which decoding cannot import)."""

    fc: torch.nn.Linear  # reads the target's states [3 H_t]

    def step(self, f: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor,
             past: HeadCache | None = None) -> torch.Tensor: ...

    def target_logits(self, o: torch.Tensor) -> torch.Tensor: ...


class DraftHead(torch.nn.Module):
    """A head in the pair's draft role (Binding.models["draft"]): the engine asks it for its state."""

    def __init__(self, head: torch.nn.Module, name: str, folder: Path | None = None) -> None:
        """head: a specbench.models.eagle3.Eagle3Head or specbench.models.medusa.MedusaHeads."""
        super().__init__()
        self.head, self.name_or_path, self.head_folder = head, name, folder  # method.head, the folder read
        self.device = next(head.parameters()).device

    def new_state(self, rows: int) -> "HeadState":
        """The head's state over `rows` rows (the head methods decode one)."""
        return HeadState(self, rows)


class HeadState(Counted):
    """A head's state for one row: its own cache (EAGLE-3's), the target states not read yet, its forwards' seconds
    and calls (in the draft role, as a model's); fed: the head positions read."""

    def __init__(self, head: DraftHead, rows: int = 1) -> None:
        super().__init__(rows)
        self.model, self.device = head.head, head.device
        new_cache = getattr(self.model, "new_cache", None)  # EAGLE-3's keys and values (Medusa keeps none)
        self.cache: HeadCache | None = new_cache() if new_cache is not None else None
        self.pending: list[torch.Tensor] = []  # target states [m, len(layers), H] not read yet, in order
        self.root: torch.Tensor | None = None  # EAGLE-3: the head's output at the last committed position [H]

    def timed(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), its seconds counted as one forward of the head."""
        t0 = time.perf_counter()
        out = fn(*args)
        sync(self.device)
        self.count(time.perf_counter() - t0)
        return out


def head_state(state: Counted) -> HeadState:
    """`state` as a head's (the engine asks a DraftHead in the draft role for it): a TypeError otherwise."""
    if not isinstance(state, HeadState):
        raise TypeError(f"a head drafts from its own state (HeadState), got a {type(state).__name__}: bind the head in "
                        "the draft role")
    return state


class HeadDraft(GrowingDraft[HeadState]):
    """Shared by the heads: the states a request carries go to the head's state; no tree cache to keep."""

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        """Take the request's states, then propose a chain (grower None) or a tree."""
        self.take(d)
        return self.propose_chain(buf, d) if self.grower is None else super().propose(buf, d)

    def take(self, d: Drafting) -> None:
        """The request's target states [len(layers), m, H] (none before the first verify) join the pending ones."""
        if d.states and d.states[0] is not None:
            self.state.pending.append(d.states[0].transpose(0, 1).to(self.state.device))

    def propose_chain(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        raise NotImplementedError(f"{type(self).__name__} proposes trees only")

    def roots(self, buf: torch.Tensor, d: Drafting, live: list[int]) -> dict[int, torch.Tensor | None]:
        """The one row's q at the root."""
        return {0: self.root(buf, d.L[0], d)}

    def grow(self, trees: dict[int, Grown], grow: dict[int, list[int]], buf: torch.Tensor, d: Drafting
             ) -> dict[int, torch.Tensor]:
        """The one row's q at its grown nodes."""
        return {0: self.grow_row(trees[0], grow[0], buf, d.L[0], d)}

    def root(self, buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor | None:
        """q at the root [V] (None: nothing to draft from)."""
        raise NotImplementedError

    def grow_row(self, t: Grown, grow: list[int], buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor:
        """q [len(grow), V] at the grown nodes `grow`."""
        raise NotImplementedError


class Eagle3Draft(HeadDraft):
    """EAGLE-3's proposals for one row: a chain (grower None) or a tree grown by `grower`."""

    def __init__(self, state: HeadState, grower: Grower | None = None) -> None:
        super().__init__(state, grower)
        self.out: dict[int, torch.Tensor] = {}  # grown node -> its head output [H]
        self.col: dict[int, int] = {}  # grown node -> its cache column

    @property
    def head(self) -> Eagle3Module:
        """The state's head as the Eagle3Head methods/eagle3.py binds (a cast: decoding cannot import it)."""
        return cast(Eagle3Module, self.state.model)

    @property
    def cache(self) -> HeadCache:
        """The head's cache (an EAGLE-3 head makes one: Eagle3Head.new_cache)."""
        if self.state.cache is None:
            raise TypeError("an EAGLE-3 head keeps its positions' keys and values (new_cache); this head has none")
        return self.state.cache

    def propose_chain(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        """x_1 ~ q at the root, then x_i ~ q_i from the head's output at x_{i-1}, until the policy stops."""
        L, cap = d.L[0], d.w_max[0]
        if cap <= 0:
            return [chain([], why="length")]
        q = self.root(buf, L, d)
        if q is None:
            return [chain([], why="source")]
        c, o = Chain(d.policies[0], cap, d.eos_ids, d.sampler.vocab_size), self.state.root
        assert o is not None  # root() gave q at the root, from the head's output there
        depth = 0
        cols: list[int] = []  # the cache columns of the chain's drafts read so far
        while True:
            x = int(d.sampler.pick(q[None], d.generators[:1])[0])
            depth += 1
            if not c.take(x, q):
                return [c.proposal(self.steps)]
            o, q = self.feed([o], [x], [depth], [cols], L, d)
            o, q = o[0], q[0]
            cols = cols + [self.cache.length - 1]

    def root(self, buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor | None:
        """Read the committed pairs not read yet; q at the root [V] from the output at position L - 2."""
        s, head = self.state, self.head
        self.steps, self.out, self.col = 0, {}, {}
        if s.pending:
            f = torch.cat(s.pending).flatten(1)  # [m, len(layers) H]: low, middle, high
            start, m = s.fed[0], f.shape[0]
            if start + m != L - 1:
                raise RuntimeError(f"the head has read {start} positions and got {m} states; {L - 1} are committed")
            pos = torch.arange(start, L - 1, device=s.device)
            allowed = torch.arange(start + m, device=s.device)[None] <= pos[:, None]  # [m, kv] causal
            ids = buf[0, start + 1 : L].to(s.device)
            with torch.inference_mode():
                o = s.timed(head.step, f[None].to(head.fc.weight.dtype), ids[None], pos[None], allowed[None], s.cache)
            s.root, s.fed, s.pending = o[0, -1], [L - 1], []
            self.steps = 1
        if s.root is None:
            return None
        with torch.inference_mode():
            return d.sampler.probs(head.target_logits(s.root)[None])[0]

    def feed(self, parents: list[torch.Tensor], tokens: list[int], depths: list[int], ancestors: list[list[int]],
             L: int, d: Drafting) -> tuple[torch.Tensor, torch.Tensor]:
        """Nodes reading (o_parent, x_j) at positions L - 2 + depth_j, each attending to the committed positions, the
        cache columns `ancestors[j]` and itself; their outputs [n, H] and q [n, V]."""
        s, head, n = self.state, self.head, len(tokens)
        kv0 = self.cache.length
        allowed = torch.zeros((n, kv0 + n), dtype=torch.bool, device=s.device)
        allowed[:, : s.fed[0]] = True
        for k, cols in enumerate(ancestors):
            allowed[k, cols] = True
            allowed[k, kv0 + k] = True
        pos = torch.tensor([L - 2 + dep for dep in depths], device=s.device)
        ids = torch.tensor(tokens, device=s.device)
        with torch.inference_mode():
            o = s.timed(head.step, torch.stack(parents)[None], ids[None], pos[None], allowed[None], s.cache)[0]
            q = d.sampler.probs(head.target_logits(o))
        self.steps += 1
        return o, q

    def grow_row(self, t: Grown, grow: list[int], buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor:
        """q at the grown nodes `grow` [len(grow), V], fed in one head forward."""
        kv0 = self.cache.length
        ancestors = []
        for j in grow:
            a, cols = t.parents[j], []
            while a >= 0:
                cols.append(self.col[a])
                a = t.parents[a]
            ancestors.append(cols)
        root = self.state.root
        assert root is not None  # the tree grows after root() gave q there, from the head's output at the root
        parents = [self.out[t.parents[j]] if t.parents[j] >= 0 else root for j in grow]
        o, q = self.feed(parents, [t.tokens[j] for j in grow], [len(t.path(j)) for j in grow], ancestors, L, d)
        for k, j in enumerate(grow):
            self.out[j], self.col[j] = o[k], kv0 + k
        return q

    def rollback(self, lengths: list[int], paths: list[list[int]]) -> None:
        """The head's cache keeps the committed positions: accepted drafts are read again with the target's states."""
        self.cache.crop(self.state.fed[0])
        self.index = []


class MedusaDraft(HeadDraft):
    """Medusa's tree for one row: the heads once at the last committed state, children by depth from q_{d+1}."""

    def root(self, buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor | None:
        """q_1..q_k [k, V] from the state at position L - 2; q at the root is q_1."""
        s, heads = self.state, self.state.model
        if not s.pending:
            return None
        h = s.pending[-1][-1, -1]  # [H]: the last committed position, the last hidden_states index
        s.pending = []
        with torch.inference_mode():
            self.qs = d.sampler.probs(s.timed(heads, h.to(medusa_dtype(heads))))  # [k, V]
        self.steps = 1
        return self.qs[0]

    def grow_row(self, t: Grown, grow: list[int], buf: torch.Tensor, L: int, d: Drafting) -> torch.Tensor:
        """q at a node of depth d is head d + 1's (no forward)."""
        return torch.stack([self.qs[len(t.path(j))] for j in grow])

    def rollback(self, lengths: list[int], paths: list[list[int]]) -> None:
        self.index = []


def medusa_dtype(heads: torch.nn.Module) -> torch.dtype:
    """The dtype of Medusa's heads (MedusaHeads: Sequentials ending in a Linear), its first head's output layer's."""
    first = heads[0] if isinstance(heads, torch.nn.ModuleList) else None
    last = first[-1] if isinstance(first, torch.nn.Sequential) else None
    if not isinstance(last, torch.nn.Linear):
        raise TypeError(f"Medusa heads are a ModuleList of Sequentials ending in a Linear, got {type(heads).__name__}")
    return last.weight.dtype
