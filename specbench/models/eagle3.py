"""The EAGLE-3 draft head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test"): one decoder layer that reads the target's hidden states and its own outputs.

Head position t reads the pair (f_t, x_{t+1}) and predicts x_{t+2}:
  f_t  = fc([l_t; m_t; h_t])                 target states at hidden_states indices `layers` [3 H_t] -> [H]
         (at a drafted position: the head's own output o_{t-1} of the previous position, [H])
  e    = embed(x_{t+1})                      the target's input embedding (shared, not a head weight)
  a    = Attn([norm_e(e); norm_h(f_t)])      queries, keys, values from the concatenation [2 H] (embedding first)
  r    = f_t + a                             (norm_before_residual: norm_h(f_t) + a)
  o_t  = r + MLP(norm_post(r))               the layer output, fed back as the next position's f
  q    = softmax(lm_head(norm(o_t)))         over the draft vocabulary [V_d]; draft id i is target id i + d2t[i]
The layer norms, MLP and rotary embedding are transformers' Llama modules; the attention is written here because
its projections read 2 H features (no transformers attention class takes an input wider than hidden_size). It
attends with an explicit boolean mask over the head's own cache (`HeadCache`), so chains and trees use one path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

# the Llama fields of a head config (a release config.json, or a speculators one's transformer_layer_config)
LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings", "hidden_act", "vocab_size")


@dataclass
class Eagle3Config:
    """The head's shape: the fields of an EAGLE-3 release config.json that the head reads."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's vocabulary V
    draft_vocab_size: int  # V_d <= V
    layers: tuple[int, ...]  # target hidden_states indices of the low, middle and high features
    target_hidden_size: int | None = None  # H_t (None: hidden_size)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # the target's, e.g. Llama 3.1's {"rope_type": "llama3", ...}
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    norm_before_residual: bool = False

    def llama_fields(self) -> dict[str, Any]:
        """The layer's Llama fields (LLAMA_KEYS, head_dim resolved), as a release config writes them."""
        return {k: self.dim if k == "head_dim" else getattr(self, k) for k in LLAMA_KEYS}

    def llama(self) -> LlamaConfig:
        """The LlamaConfig of the head's norms, MLP and rotary embedding."""
        return LlamaConfig(**self.llama_fields())

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def features(self) -> int:
        return self.target_hidden_size or self.hidden_size


class HeadCache:
    """Keys and values [B, kv_heads, n, d] of the head's positions so far (columns shared by the rows)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add k, v [1, kv_heads, q, d]; return all keys and values."""
        self.keys = k if self.keys is None else torch.cat([self.keys, k], -2)
        self.values = v if self.values is None else torch.cat([self.values, v], -2)
        return self.keys, self.values

    def crop(self, n: int) -> None:
        """Keep the first n positions."""
        if self.keys is not None and self.values is not None and n < self.length:  # append sets both
            self.keys, self.values = self.keys[..., :n, :], self.values[..., :n, :]

    def select(self, rows: list[int]) -> None:
        """Keep the given rows (batch indices), in that order."""
        if self.keys is not None and self.values is not None:
            self.keys, self.values = self.keys[rows], self.values[rows]


# training-time test: a list of the earlier steps' (keys, values); inference: the head's own cache
Past: TypeAlias = list[tuple[torch.Tensor, torch.Tensor]] | HeadCache | None


class Eagle3Attention(nn.Module):
    """Grouped-query attention whose q, k, v read [norm_e(e); norm_h(f)] [2 H] (see the module docstring)."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = c.num_attention_heads, c.num_key_value_heads, c.dim
        self.q_proj = nn.Linear(2 * c.hidden_size, self.heads * self.dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, self.kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, self.kv_heads * self.dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.dim, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], allowed: torch.Tensor,
                past: Past = None) -> torch.Tensor:
        """x [B, q, 2H] -> [B, q, H]. allowed [B or 1, q, kv] bool over the keys: `past` (a HeadCache, or a list of
        earlier steps' (k, v) [B, kv_heads, n, d], concatenated in order), then these q; the new keys and values are
        appended to `past`."""
        B, q, _ = x.shape
        Q = self.q_proj(x).view(B, q, self.heads, self.dim).transpose(1, 2)
        K = self.k_proj(x).view(B, q, self.kv_heads, self.dim).transpose(1, 2)
        V = self.v_proj(x).view(B, q, self.kv_heads, self.dim).transpose(1, 2)
        Q, K = apply_rotary_pos_emb(Q, K, *rope)
        if isinstance(past, HeadCache):
            K, V = past.append(K, V)
        elif past is not None:  # training-time test: the keys of every earlier step, then this step's
            past.append((K, V))
            K, V = torch.cat([k for k, _ in past], -2), torch.cat([v for _, v in past], -2)
        rep = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(Q, K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1),
                                             attn_mask=allowed[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(B, q, self.heads * self.dim))


class Eagle3Layer(nn.Module):
    """The head's decoder layer (weight names as EAGLE-3's `midlayer`)."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.norm_before_residual = c.norm_before_residual
        self.input_layernorm = LlamaRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Eagle3Attention(c)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = LlamaMLP(c.llama())

    def forward(self, e: torch.Tensor, f: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                allowed: torch.Tensor, past: Past = None) -> torch.Tensor:
        """o [B, q, H] from embeddings e and features f [B, q, H]."""
        h = self.hidden_norm(f)
        x = torch.cat([self.input_layernorm(e), h], -1)  # [B, q, 2H]
        r = (h if self.norm_before_residual else f) + self.self_attn(x, rope, allowed, past)
        return r + self.mlp(self.post_attention_layernorm(r))


class Eagle3Head(nn.Module):
    """fc, one layer, the final norm and the draft-vocabulary head; d2t [V_d] and t2d [V] map the vocabularies."""

    d2t: torch.Tensor  # buffers (register_buffer)
    t2d: torch.Tensor
    embed: nn.Embedding | None

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.config = c
        self.fc = nn.Linear(3 * c.features, c.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = LlamaRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(c.llama())
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.full((c.vocab_size,), c.draft_vocab_size == c.vocab_size))  # bool
        self.embed = None  # the target's input embedding, set by `attach` (not saved with the head)

    @staticmethod
    def new_cache() -> HeadCache:
        """An empty cache of the head's positions."""
        return HeadCache()

    def attach(self, embed: nn.Embedding) -> "Eagle3Head":
        """Read token embeddings from the target's (frozen, shared) embedding."""
        object.__setattr__(self, "embed", embed)  # not a submodule: never saved, trained or moved with the head
        return self

    def set_vocab(self, draft_ids: torch.Tensor) -> None:
        """The draft vocabulary: target ids [V_d], increasing; d2t[i] = draft_ids[i] - i, t2d = membership."""
        self.d2t.copy_(draft_ids - torch.arange(len(draft_ids), device=draft_ids.device))
        self.t2d.zero_()
        self.t2d[draft_ids] = True

    def target_ids(self) -> torch.Tensor:
        """[V_d] the target id of each draft id."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def rope(self, f: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of positions [B, q] for attention inputs like f."""
        return self.rotary(f, positions)

    def step(self, f: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor,
             past: Past = None) -> torch.Tensor:
        """Layer outputs o [B, q, H] at positions [B, q] from features f [B, q, 3 H_t or H] and tokens ids [B, q]."""
        if f.shape[-1] == 3 * self.config.features:  # target states; a head output is [H]
            f = self.fc(f)
        assert self.embed is not None, "attach() the target's input embedding first"
        e = self.embed(ids).to(f.dtype)
        return self.midlayer(e, f, self.rope(f, positions), allowed, past)

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., V_d] of layer outputs o [..., H]."""
        return self.lm_head(self.norm(o))

    def target_logits(self, o: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary [..., V]: the draft ids' logits at their target ids, -inf elsewhere."""
        d = self.logits(o)
        out = d.new_full((*d.shape[:-1], self.config.vocab_size), float("-inf"))
        return out.index_copy(-1, self.target_ids(), d)
