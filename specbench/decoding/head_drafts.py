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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import torch

from specbench.decoding.drafts import Chain, Drafting
from specbench.decoding.proposal import Proposal, chain
from specbench.decoding.state import Counted, sync
from specbench.decoding.tree_drafts import Grower, Grown, GrowingDraft

T = TypeVar("T")


class HeadCache(Protocol):
    """The keys and values of a head's positions (specbench.models.eagle3.HeadCache), columns shared by the rows."""

    @property
    def length(self) -> int: ...

    def crop(self, n: int) -> None: ...

    def select(self, rows: list[int]) -> None: ...


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
        """The head's state over `rows` rows."""
        return HeadState(self, rows)


class HeadState(Counted):
    """A head's state over B rows: its own cache (EAGLE-3's: columns shared by the rows, row b's committed head
    positions marked in `mask` when B > 1), the target states each row has not read yet, each row's output at its
    last committed position, its forwards' seconds and calls (in the draft role, as a model's); fed: the head
    positions each row has read."""

    def __init__(self, head: DraftHead, rows: int = 1) -> None:
        super().__init__(rows)
        self.model, self.device = head.head, head.device
        new_cache = getattr(self.model, "new_cache", None)  # EAGLE-3's keys and values (Medusa keeps none)
        self.cache: HeadCache | None = new_cache() if new_cache is not None else None
        self.pending: list[list[torch.Tensor]] = [[] for _ in range(rows)]  # per row: states [m, len(layers), H]
        self.root: list[torch.Tensor | None] = [None] * rows  # EAGLE-3: row b's output at position L_b - 2 [H]
        self.mask: torch.Tensor | None = None if rows == 1 else torch.zeros((rows, 0), dtype=torch.bool,
                                                                            device=self.device)

    def timed(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), its seconds counted as one forward of the head."""
        t0 = time.perf_counter()
        out = fn(*args)
        sync(self.device)
        self.count(time.perf_counter() - t0)
        return out

    def committed(self, kv: int) -> torch.Tensor:
        """[B, kv] bool: the first kv cache columns that hold each row's committed positions."""
        if self.mask is None:
            return (torch.arange(kv, device=self.device) < self.fed[0])[None]
        out = torch.zeros((len(self.fed), kv), dtype=torch.bool, device=self.device)
        out[:, : self.mask.shape[1]] = self.mask
        return out

    def select(self, rows: list[int]) -> None:
        """Keep only the given rows (indices into the current batch), in that order."""
        super().select(rows)
        self.pending = [self.pending[b] for b in rows]
        self.root = [self.root[b] for b in rows]
        if self.mask is not None:
            self.mask = self.mask[rows]
        if self.cache is not None:
            self.cache.select(rows)


def head_state(state: Counted) -> HeadState:
    """`state` as a head's (the engine asks a DraftHead in the draft role for it): a TypeError otherwise."""
    if not isinstance(state, HeadState):
        raise TypeError(f"a head drafts from its own state (HeadState), got a {type(state).__name__}: bind the head in "
                        "the draft role")
    return state


class HeadDraft(GrowingDraft[HeadState]):
    """Shared by the heads: the states a request carries go to the head's state; no tree cache to keep."""

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        """Take the request's states, then propose chains (grower None) or trees."""
        self.take(d)
        return self.propose_chain(buf, d) if self.grower is None else super().propose(buf, d)

    def take(self, d: Drafting) -> None:
        """Row b's target states [len(layers), m, H] (none before its first verify) join its pending ones."""
        for b, states in enumerate(d.states):
            if states is not None:
                self.state.pending[b].append(states.transpose(0, 1).to(self.state.device))

    def propose_chain(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        raise NotImplementedError(f"{type(self).__name__} proposes trees only")


@dataclass
class HeadNodes:
    """One row's drafted nodes for an EAGLE-3 head forward: node j reads (o of its parent, x_j) at head position
    L - 2 + depth_j and attends to the row's committed positions, its ancestors' cache columns and itself."""

    parents: list[torch.Tensor]  # [n] the parents' head outputs [H] (the root's: the row's root output)
    tokens: list[int]  # [n]
    depths: list[int]  # [n]
    ancestors: list[list[int]]  # [n] the cache columns of each node's ancestors


class Eagle3Draft(HeadDraft):
    """EAGLE-3's proposals for B rows: chains (grower None) or trees grown by `grower`, the rows' positions read in
    one head forward per step."""

    def __init__(self, state: HeadState, grower: Grower | None = None) -> None:
        super().__init__(state, grower)
        self.out: list[dict[int, torch.Tensor]] = []  # per row: grown node -> its head output [H]
        self.col: list[dict[int, int]] = []  # per row: grown node -> its cache column
        self.kept = 0  # cache columns after the last read of committed positions (nodes come after them)

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
        """x_1 ~ q at the root, then x_i ~ q_i from the head's output at x_{i-1}, until each row's policy stops."""
        B = len(d.L)
        live = [b for b in range(B) if d.w_max[b] > 0]
        q = {b: v for b, v in self.roots(buf, d, live).items() if v is not None} if live else {}
        chains = [Chain(p, m, d.eos_ids, d.sampler.vocab_size) for p, m in zip(d.policies, d.w_max)]
        o = {b: r for b in q if (r := self.state.root[b]) is not None}  # row b's last output [H]: root, then drafts
        cols: dict[int, list[int]] = {b: [] for b in q}  # the cache columns of row b's drafts read so far
        open_, depth = list(q), 0
        while open_:
            probs = torch.zeros((B, d.sampler.vocab_size), device=self.state.device)
            probs[open_] = torch.stack([q[b] for b in open_]).to(probs.dtype)
            x = d.sampler.pick(probs, d.generators, open_).tolist()
            depth += 1
            open_ = [b for b in open_ if chains[b].take(x[b], q[b])]
            if open_:
                out = self.feed({b: HeadNodes([o[b]], [x[b]], [depth], [cols[b]]) for b in open_}, d.L, d)
                for b in open_:
                    o[b], q[b], cols[b] = out[b][0][0], out[b][1][0], cols[b] + out[b][2]
        return [chains[b].proposal(self.steps) if b in o else
                chain([], why="length" if d.w_max[b] <= 0 else "source", steps=self.steps) for b in range(B)]

    def roots(self, buf: torch.Tensor, d: Drafting, live: list[int]) -> dict[int, torch.Tensor | None]:
        """Read each row's committed pairs not read yet, in one forward; q at the root [V] of each live row, from its
        output at position L_b - 2."""
        s, head, B = self.state, self.head, len(d.L)
        self.steps, self.out, self.col = 0, [{} for _ in range(B)], [{} for _ in range(B)]
        if any(s.pending):
            f = [torch.cat(p).flatten(1) if p else None for p in s.pending]  # [m_b, len(layers) H]: low, mid, high
            m = [0 if x is None else x.shape[0] for x in f]
            for b in range(B):
                if m[b] and s.fed[b] + m[b] != d.L[b] - 1:
                    raise RuntimeError(f"row {b}: the head has read {s.fed[b]} positions and got {m[b]} states; "
                                       f"{d.L[b] - 1} are committed")
            self.read(buf, d, f, m)
        self.kept = self.cache.length
        outs = {b: o for b in live if (o := s.root[b]) is not None}
        if not outs:
            return {b: None for b in live}
        with torch.inference_mode():
            q = d.sampler.probs(head.target_logits(torch.stack(list(outs.values()))))  # [len(outs), V]
        at = {b: i for i, b in enumerate(outs)}
        return {b: (q[at[b]] if b in at else None) for b in live}

    def read(self, buf: torch.Tensor, d: Drafting, f: list[torch.Tensor | None], m: list[int]) -> None:
        """One head forward of row b's m_b committed pairs (f_t, x_{t+1}), t = fed_b..L_b-2, right-aligned (holes on
        the left attend to themselves only); row b's root output becomes its last one."""
        s, head, B, M = self.state, self.head, len(d.L), max(m)
        kv0, dev = self.cache.length, s.device
        width = next(x for x in f if x is not None).shape[1]
        feats = torch.zeros((B, M, width), dtype=head.fc.weight.dtype, device=dev)
        ids = torch.zeros((B, M), dtype=torch.long, device=dev)
        pos = torch.zeros((B, M), dtype=torch.long, device=dev)
        for b, x in enumerate(f):
            if x is not None:
                feats[b, M - m[b] :] = x.to(feats.dtype)
                ids[b, M - m[b] :] = buf[b, s.fed[b] + 1 : d.L[b]].to(dev)
                pos[b, M - m[b] :] = torch.arange(s.fed[b], d.L[b] - 1, device=dev)
        c = torch.arange(M, device=dev)
        new = c[None] >= torch.tensor([M - k for k in m], device=dev)[:, None]  # [B, M] the rows' positions
        allowed = torch.zeros((B, M, kv0 + M), dtype=torch.bool, device=dev)
        allowed[:, :, :kv0] = s.committed(kv0)[:, None] & new[:, :, None]
        allowed[:, :, kv0:] = (new[:, None] & (c[None, None] <= c[None, :, None])) | torch.eye(M, dtype=torch.bool,
                                                                                                 device=dev)
        with torch.inference_mode():
            o = s.timed(head.step, feats, ids, pos, allowed, self.cache)  # [B, M, H]
        s.root = [o[b, -1] if m[b] else s.root[b] for b in range(B)]
        s.fed = [d.L[b] - 1 if m[b] else s.fed[b] for b in range(B)]
        s.pending = [[] for _ in range(B)]
        if s.mask is not None:
            s.mask = torch.cat([s.committed(kv0), new], dim=1)
        self.steps = 1

    def feed(self, rows: dict[int, HeadNodes], L: list[int], d: Drafting
             ) -> dict[int, tuple[torch.Tensor, torch.Tensor, list[int]]]:
        """One head forward of each row's nodes, right-aligned: row b's outputs [n_b, H], q [n_b, V] and the cache
        columns they were written to."""
        s, head, B = self.state, self.head, len(L)
        kv0, dev = self.cache.length, s.device
        N = max(len(r.tokens) for r in rows.values())
        first = {b: kv0 + N - len(r.tokens) for b, r in rows.items()}  # row b's first node column
        H = next(iter(rows.values())).parents[0].shape[-1]
        par = torch.zeros((B, N, H), dtype=next(iter(rows.values())).parents[0].dtype, device=dev)
        ids = torch.zeros((B, N), dtype=torch.long, device=dev)
        pos = torch.zeros((B, N), dtype=torch.long, device=dev)
        allowed = torch.zeros((B, N, kv0 + N), dtype=torch.bool, device=dev)
        allowed[:, :, :kv0] = s.committed(kv0)[:, None]
        allowed[:, torch.arange(N), kv0 + torch.arange(N)] = True  # every query (holes too) attends to itself
        for b, r in rows.items():
            k0 = N - len(r.tokens)
            par[b, k0:] = torch.stack(r.parents)
            ids[b, k0:] = torch.tensor(r.tokens, device=dev)
            pos[b, k0:] = torch.tensor([L[b] - 2 + dep for dep in r.depths], device=dev)
            for k, cols in enumerate(r.ancestors):
                allowed[b, k0 + k, cols] = True
        idle = [b for b in range(B) if b not in rows]
        allowed[idle, :, :kv0] = False  # a row without nodes feeds holes
        with torch.inference_mode():
            o = s.timed(head.step, par, ids, pos, allowed, self.cache)
            q = d.sampler.probs(head.target_logits(o))  # [B, N, V]
        self.steps += 1
        return {b: (o[b, N - len(r.tokens) :], q[b, N - len(r.tokens) :],
                    list(range(first[b], kv0 + N))) for b, r in rows.items()}

    def grow(self, trees: dict[int, Grown], grow: dict[int, list[int]], buf: torch.Tensor, d: Drafting
             ) -> dict[int, torch.Tensor]:
        """q at each row's grown nodes [len(grow[b]), V], every row's fed in one head forward."""
        rows = {}
        for b, js in grow.items():
            t, ancestors = trees[b], []
            for j in js:
                a, cols = t.parents[j], []
                while a >= 0:
                    cols.append(self.col[b][a])
                    a = t.parents[a]
                ancestors.append(cols)
            root = self.state.root[b]
            assert root is not None  # the tree grows after roots() gave q there, from the head's output at the root
            parents = [self.out[b][t.parents[j]] if t.parents[j] >= 0 else root for j in js]
            rows[b] = HeadNodes(parents, [t.tokens[j] for j in js], [len(t.path(j)) for j in js], ancestors)
        out = self.feed(rows, d.L, d)
        for b, js in grow.items():
            o, _, cols = out[b]
            self.out[b].update({j: o[k] for k, j in enumerate(js)})
            self.col[b].update({j: cols[k] for k, j in enumerate(js)})
        return {b: out[b][1] for b in grow}

    def rollback(self, lengths: list[int], paths: list[list[int]]) -> None:
        """The head's cache keeps the committed positions: accepted drafts are read again with the target's states."""
        self.cache.crop(self.kept)
        self.index = []


class MedusaDraft(HeadDraft):
    """Medusa's trees for B rows: the heads once at each row's last committed state, children by depth from q_{d+1}."""

    def roots(self, buf: torch.Tensor, d: Drafting, live: list[int]) -> dict[int, torch.Tensor | None]:
        """q_1..q_k [k, V] from each live row's state at position L_b - 2, in one call; q at the root is q_1."""
        s, heads = self.state, self.state.model
        read = [b for b in live if s.pending[b]]
        self.qs: dict[int, torch.Tensor] = {}
        if read:
            h = torch.stack([s.pending[b][-1][-1, -1] for b in read])  # [n, H]: the last position, last layer index
            with torch.inference_mode():
                qs = d.sampler.probs(s.timed(heads, h.to(medusa_dtype(heads))))  # [n, k, V]
            self.qs = {b: qs[i] for i, b in enumerate(read)}
            self.steps = 1
        s.pending = [[] for _ in s.pending]
        return {b: self.qs[b][0] if b in self.qs else None for b in live}

    def grow(self, trees: dict[int, Grown], grow: dict[int, list[int]], buf: torch.Tensor, d: Drafting
             ) -> dict[int, torch.Tensor]:
        """q at a node of depth d is head d + 1's (no forward)."""
        return {b: torch.stack([self.qs[b][len(trees[b].path(j))] for j in js]) for b, js in grow.items()}

    def rollback(self, lengths: list[int], paths: list[list[int]]) -> None:
        self.index = []


def medusa_dtype(heads: torch.nn.Module) -> torch.dtype:
    """The dtype of Medusa's heads (MedusaHeads: Sequentials ending in a Linear), its first head's output layer's."""
    first = heads[0] if isinstance(heads, torch.nn.ModuleList) else None
    last = first[-1] if isinstance(first, torch.nn.Sequential) else None
    if not isinstance(last, torch.nn.Linear):
        raise TypeError(f"Medusa heads are a ModuleList of Sequentials ending in a Linear, got {type(heads).__name__}")
    return last.weight.dtype
