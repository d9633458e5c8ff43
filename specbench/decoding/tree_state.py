"""Tree attention over B >= 1 rows on the eager path (`TreeState`, the state of a model that verifies or grows
trees): feed each row's proposal nodes in one forward (the block and mask: specbench.decoding.forest), then keep
only each row's accepted path. A kept path's nodes sit at their own positions, so several rows keep them where they
are and unmask them in the hole mask; one row index-selects them into place (its cache stays compact).
"""

from __future__ import annotations

import time

import torch
from transformers.cache_utils import CacheLayerMixin

from specbench.decoding.compiled import StaticState
from specbench.decoding.forest import Forest, additive
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
        self.forest = Forest(rows)  # each row's tree nodes in the cache
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

    @torch.inference_mode()
    def feed_trees(self, buf: torch.Tensor, upto: list[int], tokens: list[list[int]], parents: list[list[int]],
                   keep_root: bool, nodes: list[list[int]] | None = None, layers: tuple[int, ...] = ()
                   ) -> torch.Tensor:
        """Feed each row b buf[b, fed_b:upto_b] causally then its new nodes tokens[b] [n_b], all rows in one forward
        (specbench.decoding.forest); logits [B, keep_root + max n_b, V], right-aligned: row b's root (its last
        committed token, when keep_root and it fed one) then its nodes in its last n_b columns. nodes[b] [n_b] name
        the new nodes. With `layers`, their states [len(layers), B, K, H] go to take_hidden."""
        t0 = time.perf_counter()
        if self.cache.get_seq_length() != self.columns:
            raise ValueError(f"the cache holds {self.cache.get_seq_length()} columns, the state expects {self.columns}")
        block = self.forest.block(buf, self.fed, upto, tokens, parents, nodes, self.committed())
        keep = max(1, int(keep_root) + max(len(t) for t in tokens))
        extra = {"output_hidden_states": True} if layers else {}
        out = self.model(input_ids=block.ids, attention_mask=additive(block.allowed, self.model.dtype),
                         position_ids=block.pos, cache=self.cache, use_cache=True, logits_to_keep=keep, **extra)
        if layers:
            self.hidden = torch.stack([out.hidden_states[k] for k in layers])
        sync(self.device)
        self.count(time.perf_counter() - t0, block.width)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, block.new.long()], dim=1)
        self.fed, self.columns = list(upto), self.columns + block.width
        self.forest.commit(block)
        return out.logits[:, out.logits.shape[1] - keep :]

    @torch.inference_mode()
    def keep_paths(self, lengths: list[int], paths: list[list[int]]) -> None:
        """Row b keeps its first lengths[b] committed tokens, then the cached nodes of paths[b] (its cached prefix) in
        path order; every other tree node is dropped. A row without tree nodes and lengths[b] >= fed[b] keeps all."""
        lengths, keep = self.forest.kept(lengths, paths, self.fed)
        if self.mask is None:
            self.keep_columns(list(range(lengths[0])) + keep[0])
            return
        self.mask = self.mask.clone()
        for b, k in enumerate(keep):
            self.mask[b, k] = 1
        self.fed = [f + len(k) for f, k in zip(self.fed, keep)]
        self.crop([n + len(k) for n, k in zip(lengths, keep)])
        self.trim()  # the dropped nodes' columns at the end

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
        self.forest.select(rows)


def tree_state(state: Counted) -> TreeState | StaticState:
    """`state` as one that feeds and keeps trees (the engine gives one to every model role of a method whose parts
    propose trees: a TreeState, or on the compiled path a StaticState): a TypeError otherwise."""
    if not isinstance(state, (TreeState, StaticState)):
        raise TypeError(f"trees need the state of a model with tree attention (TreeState), got a "
                        f"{type(state).__name__}")
    return state
