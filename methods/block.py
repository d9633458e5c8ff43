"""Rule `block`: block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification
Accelerates Speculative Decoding", ICLR 2025, Algorithm 2). Lossless, and it accepts at least as many drafts in
expectation as token-wise rejection (`rejection`) on the same drafts: the whole block is verified jointly.

Row with n drafts x_1..x_n, x_j ~ Q_{j-1}, and the target's P_0..P_n (P_j after j drafts; P_0 at the root):
  weights   w_0 = 1,  w_j = min(1, w_{j-1} P_{j-1}(x_j) / Q_{j-1}(x_j))
  residuals R_j(x) = max(w_j P_j(x) - Q_j(x), 0)                     (j < n), of mass m_j = sum_x R_j(x)
  h_j = m_j / (m_j + 1 - w_j) for j < n (1 where m_j + 1 - w_j = 0: P_j = Q_j and w_j = 1),  h_n = w_n
  η_1..η_n ~ U[0, 1);  τ = max{j >= 1 : η_j < h_j}, 0 if none
  accept x_1..x_τ; the next token is drawn from norm(R_τ) when τ < n (R_0 = max(P_0 - Q_0, 0): token-wise
  rejection's first correction), from P_n when τ = n.
Unlike token-wise rejection, a draft may be kept after a position whose own ratio alone would have rejected it: τ is
the last position that passes, not the first that fails. The weights in closed form: with S_j = sum_{i<=j} log r_i
(r_i = P_{i-1}(x_i) / Q_{i-1}(x_i)), log w_j = S_j - max(0, S_1, .., S_j) (the recursion log w_j = min(0,
log w_{j-1} + log r_j) unrolled), so the whole batch is one cumsum and one cummax.
Random draws as `rejection` makes them (uniforms [n_b], then an exponential per vocabulary entry of n_b + 1 rows),
so both rules read the same numbers from a seeded row's generator. At temperature 0 the rule is `greedy`, as every
rule is (specbench.decoding.acceptance.make_rule). Chains only: a tree is refused (its nodes have no single block).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.decoding.rule import RULES, Chains, Rule
from specbench.decoding.sampling import categorical


def block_weights(log_r: torch.Tensor) -> torch.Tensor:
    """w [B, W] from log_r [B, W] (0 in the pad columns): w_j = min(1, w_{j-1} r_j) with w_0 = 1, as
    exp(S_j - max(0, S_1..S_j)), S the running sum of log r."""
    S = log_r.cumsum(1)  # [B, W]
    top = torch.cummax(S.clamp_min(0.0), 1).values  # max(0, S_1..S_j); clamp first so a -inf S stays below it
    return (S - top).exp()


@dataclass
class Terms:
    """The quantities of Algorithm 2 for a batch of chains, columns as in Chains (pads where `drafted` is False)."""

    drafted: torch.Tensor  # [B, W] bool: row b's draft columns
    w: torch.Tensor  # [B, W]: w_j at draft j's column
    resid: torch.Tensor  # [B, W, V]: R_{j-1} = max(w_{j-1} P_{j-1} - Q_{j-1}, 0) at draft j's column
    mass: torch.Tensor  # [B, W]: m_{j-1}, R_{j-1}'s mass
    h: torch.Tensor  # [B, W]: h_j at draft j's column (0 in the pads)


def terms(c: Chains, p: torch.Tensor, q: torch.Tensor) -> Terms:
    """Algorithm 2's weights, residuals and h for the chains c, x ~ q [B, W, V], against p [B, W+1, V]."""
    W, tiny = c.W, torch.finfo(p.dtype).tiny
    drafted = c.x >= 0
    px = p[:, :W].gather(-1, c.index[..., None])[..., 0]  # [B, W]: P_{j-1}(x_j)
    qx = q.gather(-1, c.index[..., None])[..., 0].clamp_min(tiny)  # Q_{j-1}(x_j) > 0 (x was drawn from it)
    log_r = torch.where(drafted, px.log() - qx.log(), torch.zeros_like(px))  # pads: r = 1, so w stays 1
    w = block_weights(log_r)  # [B, W]
    w_before = torch.cat([torch.ones_like(w[:, :1]), w[:, :-1]], 1)  # [B, W]: w_{j-1}, the weight at column j's P
    resid = (w_before[..., None] * p[:, :W] - q).clamp_min(0.0)  # [B, W, V]
    mass = resid.sum(-1)  # [B, W]
    # h_j (j < n) reads the residual mass one column on, m_j; the last column's h_n = w_n
    denom = mass[:, 1:] + 1.0 - w[:, :-1]
    h_inner = torch.where(denom > 0, mass[:, 1:] / denom.clamp_min(tiny), torch.ones_like(denom))
    h = torch.where(drafted, torch.cat([h_inner, w[:, -1:]], 1), torch.zeros_like(w))
    return Terms(drafted, w, resid, mass, h)


@RULES.register("block")
class Block(Rule):
    """Sun et al.'s block verification of each row's chain; lossless in distribution."""

    name = "block"
    chains_only = "it decides a block of consecutive drafts, and a tree's nodes are not one block"

    def decide(self, c: Chains, p: torch.Tensor, generators: list[torch.Generator | None],
               thresholds: list[float] | None) -> tuple[torch.Tensor, torch.Tensor]:
        W, V = c.W, p.shape[-1]
        q = c.q(V, p.dtype)  # [B, W, V]; pad rows 0
        eta = c.uniforms(generators)  # [B, W]
        e = c.exponentials(generators, V, p.dtype)  # [B, W+1, V]
        if W == 0:  # no row drafted: the next token is the target's
            return c.x >= 0, categorical(p, e)
        t = terms(c, p, q)
        passes = t.drafted & (eta < t.h)  # η_j < h_j
        cols = torch.arange(1, W + 1, device=p.device)  # [W]
        end = torch.where(passes, cols, torch.zeros_like(cols)).amax(1)  # [B]: the column after the last pass
        ok = cols[None] - 1 < end[:, None]  # [B, W]: the leading columns up to the last that passed
        resid = torch.where(t.mass[..., None] > 0, t.resid, p[:, :W])  # no mass (float rounding): the target's p
        return ok, categorical(torch.cat([resid, p[:, W:]], 1), e)  # [B, W+1]

    def expected(self, c: Chains, p: torch.Tensor) -> torch.Tensor:
        """E[τ | drafts] [B] = sum_j P(τ >= j) = sum_j (1 - prod_{i >= j} (1 - h_i)), over each row's drafts."""
        if c.W == 0:
            return torch.zeros(c.x.shape[0], dtype=torch.float64, device=p.device)
        h = terms(c, p, c.q(p.shape[-1], p.dtype)).h.double()
        below = (1 - h).flip(1).cumprod(1).flip(1)  # [B, W]: prod_{i >= j} (1 - h_i); pads' 1 - h = 1
        return torch.where(c.x >= 0, 1 - below, torch.zeros_like(below)).sum(1)

