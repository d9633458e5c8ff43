"""The target's top-2 margin at each committed position: what tells a float near-tie from a bug when a lossless
greedy run parts from `ar` (specbench.analysis.divergence).

At the verify column c that chose committed token t (the root's column for a block's first token, the column of
the accepted node before it for the others), the target's processed logits z_c (the first vocab_size entries, in
float32) give
    margin_c = z_c[(1)] - z_c[(2)]   (top-1 minus top-2 logit, >= 0)
    top1_c   = max z_c               (greedy decoding commits a token with this logit there)
A lossless greedy method commits a token whose logit is top1_c at every position (either of a tie); a near-tie is a position whose margin is within the
float noise of the verify (different verify widths reorder the reductions), where `ar` and the method may pick
different argmaxes and both be right. Costs one top-2 over the verify's logits [B, keep, V] and one copy of
[B, keep, 2] numbers to the host per iteration, and one gather of the committed tokens' logits.
"""

from __future__ import annotations

import torch

from specbench.decoding.proposal import Proposal, Verdict


def top2(logits: torch.Tensor, vocab_size: int) -> tuple[list[list[float]], list[list[float]]]:
    """(margin [B][keep], top-1 logit [B][keep]) of logits [B, keep, V_model] over the first vocab_size entries."""
    vals = logits[..., :vocab_size].float().topk(2, dim=-1).values  # [B, keep, 2]
    return (vals[..., 0] - vals[..., 1]).tolist(), vals[..., 0].tolist()


def committed_columns(keep: int, prop: Proposal, verdict: Verdict) -> list[int]:
    """The verify columns (of keep, a row's last len(prop) + 1 being its root's then its nodes' in proposal order)
    whose distributions chose the committed block's tokens [accepted + 1]: the root's, then each accepted node's."""
    root = keep - len(prop) - 1
    return [root] + [root + 1 + j for j in verdict.path]


def chosen_logits(logits: torch.Tensor, cols: list[list[int]], blocks: list[list[int]]) -> list[list[float]]:
    """Row b's logits at (cols[b][i], blocks[b][i]): each committed token's own logit where it was chosen, one gather."""
    b = [r for r, c in enumerate(cols) for _ in c]
    at = logits[b, [j for c in cols for j in c], [t for block in blocks for t in block]].float().tolist()
    out, i = [], 0
    for c in cols:
        out.append(at[i : i + len(c)])
        i += len(c)
    return out


def committed(margin: list[float], top: list[float], cols: list[int], chosen: list[float]) -> tuple[list[float], list[int]]:
    """The block's margins [len(cols)] and the offsets in the block of the tokens whose logit is below their column's
    top-1 logit (a tie with the top-1 counts as top-1; empty for a lossless greedy method)."""
    return [margin[c] for c in cols], [i for i, (c, z) in enumerate(zip(cols, chosen)) if z < top[c]]
