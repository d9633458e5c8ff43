"""Model states: a model plus its KV cache over the rows of a batch, and the clocks that time its forwards.

CUDA kernels run asynchronously: a wall-clock interval means finished work only after a synchronisation. The eager
state synchronises after every forward (each forward's time exact, as the papers measured it); the compiled state
records CUDA events, read after the engine's one synchronisation per iteration, so its draft loop never waits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, cast

import torch
from transformers import Cache, DynamicCache, PreTrainedConfig


class Clock:
    """Time marks on a device: CUDA events recorded on the current stream (no host wait), or perf_counter."""

    def __init__(self, device: torch.device, events: bool = True) -> None:
        self.events = events and device.type == "cuda"

    def mark(self) -> Any:
        """A mark now: a recorded torch.cuda.Event, or perf_counter() seconds."""
        if not self.events:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a: Any, b: Any) -> float:
        """Seconds from mark a to mark b (waits for b's event to complete)."""
        if not self.events:
            return b - a
        b.synchronize()
        return a.elapsed_time(b) / 1e3


class CausalLM(Protocol):
    """What a state calls of its model: a transformers PreTrainedModel, or a test double (tests/table_lm.py)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def config(self) -> PreTrainedConfig: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


def causal_lm(model: torch.nn.Module) -> CausalLM:
    """A bound model as the causal LM its ModelState runs (only a cast: torch types a module's attributes as
    Tensor | Module; a head in the draft role makes its own state)."""
    return cast(CausalLM, model)


def sync(device: torch.device) -> None:
    """Wait for queued kernels so wall-clock timers measure finished work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(values: Sequence[float] | Sequence[Sequence[float]], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on `device` without waiting: on CUDA through pinned memory, copied behind the queued
    kernels (a copy from pageable memory would wait for them)."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def write(buf: torch.Tensor, at: list[tuple[int, int]], values: list[int]) -> None:
    """buf[b, c] = v for each (b, c) of at [k] and v of values [k], in one copy and one call (buf [B, C] contiguous,
    long: the token buffer); one row's consecutive columns (a block at B = 1) by a slice copy, with fewer ops."""
    b0, c0 = at[0]
    if len(at) == 1:  # one token (ar's block): a fill, no host tensor
        buf[b0, c0] = values[0]
        return
    if all(b == b0 and c == c0 + i for i, (b, c) in enumerate(at)):
        buf[b0, c0 : c0 + len(values)] = to_device(values, torch.long, buf.device)
        return
    width = buf.shape[1]
    flat_and_values = to_device([[b * width + c for b, c in at], values], torch.long, buf.device)  # [2, k]
    buf.view(-1).index_copy_(0, flat_and_values[0], flat_and_values[1])


class Counted:
    """What the engine reads of any state (ModelState, HeadState): forwards' seconds and calls, each row's share."""

    on_device = False  # True: the state drafts with tokens kept on the device (specbench.decoding.compiled)

    def __init__(self, rows: int) -> None:
        self.fed = [0] * rows  # tokens of each row the state has read
        self.seconds = 0.0  # summed wall time of forward calls
        self.calls = 0
        self.shares = [0.0] * rows  # each row's share of those seconds (a forward's time split among its rows)
        self.row_calls = [0] * rows  # forward calls each row took part in
        self.row_tokens = [0] * rows  # the widths of those calls: tokens per row of each block fed (holes included)

    def settle(self) -> None:
        """After the engine's synchronisation of an iteration: account forwards timed by events (eager: done)."""

    def count(self, seconds: float, width: int = 1) -> None:
        """Account one forward of `seconds` over a block `width` tokens wide, split equally among the rows it fed."""
        self.seconds += seconds
        self.calls += 1
        share = seconds / len(self.fed)
        self.shares = [x + share for x in self.shares]
        self.row_calls = [c + 1 for c in self.row_calls]
        self.row_tokens = [t + width for t in self.row_tokens]

    def select(self, rows: list[int]) -> None:
        """Keep only the given rows' counts (indices into the current batch), in that order."""
        self.fed = [self.fed[b] for b in rows]
        self.shares = [self.shares[b] for b in rows]
        self.row_calls = [self.row_calls[b] for b in rows]
        self.row_tokens = [self.row_tokens[b] for b in rows]


def keep_first(cache: Cache, n: int, total: int) -> None:
    """Keep the first n of a cache's `total` positions: the one call of transformers' `crop(k)`, whose k <= 0 is
    minus the positions to remove; every `crop(n)` of specbench keeps the first n."""
    if n < total:
        cache.crop(n - total)


class ModelState(Counted):
    """A model plus its KV cache over B rows: row b's first fed[b] buffer tokens, in the cache's shared columns."""

    def __init__(self, model: CausalLM, rows: int = 1) -> None:
        super().__init__(rows)
        self.model = model
        self.device = model.device
        self.cache: Cache = DynamicCache(config=model.config)  # a StaticCache in a StaticState
        self.columns = 0  # cache columns, shared by the rows
        # [B, columns] 1 = the row's token, 0 = a hole; None: no holes (one row, whose roll-backs are crops)
        self.mask: torch.Tensor | None = None if rows == 1 else torch.zeros((rows, 0), dtype=torch.long,
                                                                            device=self.device)
        self.hidden: torch.Tensor | None = None  # [len(layers), B, width, H]: the last forward's, until taken

    def forward(self, buf: torch.Tensor, upto: int | list[int], keep: int, layers: tuple[int, ...] = (),
                ids: torch.Tensor | None = None) -> torch.Tensor:
        """Feed each row b buf[b, fed[b]:upto[b]]; logits [B, keep, V_model] of the block's last `keep` columns (row
        b's newest tokens, right-aligned). With `layers` (hidden_states indices: k = output of decoder layer k) it
        also keeps their states of every fed column [len(layers), B, width, H] for take_hidden. One row may be fed
        `ids` [1, upto - fed] instead, its tokens not yet in buf (a draft loop's last draft)."""
        if not torch.is_inference_mode_enabled():  # a caller outside the engine's loop, which runs in the mode
            with torch.inference_mode():  # (entering it per forward, as a decorator does: docs/results/engine.md)
                return self.forward(buf, upto, keep, layers, ids)
        t0 = time.perf_counter()
        upto = [upto] * len(self.fed) if isinstance(upto, int) else upto
        extra: dict[str, torch.Tensor | bool]
        if self.mask is None:  # one row, no holes: the plain causal forward
            ids, extra = buf[:, self.fed[0] : upto[0]].to(self.device) if ids is None else ids, {}
            width = upto[0] - self.fed[0]
        else:
            ids, extra, width = self.block(buf, upto)
        if layers:
            extra["output_hidden_states"] = True
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=keep, **extra)
        if layers:
            self.hidden = torch.stack([out.hidden_states[k] for k in layers])
        sync(self.device)
        self.count(time.perf_counter() - t0, width)
        self.fed = list(upto)
        self.columns += width
        logits = out.logits  # [B, keep, V_model] (logits_to_keep); a stub model may return every column
        return logits if logits.shape[1] == keep else logits[:, -keep:]

    def take_hidden(self) -> torch.Tensor | None:
        """The states the last forward kept for its `layers` (None without), handed over once."""
        hidden, self.hidden = self.hidden, None
        return hidden

    def block(self, buf: torch.Tensor, upto: list[int]) -> tuple[torch.Tensor, dict[str, torch.Tensor | bool], int]:
        """Input ids [B, K], attention mask [B, columns + K] and position ids [B, K] of a forward feeding row b
        the k_b = upto[b] - fed[b] tokens buf[b, fed[b]:upto[b]] right-aligned, K = max k_b (holes on the left)."""
        new = [u - f for u, f in zip(upto, self.fed)]
        width = max(1, *new)
        k = torch.tensor(new, device=buf.device)  # [B]
        end = torch.tensor(upto, device=buf.device)
        pos = (end[:, None] - width + torch.arange(width, device=buf.device)).clamp_min(0)  # [B, K] buffer index
        valid = (torch.arange(width, device=buf.device) >= width - k[:, None]).long()  # [B, K]
        ids = buf.gather(1, pos).to(self.device)
        assert self.mask is not None  # several rows (forward feeds one row without a mask)
        self.mask = torch.cat([self.mask, valid.to(self.device)], dim=1)
        return ids, {"attention_mask": self.mask, "position_ids": pos.to(self.device)}, width

    def crop(self, length: int | list[int]) -> None:
        """Roll row b back to its first length[b] <= fed[b] tokens: one row keeps its first length[0] positions
        (tests/test_engine.py pins this against a fresh forward); with several, row b's last fed[b] - length[b]
        tokens become holes and the columns no row uses any more are cropped from the end."""
        length = [length] * len(self.fed) if isinstance(length, int) else length
        if self.mask is None:
            if length[0] < self.fed[0]:
                keep_first(self.cache, length[0], self.fed[0])
                self.columns, self.fed = length[0], [length[0]]
            return
        drops = [f - n for f, n in zip(self.fed, length)]
        if max(drops) > 0:
            drop = torch.tensor(drops, device=self.device)  # [B]
            after = self.mask.flip(1).cumsum(1).flip(1)  # [B, columns]: the row's tokens at or after column c
            self.mask = self.mask * (after > drop[:, None]).long()
            self.trim()
        self.fed = list(length)

    def trim(self) -> None:
        """Crop from the end the cache columns no row uses any more (several rows: the hole mask says which)."""
        assert self.mask is not None
        used = self.mask.any(0).nonzero()  # columns some row still uses
        keep = int(used.max()) + 1 if used.numel() else 0
        if keep < self.columns:
            keep_first(self.cache, keep, self.columns)
            self.mask, self.columns = self.mask[:, :keep], keep

    def select(self, rows: list[int]) -> None:
        """Keep only the given rows (indices into the current batch), in that order."""
        self.cache.batch_select_indices(torch.tensor(rows, device=self.device))
        assert self.mask is not None  # rows leave a batch of several (one row is never selected: it just ends)
        self.mask = self.mask[rows]
        super().select(rows)


def model_state(state: Counted) -> ModelState:
    """`state` as the ModelState of a model (the engine gives every role but a head's one): a TypeError otherwise."""
    if not isinstance(state, ModelState):
        raise TypeError(f"a model's state was expected, got a {type(state).__name__} (a head's state drafts only)")
    return state
