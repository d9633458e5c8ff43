"""The trees B rows hold in a model's cache (`Forest`), and the block of one tree-attention forward (`Block`): shared
by the eager TreeState (specbench.decoding.tree_state) and the compiled StaticState (specbench.decoding.compiled).

Row b's cache holds its committed tokens, then the tree nodes it was fed since its last keep (node j at the column
tree_cols[b][j], its root path tree_paths[b][j]). A forward feeds row b's uncached committed tokens
buf[b, fed_b:upto_b] causally, then its new nodes, the rows right-aligned in a block of width
K = max_b (k_b + n_b) (holes on the left). allowed[b, i, c] says whether the block's query i of row b sees cache
column c: a committed query sees the row's committed columns and its new tokens up to itself; node j sees the
row's committed columns, its new committed tokens, its ancestors and itself, at position upto_b - 1 + d(j)
(d = depth), so its keys, values and logits equal those of a causal forward of prefix + j's root path; a hole
sees itself only (a row with no query left would be a softmax over nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Block:
    """One tree-attention forward of B rows: what it feeds and how it attends, and the forest after it."""

    ids: torch.Tensor  # [B, K] tokens (0 at holes)
    pos: torch.Tensor  # [B, K] position ids
    allowed: torch.Tensor  # [B, K, prior + K] bool
    new: torch.Tensor  # [B, K] bool: the block's committed tokens
    nodes: list[list[int]]  # [B][n_b] the new nodes' names
    paths: list[dict[int, list[int]]]  # per row: node -> root path, the new nodes' included
    cols: list[dict[int, int]]  # per row: node -> cache column, the new nodes' included

    @property
    def width(self) -> int:
        return self.ids.shape[1]


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask [B, 1, q, kv] of allowed [B, q, kv]: 0 where allowed, the dtype's minimum
    elsewhere (transformers' masking_utils passes a 4-D mask through as prepared; eager and sdpa add it)."""
    zeros = torch.zeros((allowed.shape[0], 1, *allowed.shape[1:]), dtype=dtype, device=allowed.device)
    return zeros.masked_fill(~allowed[:, None], torch.finfo(dtype).min)


class Forest:
    """Each row's tree nodes in the cache: their names in fed order, root paths and cache columns."""

    def __init__(self, rows: int) -> None:
        self.nodes: list[list[int]] = [[] for _ in range(rows)]
        self.paths: list[dict[int, list[int]]] = [{} for _ in range(rows)]
        self.cols: list[dict[int, int]] = [{} for _ in range(rows)]

    def grow_paths(self, fed: list[int], upto: list[int], tokens: list[list[int]], parents: list[list[int]],
                   nodes: list[list[int]]) -> tuple[list[dict[int, list[int]]], int, list[int]]:
        """Row b's root paths with its new nodes (parents [n_b] index the whole proposal: -1 = root, a cached node or
        an earlier new node), the block width K and each row's first block column K - k_b - n_b."""
        paths = [dict(p) for p in self.paths]
        for b, (u, f) in enumerate(zip(upto, fed)):
            if u < f or (self.nodes[b] and u != f):
                raise ValueError(f"row {b}: fed {f}, upto {u}: committed tokens are fed before tree nodes, never "
                                 "after them (keep_paths first)")
            for j, a in zip(nodes[b], parents[b]):
                if a >= 0 and a not in paths[b]:
                    raise ValueError(f"row {b}: node {j}'s parent {a} is neither cached nor fed before it")
                paths[b][j] = (paths[b][a] if a >= 0 else []) + [j]
        k = [u - f + len(t) for u, f, t in zip(upto, fed, tokens)]
        if max(k) == 0:
            raise ValueError("a forward needs something to feed: no row has a committed token or a node")
        return paths, max(k), [max(k) - n for n in k]

    def block(self, buf: torch.Tensor, fed: list[int], upto: list[int], tokens: list[list[int]],
              parents: list[list[int]], nodes: list[list[int]] | None, committed: torch.Tensor) -> Block:
        """The forward feeding row b buf[b, fed_b:upto_b] then its nodes tokens[b] (named nodes[b], default:
        numbered on from its cached ones) after the cache's prior columns, committed [B, prior] bool marking each
        row's committed ones."""
        B, prior, dev = len(fed), committed.shape[1], committed.device
        nodes = nodes or [list(range(len(c), len(c) + len(t))) for c, t in zip(self.nodes, tokens)]
        paths, K, start = self.grow_paths(fed, upto, tokens, parents, nodes)
        first = [s + u - f for s, u, f in zip(start, upto, fed)]  # row b's first node column in the block
        cols = [dict(c) for c in self.cols]
        for b in range(B):
            cols[b].update({j: prior + first[b] + i for i, j in enumerate(nodes[b])})
        c = torch.arange(K, device=dev)
        s_, f_ = torch.tensor(start, device=dev)[:, None], torch.tensor(first, device=dev)[:, None]
        new = (c >= s_) & (c < f_)  # [B, K] the block's committed tokens
        allowed = torch.zeros((B, K, prior + K), dtype=torch.bool, device=dev)
        allowed[:, :, :prior] = committed[:, None] & (c >= s_)[:, :, None]  # a row's queries: its prefix
        allowed[:, :, prior:] = new[:, None] & (c[None, :, None] >= c[None, None])  # ... its new tokens, causally
        allowed[:, c, prior + c] |= (c < s_)  # a hole attends to itself only
        trip = [(b, first[b] + i, cols[b][a]) for b in range(B) for i, j in enumerate(nodes[b]) for a in paths[b][j]]
        if trip:  # ... and node j to its root path (ancestors and itself)
            allowed[tuple(torch.tensor(trip, device=dev).T)] = True
        ids = torch.zeros((B, K), dtype=torch.long, device=dev)
        pos = torch.zeros((B, K), dtype=torch.long, device=dev)
        for b in range(B):  # committed fed..upto-1 at their buffer index; node j at upto - 1 + d(j)
            ids[b, start[b] : first[b]] = buf[b, fed[b] : upto[b]].to(dev)
            ids[b, first[b] :] = torch.tensor(tokens[b], dtype=torch.long, device=dev)
            pos[b, start[b] :] = torch.tensor(list(range(fed[b], upto[b])) +
                                              [upto[b] - 1 + len(paths[b][j]) for j in nodes[b]], device=dev)
        return Block(ids, pos, allowed, new, nodes, paths, cols)

    def commit(self, block: Block) -> None:
        """After the block's forward: its nodes are in the cache."""
        self.nodes = [t + n for t, n in zip(self.nodes, block.nodes)]
        self.paths, self.cols = block.paths, block.cols

    def kept(self, lengths: list[int], paths: list[list[int]], fed: list[int]) -> tuple[list[int], list[list[int]]]:
        """For keep_paths: row b's committed tokens kept (lengths[b], at most fed[b]; a row without tree nodes keeps
        what it has) and the columns of paths[b]'s cached prefix, in path order; then the forest is empty."""
        lengths, keep = list(lengths), []
        for b, (n, path) in enumerate(zip(lengths, paths)):
            tree = self.nodes[b]
            if not tree and n >= fed[b]:
                lengths[b] = n = fed[b]
            if not 0 <= n <= fed[b]:
                raise ValueError(f"row {b}: length {n} is outside the committed tokens 0..{fed[b]}")
            m = 0
            while m < len(path) and path[m] in tree:  # the path's nodes in the cache are a prefix of it
                m += 1
            if m and n < fed[b]:
                raise ValueError("tree nodes attended to all committed tokens: they cannot be kept when some are "
                                 "dropped")
            keep.append([self.cols[b][j] for j in path[:m]])
        self.nodes, self.paths, self.cols = [[] for _ in fed], [{} for _ in fed], [{} for _ in fed]
        return lengths, keep

    def select(self, rows: list[int]) -> None:
        """Keep the given rows (batch indices), in that order."""
        self.nodes = [self.nodes[b] for b in rows]
        self.paths = [self.paths[b] for b in rows]
        self.cols = [self.cols[b] for b in rows]
