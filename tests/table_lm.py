"""A test double of a causal LM whose next-token logits are a fixed pseudo-random function of the prefix.

It keeps its prefix in a real transformers DynamicCache (token ids stored as the keys of its one
layer), so the engine's cache bookkeeping and rollback are exercised exactly as with a real model,
while a forward costs microseconds. The exact distribution of any continuation is computable
directly from `logits_for`, independently of the engine.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import torch
from transformers import LlamaConfig


class TableLM(torch.nn.Module):
    """logits(prefix) = scale * N(0, 1) draws seeded by (seed, prefix)."""

    def __init__(self, vocab: int, seed: int, scale: float = 1.5) -> None:
        super().__init__()
        self.vocab, self.seed, self.scale = vocab, seed, scale
        self.config = LlamaConfig(num_hidden_layers=1, vocab_size=vocab, max_position_embeddings=4096)
        self.device = torch.device("cpu")
        self.dtype = torch.float32

    def logits_for(self, prefix: list[int]) -> torch.Tensor:
        """Next-token logits [V] after `prefix`."""
        h = hashlib.sha256(f"{self.seed}:{','.join(map(str, prefix))}".encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(h[:8], "little"))
        return self.scale * torch.randn(self.vocab, generator=g)

    def forward(self, input_ids, cache, use_cache=True, logits_to_keep=0, attention_mask=None,
                position_ids=None):
        """Logits [B, keep, V] of the last `keep` columns; a row's prefix is its tokens at the columns its
        attention mask [B, columns] marks (every column without one), holes get zero logits; with a 4-D additive
        mask [B, 1, n, columns] (tree attention) query j's prefix is the columns its row of the mask leaves at 0."""
        B, n = input_ids.shape
        kv = input_ids.to(torch.float64).view(B, 1, n, 1)
        keys, _ = cache.update(kv, kv, 0)  # the real cache now holds every column of every row
        cols = keys.shape[2]
        if attention_mask is not None and attention_mask.dim() == 4:
            keep = logits_to_keep or n
            out = torch.zeros((B, keep, self.vocab))
            for b in range(B):
                ids = keys[b].view(-1).long().tolist()
                for j in range(keep):
                    seen = (attention_mask[b, 0, n - keep + j] == 0).tolist()
                    out[b, j] = self.logits_for([t for t, m in zip(ids, seen) if m])
            return SimpleNamespace(logits=out)
        mask = torch.ones((B, cols), dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        keep = logits_to_keep or n
        out = torch.zeros((B, keep, self.vocab))
        for b in range(B):
            ids = keys[b].view(-1).long().tolist()
            for j, c in enumerate(range(cols - keep, cols)):
                if mask[b, c]:
                    out[b, j] = self.logits_for([t for t, m in zip(ids[: c + 1], mask[b, : c + 1].tolist()) if m])
        return SimpleNamespace(logits=out)
