"""The target's top-2 margin at each committed position: what tells a float near-tie from a bug when a lossless
greedy run parts from `ar` (specbench.analysis.divergence).

At the verify column c that chose committed token t (the root's for a block's first token, else the accepted node
before it), the target's logits z_c (the first vocab_size entries, float32) give
    margin_c = z_c[(1)] - z_c[(2)]   (top-1 minus top-2 logit, >= 0)
    top1_c   = max z_c               (greedy decoding commits a token with this logit there)
A lossless greedy method commits a token whose logit is top1_c at every position (either of a tie); at a near-tie,
a margin within the verify's float noise (verify widths reorder the reductions), `ar` and the method may pick
different argmaxes and both be right. Costs per iteration one top-2 over the logits [B, keep, V], one gather of the
committed tokens' logits and one copy of both to the host (`to_host`).
"""

from __future__ import annotations

import torch

from specbench.decoding.proposal import Proposal, Verdict


def top2_values(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The two largest logits [B, keep, 2] of logits [B, keep, V_model] over the first vocab_size entries, in float32,
    on the logits' device (no host copy)."""
    return logits[..., :vocab_size].float().topk(2, dim=-1).values


def margins_of(vals: list) -> tuple[list[list[float]], list[list[float]]]:
    """(margin [B][keep], top-1 logit [B][keep]) from the host copy of top2_values [B][keep][2]."""
    return [[a - b for a, b in row] for row in vals], [[a for a, _ in row] for row in vals]


def top2(logits: torch.Tensor, vocab_size: int) -> tuple[list[list[float]], list[list[float]]]:
    """(margin [B][keep], top-1 logit [B][keep]) of logits [B, keep, V_model] over the first vocab_size entries."""
    return margins_of(top2_values(logits, vocab_size).tolist())


def chosen_values(logits: torch.Tensor, cols: list[list[int]], blocks: list[list[int]]) -> torch.Tensor:
    """Each committed token's own logit where it was chosen, row b's at (cols[b][i], blocks[b][i]), flat
    [sum_b len(cols[b])] in float32 on the logits' device: one gather."""
    b = [r for r, c in enumerate(cols) for _ in c]
    return logits[b, [j for c in cols for j in c], [t for block in blocks for t in block]].float()


def by_row(flat: list[float], cols: list[list[int]]) -> list[list[float]]:
    """A flat list cut into rows of len(cols[b])."""
    out, i = [], 0
    for c in cols:
        out.append(flat[i : i + len(c)])
        i += len(c)
    return out


def chosen_logits(logits: torch.Tensor, cols: list[list[int]], blocks: list[list[int]]) -> list[list[float]]:
    """Row b's logits at (cols[b][i], blocks[b][i]) [B][n_b + 1]: each committed token's own logit where it was chosen."""
    return by_row(chosen_values(logits, cols, blocks).tolist(), cols)


def to_host(vals: torch.Tensor, chosen: torch.Tensor, cols: list[list[int]]
            ) -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
    """(margin [B][keep], top-1 [B][keep], chosen [B][n_b + 1]) from top2_values [B, keep, 2] and chosen_values in one
    copy to the host (the engine's one transfer of an iteration's margins)."""
    B, keep = vals.shape[:2]
    flat = torch.cat([vals.flatten(), chosen]).tolist()
    pairs = flat[: 2 * B * keep]
    margin, top = margins_of([[pairs[2 * (b * keep + c) : 2 * (b * keep + c) + 2] for c in range(keep)]
                              for b in range(B)])
    return margin, top, by_row(flat[2 * B * keep :], cols)


def committed_columns(keep: int, prop: Proposal, verdict: Verdict) -> list[int]:
    """The verify columns (of keep, a row's last len(prop) + 1 being its root's then its nodes' in proposal order)
    whose distributions chose the committed block's tokens [accepted + 1]: the root's, then each accepted node's."""
    root = keep - len(prop) - 1
    return [root] + [root + 1 + j for j in verdict.path]


def committed(margin: list[float], top: list[float], cols: list[int], chosen: list[float]) -> tuple[list[float], list[int]]:
    """The block's margins [len(cols)] and the offsets in the block of the tokens whose logit is below their column's
    top-1 logit (a tie with the top-1 counts as top-1; empty for a lossless greedy method)."""
    return [margin[c] for c in cols], [i for i, (c, z) in enumerate(zip(cols, chosen)) if z < top[c]]
