"""Sampling distributions and the statistics the adaptive methods read (entropy, JS distance).

p and q are the *processed* distributions: temperature, top-k and top-p applied through
transformers' logits warpers, the same ones tokens are drawn from. At temperature 0 tokens
are argmax and statistics use the softmax at temperature 1 (docs/design.md section 3).
Entropy is in bits; the JS divergence uses log base 2, so the JS distance lies in [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

_LN2 = 0.6931471805599453


@dataclass(frozen=True)
class SamplingParams:
    """Decode settings shared by both models; temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"decode.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"decode.top_k must be >= 0 or null, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"decode.top_p must be in (0, 1] or null, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def warpers(self) -> LogitsProcessorList:
        """transformers' warpers in generate()'s order: temperature, top-k, top-p."""
        procs = LogitsProcessorList()
        if self.greedy:
            return procs
        if self.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            procs.append(TopKLogitsWarper(self.top_k))
        if self.top_p is not None and self.top_p < 1.0:
            procs.append(TopPLogitsWarper(self.top_p))
        return procs


class Sampler:
    """Turns raw logits [..., V] into token choices and distributions for one decode setting."""

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        self.params = params
        self.vocab_size = vocab_size  # shared tokenizer range; padded logits beyond it are cut
        self._warpers = params.warpers()
        self._dummy_ids = torch.zeros((1, 1), dtype=torch.long)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed sampling distribution [..., V] from logits [..., V_model] ([n] or [B, positions] lead), float32."""
        logits = vocab_logits(logits, self.vocab_size)
        logits = logits if logits.dtype == torch.float32 else logits.float()  # no dispatch when it already is
        if self.params.greedy:
            return torch.softmax(logits, dim=-1)  # statistics only: softmax at T=1
        if self._warpers:
            # the warpers take scores [N, V] (top-p scatters its mask along dim 1): one row per leading index,
            # each row warped alone, so flattening the leading dims and restoring them changes no row's result
            flat = logits.reshape(-1, logits.shape[-1])  # [N, V], N = prod(leading dims)
            # transformers annotates input_ids as torch.LongTensor, a legacy type no tensor op returns
            flat = self._warpers(self._dummy_ids.expand(flat.shape[0], 1), flat)  # type: ignore[arg-type]
            logits = flat.reshape(logits.shape)
        return torch.softmax(logits, dim=-1)

    def top(self, logits: torch.Tensor) -> torch.Tensor:
        """argmax over the first vocab_size entries of logits [..., V_model]: the greedy token (argmax z = argmax p)."""
        return vocab_logits(logits, self.vocab_size).argmax(dim=-1)

    def pick(self, probs: torch.Tensor, generators: Sequence[torch.Generator | None], rows: list[int] | None = None
             ) -> torch.Tensor:
        """One token per row [B] from probs [B, V]: argmax when greedy, else one draw per row of `rows` (default
        all) with its own generator, in one categorical call (the other rows' entries are not draws)."""
        if self.params.greedy:
            return probs.argmax(dim=-1)
        drawn = set(range(probs.shape[0]) if rows is None else rows)
        e = exponentials([int(b in drawn) for b in range(probs.shape[0])], 1, probs.shape[-1], generators,
                         probs.device, probs.dtype)  # [B, 1, V]
        return categorical(probs, e[:, 0])


def vocab_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """logits [..., V_model] cut to the first vocab_size entries (a padded embedding's extra ids are never drawn),
    with no op when there are no others."""
    return logits if logits.shape[-1] == vocab_size else logits[..., :vocab_size]


def categorical(weights: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """One draw per row from the unnormalised weights [..., V] given e [..., V] ~ Exp(1) i.i.d.: argmax_v w_v / e_v.

    P(argmax = v) = w_v / sum w (the Gumbel-max trick in exponential form: w_v / e_v = 1 / Exp(w_v) and the smallest
    of independent Exp(w_v) is v with probability w_v / sum w). torch.multinomial draws one sample this way, from
    the same e, so a generator gives the same tokens either way; this form has no host check of the weights.
    """
    return (weights / e).argmax(-1)


def exponentials(rows: list[int], width: int, vocab: int, generators: Sequence[torch.Generator | None],
                 device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e [B, width, V] ~ Exp(1): row b's last rows[b] rows drawn with generators[b] (the draws a per-row
    torch.multinomial of that many distributions makes), its other rows 1; one draw when no row has a generator."""
    if all(g is None for g in generators):
        return torch.empty((len(rows), width, vocab), dtype=dtype, device=device).exponential_(1)
    e = torch.ones((len(rows), width, vocab), dtype=dtype, device=device)
    for b, (k, g) in enumerate(zip(rows, generators)):
        if k:
            e[b, width - k :].exponential_(1, generator=g)
    return e


def entropy_bits(probs: torch.Tensor) -> torch.Tensor:
    """H(p) = -sum_v p(v) log2 p(v), over the last dim: [..., V] -> [...] float64; 0 log 0 = 0.

    Computed in float64 (as js_distance) so statistics of float32 / bfloat16 probabilities are exact to ~1e-12.
    """
    probs = probs.double()
    logp = torch.log(probs.clamp_min(1e-300))
    return -(probs * logp).sum(-1) / _LN2


def js_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """d_JS(p, q) = sqrt(D_JS), D_JS = (KL(p||m) + KL(q||m)) / 2, m = (p+q)/2, log base 2: [..., V] -> [...].

    In float64: D_JS of nearly equal distributions is tiny (d_JS = 4e-5 means D_JS = 1.6e-9) and is the
    small difference of O(1) terms, which float32 rounds to exactly 0 (d_JS then reads 0).
    """
    p, q = p.double(), q.double()
    m = 0.5 * (p + q)
    logm = torch.log(m.clamp_min(1e-300))

    def kl_to_m(a: torch.Tensor) -> torch.Tensor:  # sum_v a log2(a/m), with 0 log 0 = 0
        return torch.where(a > 0, a * (torch.log(a.clamp_min(1e-300)) - logm), 0.0).sum(-1) / _LN2

    d = 0.5 * (kl_to_m(p) + kl_to_m(q))
    return d.clamp(0.0, 1.0).sqrt()
