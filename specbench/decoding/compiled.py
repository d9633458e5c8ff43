"""The compiled decode path (`engine.compile=true`): static KV caches and `torch.compile`d forwards, as in
gpt-fast's generate.py, for one row (batch_size 1), chains and trees.

- Cache: one transformers `StaticCache` per model, allocated for the longest generation seen (capacity a multiple
  of CAPACITY_STEP, so graphs are not rebuilt per prompt length) and reused. Its layers write k new keys at columns
  start..start+k-1, start = the layer's `cumulative_length`; roll-back is a position reset: the next forward sets
  it to the row's kept length, and the stale columns after it are overwritten before any query sees them (a query
  at position t attends to columns <= t only).
- Forwards: k new tokens are padded on the right to the smallest width K >= k of WIDTHS and run the model's
  compiled call (`PreTrainedModel.get_compiled_call`: one graph per width, no dynamic shapes); the causal mask keeps
  the padded columns out of every real token's attention and their logits are dropped. Wider forwards (the
  prefill) and the first forward of a fresh cache (which allocates it) run eagerly on the same cache.
- Trees: a tree forward passes its mask (specbench.decoding.forest) over the cache's whole capacity as a graph
  input, so a width's graph serves every tree of that width (static shapes, the mask's values vary); the nodes are
  written after the row's committed columns and the kept path's keys and values are copied into place after them.
- Timing: CUDA events per forward (state.Clock), read after the engine's synchronisation of the iteration, so a
  fixed-window draft loop (drafts.ModelDraft.propose_on_device) never waits for the device.
Written by hand: transformers' compiled decoding (generate with a static cache) has no draft-verify loop with
roll-back to reuse.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers import PreTrainedModel, StaticCache
from transformers.cache_utils import Cache, StaticLayer
from transformers.generation.configuration_utils import CompileConfig

from specbench.common.options import OptionError
from specbench.decoding.forest import Block, Forest, additive
from specbench.decoding.state import CausalLM, Clock, ModelState

WIDTHS = (1, 2, 4, 8, 16, 32)  # forward widths with a compiled graph; wider forwards run eagerly
CAPACITY_STEP = 256  # static cache columns are allocated in multiples of this
RECOMPILE_LIMIT = 64  # graphs per compiled function: len(WIDTHS) per model and cache capacity

# model -> role -> its static cache (a model playing two roles of one pair gets one cache per role)
_CACHES: "weakref.WeakKeyDictionary[PreTrainedModel, dict[str, StaticCache]]" = weakref.WeakKeyDictionary()


def static_cache(model: PreTrainedModel, need: int, role: str = "target") -> StaticCache:
    """The model's static cache for `role`, [1, heads, capacity, head_dim] per layer with capacity >= need (reused;
    reallocated larger, a multiple of CAPACITY_STEP, when a generation needs more)."""
    caches = _CACHES.setdefault(model, {})
    cache = caches.get(role)
    if cache is None or static_layers(cache)[0].max_cache_len < need:
        capacity = -(-need // CAPACITY_STEP) * CAPACITY_STEP
        cache = StaticCache(config=model.config, max_cache_len=capacity)
        if any(cache.is_sliding):
            raise OptionError(f"engine.compile=true: {model.name_or_path!r} has sliding-window attention layers, "
                              "whose static cache cannot roll back by a position reset; set engine.compile=false")
        caches[role] = cache
    return cache


def static_layers(cache: Cache) -> list[StaticLayer]:
    """The layers of a static cache: StaticCache builds a StaticLayer (or a sliding one, refused) per model layer."""
    layers = [layer for layer in cache.layers if isinstance(layer, StaticLayer)]
    if len(layers) != len(cache.layers):
        raise TypeError("a static cache holds StaticLayers only")
    return layers


def compiled_call(model: PreTrainedModel) -> Any:
    """model's torch.compile'd __call__ (one static graph per input width; CUDA graphs on CUDA)."""
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
    mode = "reduce-overhead" if model.device.type == "cuda" else "default"
    return model.get_compiled_call(CompileConfig(fullgraph=False, dynamic=False, mode=mode))


def width(k: int) -> int | None:
    """The compiled width a forward of k tokens is padded to, None if wider than every graph."""
    return next((w for w in WIDTHS if w >= k), None)


@torch.inference_mode()
def forward_static(model: CausalLM, call: Any, cache: StaticCache, layers: list[StaticLayer], ids: torch.Tensor,
                   start: int) -> torch.Tensor:
    """Logits [1, k, V] of the k tokens ids [1, k] at positions start..start+k-1 after the cache's first
    `start` columns (those after it are overwritten); compiled at width K = width(k), eager when there is none
    or the cache is not allocated yet. layers: static_layers(cache), listed once per state, not per forward."""
    k = ids.shape[1]
    K = width(k)
    for layer in layers:  # roll-back and roll-forward alike: the next write starts at column `start`
        layer.cumulative_length.fill_(start)
    if K is None or not cache.is_initialized:
        pos = torch.arange(start, start + k, device=ids.device)[None]
        return model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True).logits
    pos = torch.arange(start, start + K, device=ids.device)[None]
    padded = ids.new_zeros((1, K))  # a fresh [1, K] tensor: a view of the buffer would carry its stride into the
    padded[:, :k] = ids             # graph's guards and recompile for every buffer width
    out = call(input_ids=padded, position_ids=pos, cache=cache, use_cache=True)
    return out.logits[:, :k].clone()  # a copy: CUDA graphs reuse their output buffers


@torch.inference_mode()
def forward_tree(model: CausalLM, call: Any, cache: StaticCache, layers: list[StaticLayer], block: Block, start: int
                 ) -> torch.Tensor:
    """Logits [1, K, V] of a tree block (specbench.decoding.forest) of one row written at columns start..start+K-1,
    padded on the right to a compiled width as forward_static pads a chain; its mask spans the cache's capacity
    (each padded query sees itself only) and is an input of the graph, so one graph per width serves every tree."""
    K, W, capacity = block.width, width(block.width), layers[0].max_cache_len
    Wp = W or K
    if start + Wp > capacity:
        raise ValueError(f"a tree forward of {K} tokens after {start} columns overflows the static cache of {capacity}")
    allowed = torch.zeros((1, Wp, capacity), dtype=torch.bool, device=block.ids.device)
    allowed[:, :K, : start + K] = block.allowed
    pad = torch.arange(K, Wp, device=block.ids.device)
    allowed[:, pad, start + pad] = True
    ids, pos = block.ids.new_zeros((1, Wp)), block.pos.new_zeros((1, Wp))
    ids[:, :K], pos[:, :K] = block.ids, block.pos
    mask = additive(allowed, model.dtype)
    for layer in layers:  # the block's columns start at `start`
        layer.cumulative_length.fill_(start)
    if W is None or not cache.is_initialized:
        return model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True).logits[:, :K]
    out = call(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    return out.logits[:, :K].clone()


class StaticState(ModelState):
    """ModelState over a static cache and compiled forwards, for one row; forwards are timed by clock marks."""

    on_device = True

    def __init__(self, model: PreTrainedModel, rows: int, need: int, role: str = "target") -> None:
        if rows != 1:
            raise OptionError(f"engine.compile=true decodes one row at a time; got a batch of {rows} rows: set "
                              "batch_size=1 or engine.compile=false")
        super().__init__(model, 1)
        self.cache: StaticCache = static_cache(model, need + max(WIDTHS), role)
        self.layers = static_layers(self.cache)  # whose write positions each forward resets
        self.call = compiled_call(model)
        self.clock = Clock(self.device)
        self.spans: list[tuple[Any, Any]] = []  # clock marks (start, end) of forwards not yet accounted
        self.forest = Forest(1)  # the row's tree nodes, written after its committed columns

    @torch.inference_mode()
    def forward(self, buf: torch.Tensor, upto: int | list[int], keep: int, layers: tuple[int, ...] = (),
                ids: torch.Tensor | None = None) -> torch.Tensor:
        """Feed buf[0, fed:upto] (or `ids`, those tokens, as ModelState.forward) and return the logits [1, keep, V]
        of its last `keep` tokens (no hidden states: the plan keeps a drafter that reads them off the compiled path)."""
        upto = upto if isinstance(upto, int) else upto[0]
        logits = self.feed(buf[:, self.fed[0] : upto] if ids is None else ids, self.fed[0])
        self.fed = [upto]
        return logits[:, -keep:]

    def feed(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Logits [1, k, V] of ids [1, k] at positions start.. (no host synchronisation); the caller sets fed."""
        t0 = self.clock.mark()
        logits = forward_static(self.model, self.call, self.cache, self.layers, ids.to(self.device), start)
        self.spans.append((t0, self.clock.mark()))
        self.row_tokens = [t + ids.shape[1] for t in self.row_tokens]  # now: the engine reads them per iteration
        return logits

    @torch.inference_mode()
    def feed_trees(self, buf: torch.Tensor, upto: list[int], tokens: list[list[int]], parents: list[list[int]],
                   keep_root: bool, nodes: list[list[int]] | None = None, layers: tuple[int, ...] = ()
                   ) -> torch.Tensor:
        """TreeState.feed_trees for the one row of a static cache (forward_tree): logits [1, keep_root + n, V]."""
        start = self.fed[0] + len(self.forest.nodes[0])  # the columns written: committed, then tree nodes
        committed = (torch.arange(start, device=self.device) < self.fed[0])[None]
        block = self.forest.block(buf, self.fed, upto, tokens, parents, nodes, committed)
        t0 = self.clock.mark()
        logits = forward_tree(self.model, self.call, self.cache, self.layers, block, start)
        self.spans.append((t0, self.clock.mark()))
        self.row_tokens = [t + block.width for t in self.row_tokens]
        self.forest.commit(block)
        self.fed = list(upto)
        keep = max(1, int(keep_root) + len(tokens[0]))
        return logits[:, logits.shape[1] - keep :]

    @torch.inference_mode()
    def keep_paths(self, lengths: list[int], paths: list[list[int]]) -> None:
        """The row keeps its first lengths[0] committed tokens and its path's cached nodes: their keys and values are
        copied to the columns after the kept tokens (in place: a CUDA graph holds the cache's addresses), and the
        next write starts after them."""
        lengths, keep = self.forest.kept(lengths, paths, self.fed)
        n, cols = lengths[0], keep[0]
        if cols != list(range(n, n + len(cols))):
            idx = torch.tensor(cols, device=self.device)
            for layer in self.layers:
                assert layer.keys is not None and layer.values is not None  # a tree forward initialized them
                layer.keys[:, :, n : n + len(cols)] = layer.keys.index_select(2, idx)
                layer.values[:, :, n : n + len(cols)] = layer.values.index_select(2, idx)
        self.fed = [n + len(cols)]

    def settle(self) -> None:
        """Account the forwards since the last settle (their events are complete after the engine's sync)."""
        for a, b in self.spans:
            self.count(self.clock.seconds(a, b), 0)  # its width was counted when it was fed
        self.spans = []

    def crop(self, length: int | list[int]) -> None:
        """Roll back to the first `length` tokens: only the position moves (the next forward writes there)."""
        length = length if isinstance(length, int) else length[0]
        self.fed = [min(self.fed[0], length)]

    def select(self, rows: list[int]) -> None:
        """One row: nothing to select (it leaves when the generation ends)."""
