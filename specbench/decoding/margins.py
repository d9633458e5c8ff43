"""The target's top-2 margin at each committed position: what tells a float near-tie from a bug when a lossless
greedy run parts from `ar` (specbench.analysis.divergence).

At the verify column c that chose committed token t (the root's for a block's first token, else the accepted node
before it), the target's logits z_c (the first vocab_size entries, float32) give
    margin_c = z_c[(1)] - z_c[(2)]   (top-1 minus top-2 logit, >= 0)
    off_c    = z_c[t] < z_c[(1)]     (t is not a top-1: a tie with the top-1 counts as top-1)
A lossless greedy method commits a token whose logit is the top-1 at every position (either of a tie); at a near-tie,
a margin within the verify's float noise (verify widths reorder the reductions), `ar` and the method may pick
different argmaxes and both be right. Costs per iteration one top-2 over the logits [B, keep, V] and one copy of its
values and argmax to the host; t's own logit is gathered only where t is not the argmax (under greedy decoding a
tie, so almost never).
"""

from __future__ import annotations

import torch

from specbench.decoding.proposal import Proposal, Verdict
from specbench.decoding.sampling import vocab_logits


def top2(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, keep, 3] float32 on the logits' device: the top-1 and top-2 of logits [B, keep, V_model] over the first
    vocab_size entries (in float32) and a top-1 index (exact in float32 below 2^24 entries), in one pass over the
    vocabulary (an argmax beside topk made two: docs/results/engine.md). Where the top two are equal the index may
    be any tied one: host_tops makes it the first."""
    z = vocab_logits(logits, vocab_size)
    top = (z if z.dtype == torch.float32 else z.float()).topk(2, dim=-1)
    return torch.cat([top.values, top.indices[..., :1].float()], -1)


def host_tops(tops: torch.Tensor, logits: torch.Tensor, vocab_size: int) -> list[list[list[float]]]:
    """The host copy of top2's tops [B][keep][3], each index the first top-1, as a greedy decoder's argmax: at a tie
    of the top two (topk orders equal values in no fixed way) the argmax is taken again, all tied columns at once."""
    host = tops.tolist()
    tied = [(b, c) for b, row in enumerate(host) for c, t in enumerate(row) if t[0] == t[1]]
    if tied:  # rare: one gather, one argmax and one copy for them all
        rows, cols = zip(*tied)
        for (b, c), i in zip(tied, vocab_logits(logits[list(rows), list(cols)], vocab_size).argmax(-1).tolist()):
            host[b][c][2] = float(i)
    return host


def block_margins(tops: list, logits: torch.Tensor, cols: list[list[int]], blocks: list[list[int]]
                  ) -> list[tuple[list[float], list[int]]]:
    """Row b's (margins [n_b + 1], offsets in its block of tokens off the top-1) from the host copy of top2
    tops [B][keep][3], for block token i = blocks[b][i] chosen at column cols[b][i] of logits [B, keep, V_model]."""
    out: list[tuple[list[float], list[int]]] = []
    others = []  # (b, i, column, token) where the token is not the argmax: its logit decides (a tie is top-1)
    for b, (cs, block) in enumerate(zip(cols, blocks)):
        out.append(([tops[b][c][0] - tops[b][c][1] for c in cs], []))
        others += [(b, i, c, t) for i, (c, t) in enumerate(zip(cs, block)) if t != tops[b][c][2]]
    if others:
        at = [[o[k] for o in others] for k in (0, 2, 3)]  # rows, columns, tokens
        z = logits[at[0], at[1], at[2]].float().tolist()  # one gather
        for (b, i, c, _), zi in zip(others, z):
            if zi < tops[b][c][0]:
                out[b][1].append(i)
    return out


def committed_columns(keep: int, prop: Proposal, verdict: Verdict) -> list[int]:
    """The verify columns (of keep, a row's last len(prop) + 1 being its root's then its nodes' in proposal order)
    whose distributions chose the committed block's tokens [accepted + 1]: the root's, then each accepted node's."""
    root = keep - len(prop) - 1
    return [root] + [root + 1 + j for j in verdict.path]
