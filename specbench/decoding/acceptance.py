"""Acceptance rules: given each row's proposal (specbench.decoding.proposal) and the target's distributions, decide.

A rule is built once per run (`make_rule(spec, greedy)`; at temperature 0 every base rule is `greedy`, which
`js_relaxed` then relaxes) and called once per iteration for the batch, `rule.accept(proposals, p, generators,
thresholds)`, giving each row's Verdict: the accepted root path and the next token after it.

Chains are decided in one call (`Rule.decide`) in the verify's layout (vLLM's rejection sampler's, right-aligned),
W = the longest chain: x [B, W] long, row b's n_b drafts in its last n_b columns (`Chains`; pads before them);
q [B, W, V] the distributions they were drawn from (pad rows 0); p [B, W+1, V] the target's, row b's n_b + 1 last
(pads never read). The rule returns ok [B, W] bool and fallback [B, W+1] long: row b, its drafts from column
s_b = W - n_b, accepts the n leading True of ok[b, s_b:] and its next token is fallback[b, s_b + n], the correction
at the first rejection or the bonus token from p_{n_b+1}. Nothing loops over rows in Python or waits for the device
but each row's random draws and the one host copy of the verdicts. Each row draws with its own generator in the
order and shapes a per-row rule does (uniforms [n_b], then a categorical draw from each of n_b + 1 distributions),
so a seeded row gets the tokens it gets alone; a categorical draw is argmax(d / e), e ~ Exp(1) per vocabulary entry
(sampling.categorical: torch.multinomial's method for one sample, without its host check).
`rule(x, q, p, generator)` decides one row: x [w], q [w, V], p [w+1, V] -> ok [w], fallback [w+1]. A tree
(batch_size 1) is walked down from the root (specbench.decoding.trees).
"""

from __future__ import annotations

import torch

from specbench.decoding import trees
from specbench.decoding.proposal import SAMPLED, Proposal, Verdict
from specbench.decoding.rule import RULES, Rule, leading_product, leading_true
from specbench.decoding.sampling import categorical, js_distance
from specbench.decoding.state import to_device

__all__ = ["RULES", "Greedy", "JSRelaxed", "Rejection", "Rule", "SampleMatch", "leading_true", "make_rule"]


@RULES.register("greedy")
class Greedy(Rule):
    """Accept while x_i == argmax p_i; next = argmax p_{n+1}. Lossless at temperature 0, where every rule is this."""

    name = "greedy"
    walks_trees = True

    def walk(self, prop, p, generator):
        return trees.greedy_path(prop, p.argmax(-1).tolist())

    @staticmethod
    def accept_top(props: list[Proposal], top: list[list[int]]) -> list[Verdict]:
        """Every row, chain or tree, walked on the host from argmax p [B][W+1] (row b's last n_b + 1 columns its
        root's then its nodes'; a chain is the tree whose node j has parent j - 1): no device op for the batch, where
        the batched decide takes six. The engine passes the argmax its margins copied (top2) when the rule is this
        one and no statistics need p; a subclass decides through `decide`."""
        keep = len(top[0]) if top else 0
        return [Verdict(*trees.greedy_path(prop, top[b][keep - len(prop) - 1 :])) for b, prop in enumerate(props)]

    def decide(self, c, p, generators, thresholds):
        top = p.argmax(-1)  # [B, W+1]
        return c.x == top[:, : c.W], top

    def expected(self, c, p):
        """The leading matches: deterministic."""
        return leading_product(c, (c.x == p[:, : c.W].argmax(-1)).double())


@RULES.register("rejection")
class Rejection(Rule):
    """Leviathan et al. / Chen et al.: accept x_i w.p. min(1, p_i(x_i)/q_i(x_i)), else draw from
    norm(max(p_i - q_i, 0)); bonus from p_{w+1}. Lossless in distribution."""

    name = "rejection"
    walks_trees = True

    def walk(self, prop, p, generator):
        """Siblings drawn independently from q: SpecInfer's multi-step sampling; else (distinct tokens, drawn without
        replacement, or q None) recursive rejection."""
        if prop.siblings == SAMPLED and prop.q is not None:
            return trees.multi_step_path(prop, p, generator)
        return trees.recursive_rejection_path(prop, p, generator)

    def decide(self, c, p, generators, thresholds):
        W, V = c.W, p.shape[-1]
        q = c.q(V, p.dtype)  # [B, W, V]
        u = c.uniforms(generators)  # [B, W]
        e = c.exponentials(generators, V, p.dtype)  # [B, W+1, V]
        px = p[:, :W].gather(-1, c.index[..., None])[..., 0]  # [B, W]
        qx = q.gather(-1, c.index[..., None])[..., 0]
        ok = u * qx < px  # u < p/q without dividing; q(x) > 0 since x ~ q
        resid = (p[:, :W] - q).clamp_min(0.0)  # [B, W, V]
        resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, p[:, :W])  # p == q: no rejection, avoid 0/0
        return ok, categorical(torch.cat([resid, p[:, W:]], 1), e)  # draws from the unnormalised [B, W+1, V]

    def expected(self, c, p):
        """sum_j prod_{i <= j} min(1, p_i(x_i) / q_i(x_i))."""
        q = c.q(p.shape[-1], p.dtype)
        px = p[:, : c.W].gather(-1, c.index[..., None])[..., 0]
        qx = q.gather(-1, c.index[..., None])[..., 0].clamp_min(torch.finfo(p.dtype).tiny)
        return leading_product(c, (px / qx).clamp_max(1.0))


@RULES.register("sample_match")
class SampleMatch(Rule):
    """AdaSD Algorithm 1: draw y_i ~ p_i at every position; accept while x_i == y_i; next = y_{n+1}.
    Lossless in distribution (each emitted token is a draw from p given the accepted prefix)."""

    name = "sample_match"
    walks_trees = True

    def walk(self, prop, p, generator):
        return trees.sample_match_path(prop, p, generator)

    def decide(self, c, p, generators, thresholds):
        y = categorical(p, c.exponentials(generators, p.shape[-1], p.dtype))  # [B, W+1]
        return c.x == y[:, : c.W], y

    def expected(self, c, p):
        """sum_j prod_{i <= j} p_i(x_i): each draft is kept when the target's draw there is it."""
        return leading_product(c, p[:, : c.W].gather(-1, c.index[..., None])[..., 0])


class JSRelaxed(Rule):
    """`js_relaxed(base)`: the base rule, but a mismatch at position i is also accepted when d_JS(p_i, q_i) <= T_V.
    Lossy. The engine passes each row's T_V; `threshold` serves a call without them (the one-row rule(x, q, p, g)).
    The last call's d_JS [B, W] stay in `js` (logged without recomputing) and the base rule's verdicts [B, W] in
    `exact` (the drafts accepted only by the relaxation are counted apart: Verdict.relaxed)."""

    lossless = False
    chains_only = "it relaxes a mismatch at one position, and a tree's nodes have no single position to compare"

    def __init__(self, base: Rule, threshold: float = 0.0) -> None:
        self.base = base
        self.threshold = threshold
        self.name = f"js_relaxed({base.name})"
        self.js: torch.Tensor | None = None
        self.exact: torch.Tensor | None = None

    def decide(self, c, p, generators, thresholds):
        self.js = js_distance(p[:, : c.W], c.q(p.shape[-1], p.dtype))  # [B, W] float64
        self.exact, fallback = self.base.decide(c, p, generators, None)
        t = to_device(thresholds if thresholds is not None else [self.threshold], torch.float64, self.js.device)
        return self.exact | (self.js <= t[:, None]), fallback

    def last_decision(self):
        return self.exact, self.js


def make_rule(spec: str, greedy: bool = False, threshold: float = 0.0) -> Rule:
    """The rule of a config string ('greedy', 'rejection', 'sample_match', 'js_relaxed(BASE)') for decoding
    greedily (temperature 0: every base rule is `greedy`) or by sampling."""
    spec = spec.strip()
    if spec.startswith("js_relaxed(") and spec.endswith(")"):
        return JSRelaxed(make_rule(spec[len("js_relaxed("):-1], greedy), threshold)
    rule = RULES.get(spec)  # an unknown name fails here, greedy or not
    return Greedy() if greedy else rule()
