"""The target's top-2 margin at each committed position: what tells a float near-tie from a bug when a lossless
greedy run parts from `ar` (specbench.analysis.divergence).

At the verify column c that chose committed token t (the root's column for a block's first token, the column of
the accepted node before it for the others), the target's processed logits z_c (the first vocab_size entries, in
float32) give
    margin_c = z_c[(1)] - z_c[(2)]   (top-1 minus top-2 logit, >= 0)
    top1_c   = argmax z_c            (the token greedy decoding commits there)
A lossless greedy method commits top1_c at every position; a near-tie is a position whose margin is within the
float noise of the verify (different verify widths reorder the reductions), where `ar` and the method may pick
different argmaxes and both be right. Costs one top-2 over the verify's logits [B, keep, V] and one copy of
[B, keep, 2] numbers to the host per iteration.
"""

from __future__ import annotations

import torch

from specbench.decoding.proposal import Proposal, Verdict


def top2(logits: torch.Tensor, vocab_size: int) -> tuple[list[list[float]], list[list[int]]]:
    """(margin [B][keep], top1 [B][keep]) of logits [B, keep, V_model] over the first vocab_size entries."""
    vals, idx = logits[..., :vocab_size].float().topk(2, dim=-1)  # [B, keep, 2]
    return (vals[..., 0] - vals[..., 1]).tolist(), idx[..., 0].tolist()


def committed_columns(keep: int, prop: Proposal, verdict: Verdict) -> list[int]:
    """The verify columns (of keep, a row's last len(prop) + 1 being its root's then its nodes' in proposal order)
    whose distributions chose the committed block's tokens [accepted + 1]: the root's, then each accepted node's."""
    root = keep - len(prop) - 1
    return [root] + [root + 1 + j for j in verdict.path]


def committed(margin: list[float], top1: list[int], cols: list[int], block: list[int]) -> tuple[list[float], list[int]]:
    """The block's margins [len(block)] and the offsets in the block of the tokens that are not their column's
    top-1 (empty for a lossless greedy method)."""
    return [margin[c] for c in cols], [i for i, (c, t) in enumerate(zip(cols, block)) if top1[c] != t]
