"""A test double of a causal LM whose next-token logits are a fixed pseudo-random function of the prefix.

It keeps its prefix in a real transformers DynamicCache (token ids stored as the keys of its one
layer), so the engine's cache bookkeeping and rollback are exercised exactly as with a real model,
while a forward costs microseconds. The exact distribution of any continuation is computable
directly from `logits_for`, independently of the engine.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import torch
from transformers import LlamaConfig

from engines import bound_engine
from specbench.decoding.engine import Engine
from specbench.decoding.method import Method


class TableLM(torch.nn.Module):
    """logits(prefix) = scale * N(0, 1) draws seeded by (seed, prefix)."""

    def __init__(self, vocab: int, seed: int, scale: float = 1.5) -> None:
        super().__init__()
        self.vocab, self.seed, self.scale = vocab, seed, scale
        self.config = LlamaConfig(num_hidden_layers=1, vocab_size=vocab, max_position_embeddings=4096)
        self.device = torch.device("cpu")

    def logits_for(self, prefix: list[int]) -> torch.Tensor:
        """Next-token logits [V] after `prefix`."""
        h = hashlib.sha256(f"{self.seed}:{','.join(map(str, prefix))}".encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(h[:8], "little"))
        return self.scale * torch.randn(self.vocab, generator=g)

    def forward(self, input_ids, past_key_values, use_cache=True, logits_to_keep=0):
        n = input_ids.shape[1]
        kv = input_ids.to(torch.float64).view(1, 1, n, 1)
        keys, _ = past_key_values.update(kv, kv, 0)  # the real cache now holds the whole prefix
        prefix = keys.view(-1).long().tolist()
        keep = logits_to_keep or n
        start = len(prefix) - keep
        rows = [self.logits_for(prefix[: start + j + 1]) for j in range(keep)]
        return SimpleNamespace(logits=torch.stack(rows)[None])


def table_engine(method: Method, target: Any, draft: Any, temperature: float, context: int) -> Engine:
    """An engine running `method` bound to two models without a tokenizer or EOS id (table LMs, tiny Llamas)."""
    return bound_engine(method, {"target": target, "draft": draft}, target.config.vocab_size, temperature,
                        context=context)
