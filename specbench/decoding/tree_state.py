"""Tree attention over B >= 1 rows (`TreeState`, the state of a model that verifies or grows trees): feed each
row's proposal nodes in one forward, then keep only each row's accepted path.

A row's cache holds its committed tokens followed by its tree nodes (their proposal indices in tree_nodes[b], their
columns in tree_cols[b]). Node j attends to the row's committed columns, its ancestors and itself, at position
L - 1 + d(j) (L = committed tokens, d = depth), so its keys, values and logits equal those of a causal forward of
prefix + j's root path. Rows are right-aligned in a block as ModelState.block aligns chains (holes on the left).
The mask is an additive float [B, 1, q, kv] mask, which transformers' masking_utils passes through as is (a 4-D
mask is "already prepared") and eager and sdpa attention add to the scores. A kept path's nodes sit at their own
positions, so several rows keep them where they are and unmask them; one row index-selects them into place.
"""

from __future__ import annotations

import time

import torch
from transformers.cache_utils import CacheLayerMixin

from specbench.decoding.state import CausalLM, Counted, ModelState, keep_first, sync


def tree_mask_refusal(model: torch.nn.Module) -> str | None:
    """Why `model` cannot verify or grow a tree with an arbitrary attention mask, from its config (None: it can):
    flash attention takes no 4-D mask; sliding-window and linear-attention (or state-space) layers keep no full
    cache to mask."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    impl = str(getattr(config, "_attn_implementation", "") or "")
    if "flash" in impl:
        return (f"its attention implementation {impl!r} takes no arbitrary 4-D attention mask; load it with "
                "attn_implementation: sdpa or eager (the pair's model config)")
    kinds = sorted(set(getattr(text, "layer_types", None) or []) - {"full_attention"})
    if kinds:
        return f"it has {', '.join(kinds)} layers (layer_types), which keep no full cache for a tree mask"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return f"it attends within a sliding window of {text.sliding_window} tokens, which a tree mask cannot span"
    if any(k in str(getattr(text, "model_type", "")) for k in ("mamba", "rwkv", "jamba")):
        return f"its {text.model_type} layers are recurrent, with no attention to mask"
    return None


class TreeState(ModelState):
    """A ModelState over B rows that also feeds and keeps trees: after its committed columns a row's cache may hold
    tree nodes, listed with their root paths and cache columns. An ordinary forward (ModelState.forward) serves the
    chains in between. One row keeps its cache compact (a kept path is index-selected into place); several rows
    share the columns, a row's committed ones marked in the hole mask and its tree nodes' left at 0 until kept."""

    def __init__(self, model: CausalLM, rows: int = 1) -> None:
        super().__init__(model, rows)
        self.tree_nodes: list[list[int]] = [[] for _ in range(rows)]  # row b's tree nodes in the cache, fed order
        self.tree_paths: list[dict[int, list[int]]] = [{} for _ in range(rows)]  # node -> its root path, root first
        self.tree_cols: list[dict[int, int]] = [{} for _ in range(rows)]  # node -> its cache column
        self.check()

    def check(self) -> None:
        """Refuse what tree attention cannot serve: flash attention, sliding-window or linear layers."""
        impl = str(self.model.config._attn_implementation or "")
        if "flash" in impl:
            raise ValueError(f"tree attention needs an arbitrary 4-D attention mask, which {impl!r} cannot take; "
                             "load the model with attn_implementation='sdpa' or 'eager'")
        if any(self.cache.is_sliding) or any(getattr(layer, "keys", False) is False for layer in self.cache.layers):
            raise ValueError("tree attention needs full-attention cache layers (no sliding-window or linear layers)")

    def committed(self) -> torch.Tensor:
        """[B, columns] bool: the cache columns holding each row's committed tokens (not holes, not tree nodes)."""
        if self.mask is not None:
            return self.mask.bool()
        return (torch.arange(self.columns, device=self.device) < self.fed[0])[None]

    def grow_paths(self, upto: list[int], tokens: list[list[int]], parents: list[list[int]],
                   nodes: list[list[int]]) -> tuple[list[dict[int, list[int]]], int, list[int]]:
        """Row b's root paths with its new nodes (parents [n_b] index the whole proposal: -1 = root, a cached node or
        an earlier new node), the block width K = max_b (k_b + n_b), k_b = upto[b] - fed[b] committed tokens, and
        each row's first block column K - k_b - n_b (rows right-aligned, holes on the left)."""
        paths = [dict(p) for p in self.tree_paths]
        for b, (u, f) in enumerate(zip(upto, self.fed)):
            if u < f or (self.tree_nodes[b] and u != f):
                raise ValueError(f"row {b}: fed {f}, upto {u}: committed tokens are fed before tree nodes, never "
                                 "after them (keep_paths first)")
            for j, a in zip(nodes[b], parents[b]):
                if a >= 0 and a not in paths[b]:
                    raise ValueError(f"row {b}: node {j}'s parent {a} is neither cached nor fed before it")
                paths[b][j] = (paths[b][a] if a >= 0 else []) + [j]
        k = [u - f + len(t) for u, f, t in zip(upto, self.fed, tokens)]
        if max(k) == 0:
            raise ValueError("a forward needs something to feed: no row has a committed token or a node")
        return paths, max(k), [max(k) - n for n in k]

    @torch.inference_mode()
    def feed_trees(self, buf: torch.Tensor, upto: list[int], tokens: list[list[int]], parents: list[list[int]],
                   keep_root: bool, nodes: list[list[int]] | None = None, layers: tuple[int, ...] = ()
                   ) -> torch.Tensor:
        """Feed each row b buf[b, fed_b:upto_b] causally then its new nodes tokens[b] [n_b], all rows in one forward;
        logits [B, keep_root + max n_b, V], right-aligned: row b's root (its last committed token, when keep_root and
        it fed one) then its nodes in its last n_b columns. nodes[b] [n_b] name the new nodes (default: numbered on
        from the row's cached ones). Node j attends to the row's committed columns, its ancestors and itself, at
        position upto_b - 1 + depth(j). With `layers`, their states [len(layers), B, K, H] go to take_hidden."""
        t0 = time.perf_counter()
        B, dev, prior = len(self.fed), self.device, self.columns
        nodes = nodes or [list(range(len(c), len(c) + len(t))) for c, t in zip(self.tree_nodes, tokens)]
        paths, K, start = self.grow_paths(upto, tokens, parents, nodes)
        if self.cache.get_seq_length() != prior:
            raise ValueError(f"the cache holds {self.cache.get_seq_length()} columns, the state expects {prior}")
        first = [s + u - f for s, u, f in zip(start, upto, self.fed)]  # row b's first node column in the block
        cols = [dict(c) for c in self.tree_cols]
        for b in range(B):
            cols[b].update({j: prior + first[b] + i for i, j in enumerate(nodes[b])})
        c = torch.arange(K, device=dev)
        s_, f_ = torch.tensor(start, device=dev)[:, None], torch.tensor(first, device=dev)[:, None]
        new = (c >= s_) & (c < f_)  # [B, K] the block's committed tokens
        allowed = torch.zeros((B, K, prior + K), dtype=torch.bool, device=dev)
        allowed[:, :, :prior] = self.committed()[:, None] & (c >= s_)[:, :, None]  # a row's queries: its prefix
        allowed[:, :, prior:] = new[:, None] & (c[None, :, None] >= c[None, None])  # ... its new tokens, causally
        allowed[:, c, prior + c] |= (c < s_)  # a hole attends to itself only
        trip = [(b, first[b] + i, cols[b][a]) for b in range(B) for i, j in enumerate(nodes[b]) for a in paths[b][j]]
        if trip:  # ... and node j to its root path (ancestors and itself)
            allowed[tuple(torch.tensor(trip, device=dev).T)] = True
        dtype = self.model.dtype
        mask = torch.zeros((B, 1, K, prior + K), dtype=dtype, device=dev).masked_fill(~allowed[:, None],
                                                                                      torch.finfo(dtype).min)
        ids = torch.zeros((B, K), dtype=torch.long, device=dev)
        pos = torch.zeros((B, K), dtype=torch.long, device=dev)
        for b in range(B):  # committed fed..upto-1 at their buffer index; node j at upto - 1 + d(j)
            ids[b, start[b] : first[b]] = buf[b, self.fed[b] : upto[b]].to(dev)
            ids[b, first[b] :] = torch.tensor(tokens[b], dtype=torch.long, device=dev)
            pos[b, start[b] :] = torch.tensor(list(range(self.fed[b], upto[b])) +
                                              [upto[b] - 1 + len(paths[b][j]) for j in nodes[b]], device=dev)
        keep = max(1, int(keep_root) + max(len(t) for t in tokens))
        extra = {"output_hidden_states": True} if layers else {}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=self.cache, use_cache=True,
                         logits_to_keep=keep, **extra)
        if layers:
            self.hidden = torch.stack([out.hidden_states[k] for k in layers])
        sync(dev)
        self.count(time.perf_counter() - t0, K)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, new.long()], dim=1)
        self.fed, self.columns = list(upto), prior + K
        self.tree_nodes = [t + n for t, n in zip(self.tree_nodes, nodes)]
        self.tree_paths, self.tree_cols = paths, cols
        return out.logits[:, out.logits.shape[1] - keep :]

    @torch.inference_mode()
    def keep_paths(self, lengths: list[int], paths: list[list[int]]) -> None:
        """Row b keeps its first lengths[b] committed tokens, then the cached nodes of paths[b] (its cached prefix) in
        path order; every other tree node is dropped. A row without tree nodes and lengths[b] >= fed[b] keeps all."""
        keep: list[list[int]] = []  # per row: the kept path nodes' columns
        lengths = list(lengths)
        for b, (n, path) in enumerate(zip(lengths, paths)):
            tree, fed = self.tree_nodes[b], self.fed[b]
            if not tree and n >= fed:
                lengths[b] = n = fed
            if not 0 <= n <= fed:
                raise ValueError(f"row {b}: length {n} is outside the committed tokens 0..{fed}")
            m = 0
            while m < len(path) and path[m] in tree:  # the path's nodes in the cache are a prefix of it
                m += 1
            if m and n < fed:
                raise ValueError("tree nodes attended to all committed tokens: they cannot be kept when some are "
                                 "dropped")
            keep.append([self.tree_cols[b][j] for j in path[:m]])
        if self.mask is None:
            self.keep_columns(list(range(lengths[0])) + keep[0])
        else:
            self.mask = self.mask.clone()
            for b, k in enumerate(keep):
                self.mask[b, k] = 1
            self.fed = [f + len(k) for f, k in zip(self.fed, keep)]
            self.crop([n + len(k) for n, k in zip(lengths, keep)])
            self.trim()  # the dropped nodes' columns at the end
        self.tree_nodes = [[] for _ in self.fed]
        self.tree_paths, self.tree_cols = [{} for _ in self.fed], [{} for _ in self.fed]

    def keep_columns(self, keep: list[int]) -> None:
        """One row keeps the cache columns `keep`, in that order. transformers can remove only the last columns
        (Cache.crop), so a non-prefix selection index_selects each layer's keys/values [B, heads, seq, head_dim]."""
        if keep == list(range(len(keep))):  # a prefix of the cache
            keep_first(self.cache, len(keep), self.cache.get_seq_length())
        else:
            idx = torch.tensor(keep, device=self.device)
            for layer in self.cache.layers:
                if not isinstance(layer, CacheLayerMixin):  # check() refused linear-attention layers
                    raise ValueError(f"tree attention cannot select the columns of a {type(layer).__name__}")
                if layer.is_initialized:
                    assert layer.keys is not None and layer.values is not None  # an initialized layer holds both
                    layer.keys = layer.keys.index_select(-2, idx.to(layer.keys.device))
                    layer.values = layer.values.index_select(-2, idx.to(layer.values.device))
        self.fed, self.columns = [len(keep)], len(keep)

    def select(self, rows: list[int]) -> None:
        """Keep only the given rows (indices into the current batch), in that order."""
        super().select(rows)
        self.tree_nodes = [self.tree_nodes[b] for b in rows]
        self.tree_paths = [self.tree_paths[b] for b in rows]
        self.tree_cols = [self.tree_cols[b] for b in rows]


def tree_state(state: Counted) -> TreeState:
    """`state` as a TreeState (the engine gives one to every model role of a method whose parts propose trees): a
    TypeError otherwise."""
    if not isinstance(state, TreeState):
        raise TypeError(f"trees need the state of a model with tree attention (TreeState), got a "
                        f"{type(state).__name__}")
    return state
