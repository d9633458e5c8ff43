"""Medusa-1 heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads"): k heads on the target's last hidden state h_t at the last committed position t (after its final norm,
transformers' hidden_states[L], which the target's lm_head reads to predict x_{t+1}). Head i = 1..k:
  z = h_t + SiLU(W_j z + b_j) for each of its `num_layers` residual blocks (z starts at h_t)
  q_i = softmax(W_out z)   the distribution of x_{t+1+i}                                  [V]
The weight names are Medusa's (`{i}.{j}.linear.weight`, `{i}.{num_layers}.weight`), so its released state dicts
load as they are. Medusa builds a head's blocks as `[ResBlock(H)] * num_layers`, one module repeated: with
num_layers > 1 a released head applies the same block num_layers times, and so does this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class MedusaConfig:
    """The heads' shape (Medusa's config.json: medusa_num_heads, medusa_num_layers; hidden and vocabulary sizes)."""

    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int


class ResBlock(nn.Module):
    """z + SiLU(W z + b)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # Medusa's init: each block starts as the identity

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + F.silu(self.linear(z))


class MedusaHeads(nn.ModuleList):
    """Head i is [ResBlock] * num_layers then Linear(H, V, bias=False); the list's keys are Medusa's."""

    def __init__(self, c: MedusaConfig) -> None:
        H = c.hidden_size
        super().__init__([nn.Sequential(*([ResBlock(H)] * c.num_layers), nn.Linear(H, c.vocab_size, bias=False))
                          for _ in range(c.num_heads)])  # [ResBlock(H)] * n: one block, repeated
        self.config = c

    def vocabulary_layers(self) -> list[nn.Linear]:
        """Each head's last module, its Linear(H, V, bias=False) (__init__ builds each head as an nn.Sequential)."""
        return [cast(nn.Linear, cast(nn.Sequential, head)[-1]) for head in self]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [..., k, V] of the k heads at hidden states h [..., H]."""
        return torch.stack([head(h) for head in self], -2)
