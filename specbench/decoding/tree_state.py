"""Tree attention on one row (`TreeState`, the state of a model that verifies or grows trees): feed a proposal's
nodes in one forward, then keep only the accepted path.

The cache holds the row's committed tokens (columns 0..fed-1) followed by tree nodes (columns fed.., their proposal
indices in tree_nodes). Node j attends to the committed columns, its ancestors and itself, at position
L - 1 + d(j) (L = committed tokens, d = depth), so its keys, values and logits equal those of a causal forward of
prefix + j's root path. The mask is an additive float [1, 1, q, kv] mask, which transformers' masking_utils passes
through as is (a 4-D mask is "already prepared") and eager and sdpa attention add to the scores.
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
    """A one-row ModelState that also feeds and keeps trees: after the committed columns its cache may hold tree
    nodes, listed with their root paths. An ordinary forward (ModelState.forward) serves the chains in between."""

    def __init__(self, model: CausalLM) -> None:
        super().__init__(model, 1)
        self.tree_nodes: list[int] = []  # the tree nodes in the cache after the committed columns, in column order
        self.tree_paths: dict[int, list[int]] = {}  # node -> its ancestors and itself, root side first
        self.check()

    def check(self) -> None:
        """Refuse what tree attention cannot serve: flash attention, sliding-window or linear layers."""
        impl = str(self.model.config._attn_implementation or "")
        if "flash" in impl:
            raise ValueError(f"tree attention needs an arbitrary 4-D attention mask, which {impl!r} cannot take; "
                             "load the model with attn_implementation='sdpa' or 'eager'")
        if any(self.cache.is_sliding) or any(getattr(layer, "keys", False) is False for layer in self.cache.layers):
            raise ValueError("tree attention needs full-attention cache layers (no sliding-window or linear layers)")

    @torch.inference_mode()
    def feed_tree(self, buf: torch.Tensor, upto: int, tokens: list[int], parents: list[int], cached: list[int],
                  keep_root: bool, nodes: list[int] | None = None, layers: tuple[int, ...] = ()) -> torch.Tensor:
        """Feed buf[0, fed:upto] causally then the new nodes `tokens` [n] in one forward; logits [1, keep_root + n, V]:
        the root's (at the last committed token) when keep_root, then each new node's. parents [n] index the whole
        proposal (-1 = root; a parent is the root, a cached node or an earlier new node); `cached` == tree_nodes, the
        cached nodes in column order; `nodes` [n] the new nodes' indices (default: len(cached) + k). With `layers`,
        their states of every fed column go to hidden [len(layers), 1, upto - fed + n, H]."""
        t0 = time.perf_counter()
        tree, fed, dev = list(self.tree_nodes), self.fed[0], self.device
        if list(cached) != tree:
            raise ValueError(f"cached {list(cached)} differs from the tree nodes in the cache {tree}")
        if tree and upto != fed:
            raise ValueError("committed tokens cannot be fed after tree nodes (call keep_path first)")
        n_c, n = upto - fed, len(tokens)
        if n_c < 0 or (keep_root and n_c == 0) or n_c + n == 0:
            raise ValueError(f"fed {fed}, upto {upto}, {n} nodes, keep_root {keep_root}: keep_root needs a committed "
                             "token to feed, and a forward needs something to feed")
        nodes = list(range(len(tree), len(tree) + n)) if nodes is None else list(nodes)
        paths = dict(self.tree_paths)
        for j, a in zip(nodes, parents):
            if a >= 0 and a not in paths:
                raise ValueError(f"node {j}'s parent {a} is neither cached nor fed before it")
            paths[j] = (paths[a] if a >= 0 else []) + [j]
        col = {j: upto + c for c, j in enumerate(tree + nodes)}  # cache column of each tree node
        prior = fed + len(tree)  # columns already in the cache
        if self.cache.get_seq_length() != prior:
            raise ValueError(f"the cache holds {self.cache.get_seq_length()} columns, the state expects {prior}")
        q, kv = n_c + n, prior + n_c + n
        allowed = torch.zeros((q, kv), dtype=torch.bool, device=dev)
        # committed query i (column fed + i) attends to columns c <= fed + i
        allowed[:n_c] = torch.arange(kv, device=dev)[None] <= torch.arange(fed, upto, device=dev)[:, None]
        allowed[n_c:, :upto] = True  # every node attends to the committed prefix
        rows = [n_c + k for k, j in enumerate(nodes) for _ in paths[j]]
        cols = [col[a] for j in nodes for a in paths[j]]  # ... and to its root path (ancestors and itself)
        allowed[rows, cols] = True
        dtype = self.model.dtype
        mask = torch.zeros((1, 1, q, kv), dtype=dtype, device=dev).masked_fill(~allowed, torch.finfo(dtype).min)
        # positions: committed fed..upto-1; node j at upto - 1 + d(j), d(j) = len(paths[j])
        pos = torch.tensor([list(range(fed, upto)) + [upto - 1 + len(paths[j]) for j in nodes]], device=dev)
        ids = torch.cat([buf[0, fed:upto].to(dev), torch.tensor(tokens, dtype=torch.long, device=dev)])[None]
        keep = int(keep_root) + n
        extra = {"output_hidden_states": True} if layers else {}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=self.cache, use_cache=True,
                         logits_to_keep=max(keep, 1), **extra)
        if layers:
            self.hidden = torch.stack([out.hidden_states[k] for k in layers])
        sync(dev)
        self.count(time.perf_counter() - t0, q)
        self.fed, self.columns = [upto], kv
        self.tree_nodes, self.tree_paths = tree + nodes, paths
        return out.logits[:, out.logits.shape[1] - keep:]

    @torch.inference_mode()
    def keep_path(self, length: int, path: list[int]) -> None:
        """Keep the first `length` committed columns, then the cached nodes of `path` (its cached prefix) in path
        order; drop every other tree node in every layer. transformers can remove only the last columns
        (Cache.crop), so a non-prefix selection index_selects each layer's keys/values [B, heads, seq, head_dim]."""
        tree, fed = list(self.tree_nodes), self.fed[0]
        if not 0 <= length <= fed:
            raise ValueError(f"length {length} is outside the committed tokens 0..{fed}")
        m = 0
        while m < len(path) and path[m] in tree:  # the path's nodes in the cache are a prefix of it
            m += 1
        if m and length < fed:
            raise ValueError("tree nodes attended to all committed tokens: they cannot be kept when some are dropped")
        keep = list(range(length)) + [fed + tree.index(j) for j in path[:m]]
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
        self.tree_nodes, self.tree_paths = [], {}


def tree_state(state: Counted) -> TreeState:
    """`state` as a TreeState (the engine gives one to every model role of a method whose parts propose trees): a
    TypeError otherwise."""
    if not isinstance(state, TreeState):
        raise TypeError(f"trees need the state of a model with tree attention (TreeState), got a "
                        f"{type(state).__name__}")
    return state
