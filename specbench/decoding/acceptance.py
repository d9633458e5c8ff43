"""Acceptance rules: given each row's proposal (specbench.decoding.proposal) and the target's distributions, decide.

A rule is built once per run for its decode settings (`make_rule(spec, greedy)`). The engine calls it once per
iteration for the whole batch, `rule.accept(proposals, p, generators, thresholds)`, and gets one Verdict per row:
the accepted root path and the next token after it. At temperature 0 every base rule is built as `greedy` (argmax
matching); `js_relaxed` then relaxes it.

Chains are decided for the whole batch in one call (`Rule.decide`), in the layout the verify returns p (the shape
vLLM's rejection sampler works on, here right-aligned): with W = the longest chain,
  x [B, W] long: row b's n_b drafts in its last n_b columns (`Chains`; pad columns before them),
  q [B, W, V]: the distributions they were drawn from (pad rows 0),
  p [B, W+1, V]: the target's, row b's n_b + 1 in its last columns (pad columns are never read),
and the rule returns ok [B, W] bool and fallback [B, W+1] long. Row b's drafts start at column s_b = W - n_b: it
accepts the n leading True of ok[b, s_b:] and its next token is fallback[b, s_b + n]: the correction at the first
rejected position, or the bonus token drawn from p_{n_b+1} when all drafts are accepted.
No step of it loops over rows in Python or waits for the device, except each row's own random draws and the one
host copy of the verdicts. Random draws are made per row with the row's generator, in the order and shapes a
per-row rule makes them (uniforms [n_b], then one categorical draw from each of n_b + 1 distributions), so a seeded
row gets the tokens it gets alone; a categorical draw is argmax(d / e) with e ~ Exp(1) per vocabulary entry
(specbench.decoding.sampling.categorical: torch.multinomial's own method for one sample, without its host check).
`rule(x, q, p, generator)` is the same decision for one row: x [w], q [w, V], p [w+1, V] -> ok [w], fallback [w+1].
A tree (batch_size 1) is walked down from the root (specbench.decoding.trees).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from specbench.common.registry import Registry
from specbench.decoding import trees
from specbench.decoding.proposal import Proposal, Verdict
from specbench.decoding.sampling import categorical, exponentials, js_distance
from specbench.decoding.state import to_device

RULES: Registry = Registry("acceptance rule")


def leading_true(ok: torch.Tensor) -> int:
    """n = number of leading True values of ok [w] (one host sync)."""
    return int(ok.to(torch.int32).cumprod(0).sum().item()) if ok.numel() else 0


@dataclass
class Chains:
    """The batch's chains in the verify's right-aligned layout: row b's n_b drafts in the last n_b of W columns."""

    x: torch.Tensor  # [B, W] long: the drafts, -1 in the pad columns before them (never equal to a token)
    counts: list[int]  # [B] n_b, host ints (known from the proposals: no synchronisation)
    props: list[Proposal] = field(default_factory=list)  # [B] where the q come from (empty: given)
    given_q: torch.Tensor | None = None  # [B, W, V] when the caller has it (the per-row call)

    @classmethod
    def of(cls, props: list[Proposal], W: int, device: torch.device) -> "Chains":
        """The chains of props [B] right-aligned in W columns (W >= max n_b): one host-to-device copy."""
        x = to_device([[-1] * (W - len(prop)) + prop.tokens for prop in props], torch.long, device)
        return cls(x, [len(prop) for prop in props], props)

    @property
    def W(self) -> int:
        """Columns of the layout: p has W + 1."""
        return self.x.shape[1]

    @cached_property
    def index(self) -> torch.Tensor:
        """x [B, W] with the pad columns at 0, to gather by."""
        return self.x.clamp_min(0)

    def q(self, vocab: int, dtype: torch.dtype) -> torch.Tensor:
        """q [B, W, V] as the rule must see it (Proposal.verify_q, right-aligned; pad rows 0)."""
        if self.given_q is not None:
            return self.given_q
        B, W = self.x.shape
        if all(k == W for k in self.counts):  # no row is shorter: one stack
            q = torch.stack([prop.verify_q(vocab, self.x.device) for prop in self.props]).to(dtype)
        else:
            q = torch.zeros((B, W, vocab), dtype=dtype, device=self.x.device)
            for b, prop in enumerate(self.props):
                if len(prop):
                    q[b, W - len(prop) :] = prop.verify_q(vocab, q.device)
        self.given_q = q
        return q

    def uniforms(self, generators: list[torch.Generator | None]) -> torch.Tensor:
        """u [B, W] ~ U[0, 1): row b's n_b draws with its own generator in its last n_b columns (pad 0); one draw
        for the batch when no row has a generator."""
        if all(g is None for g in generators):
            return torch.rand(self.x.shape, device=self.x.device)
        u = torch.zeros(self.x.shape, device=self.x.device)
        for b, (k, g) in enumerate(zip(self.counts, generators)):
            u[b, self.W - k :].uniform_(generator=g)  # torch.rand(k, generator=g)'s draws, in place
        return u

    def exponentials(self, generators: list[torch.Generator | None], vocab: int, dtype: torch.dtype) -> torch.Tensor:
        """e [B, W+1, V] ~ Exp(1): row b's n_b + 1 rows drawn with its own generator in its last rows (pad 1)."""
        return exponentials([k + 1 for k in self.counts], self.W + 1, vocab, generators, self.x.device, dtype)

    def verdicts(self, ok: torch.Tensor, fallback: torch.Tensor, exact: torch.Tensor | None = None,
                 js: torch.Tensor | None = None) -> list[Verdict]:
        """Row b's verdict from ok [B, W], fallback [B, W+1] (and a relaxed rule's exact [B, W], js [B, W]), read
        from one host copy of [ok | fallback (| exact)]: its drafts start at column s_b = W - n_b, it accepts the
        n leading True of ok[b, s_b:], its next token is fallback[b, s_b + n], and relaxed_b = #{accepted drafts
        the exact rule rejected}. (Counting on the host costs less than the device ops that would count.)"""
        W = self.W
        rows = torch.cat([ok, fallback] if exact is None else [ok, fallback, exact], 1).tolist()  # [B][2W+1 (+W)]
        out = []
        for b, (row, k) in enumerate(zip(rows, self.counts)):
            start = W - k
            end = next((i for i in range(start, W) if not row[i]), W)  # the first rejected column, else W
            relaxed = 0 if exact is None else row[2 * W + 1 + start : 2 * W + 1 + end].count(0)
            out.append(Verdict(list(range(end - start)), row[W + end], relaxed, None if js is None else js[b, start:]))
        return out


class Rule:
    """Base class; `lossless` says whether the rule preserves the target distribution."""

    name = "base"
    lossless = True

    def decide(self, c: Chains, p: torch.Tensor, generators: list[torch.Generator | None],
               thresholds: list[float] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(ok [B, W], fallback [B, W+1]) for the chains c against p [B, W+1, V]; a relaxed rule reads
        thresholds [B] (T_V per row; None: its own)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def __call__(self, x: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """One row: (ok [w], fallback [w+1]) for drafts x [w] ~ q [w, V] against p [w+1, V]."""
        c = Chains(x[None], [x.shape[0]], given_q=q[None].to(p.dtype))
        ok, fallback = self.decide(c, p[None], [generator], None)
        return ok[0], fallback[0]

    def accept(self, props: list[Proposal], p: torch.Tensor, generators: list[torch.Generator | None],
               thresholds: list[float] | None = None) -> list[Verdict]:
        """One verdict per row b of a batch: props [B] with n_b nodes, p [B, W+1, V] whose last n_b + 1 columns are
        row b's target distributions (root first), a generator per row; `thresholds` [B] are the rows' relaxation
        thresholds (T_V), which exact rules ignore. Chains are decided by one batched call; a tree (a batch of one
        row) by its walk from the root."""
        if not all(prop.is_chain for prop in props):
            return [Verdict(*self.walk(prop, p[b, p.shape[1] - len(prop) - 1 :], generators[b]))
                    for b, prop in enumerate(props)]
        c = Chains.of(props, p.shape[1] - 1, p.device)
        ok, fallback = self.decide(c, p, generators, thresholds)
        return c.verdicts(ok, fallback, *self.relaxation())

    def walk(self, prop: Proposal, p: torch.Tensor, generator: torch.Generator | None) -> tuple[list[int], int]:
        """(path, next token) of the rule on one tree against p [n+1, V] (specbench.decoding.trees)."""
        return trees.tree_path(self.name, prop, p, generator)

    def relaxation(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(exact [B, W], js [B, W]) of the last decision of a relaxed rule; (None, None) for an exact one."""
        return None, None


@RULES.register("greedy")
class Greedy(Rule):
    """Accept while x_i == argmax p_i; next = argmax p_{n+1}. Lossless at temperature 0, where every rule is this."""

    name = "greedy"

    def decide(self, c, p, generators, thresholds):
        top = p.argmax(-1)  # [B, W+1]
        return c.x == top[:, : c.W], top


@RULES.register("rejection")
class Rejection(Rule):
    """Leviathan et al. / Chen et al.: accept x_i w.p. min(1, p_i(x_i)/q_i(x_i)), else draw from
    norm(max(p_i - q_i, 0)); bonus from p_{w+1}. Lossless in distribution."""

    name = "rejection"

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


@RULES.register("sample_match")
class SampleMatch(Rule):
    """AdaSD Algorithm 1: draw y_i ~ p_i at every position; accept while x_i == y_i; next = y_{n+1}.
    Lossless in distribution (each emitted token is a draw from p given the accepted prefix)."""

    name = "sample_match"

    def decide(self, c, p, generators, thresholds):
        y = categorical(p, c.exponentials(generators, p.shape[-1], p.dtype))  # [B, W+1]
        return c.x == y[:, : c.W], y


class JSRelaxed(Rule):
    """`js_relaxed(base)`: the base rule, but a mismatch at position i is also accepted when
    d_JS(p_i, q_i) <= T_V. Lossy. The owning method sets `threshold` (T_V) between iterations; the engine passes
    each row's.

    The distances d_JS(p_i, q_i) [B, W] of the last call stay in `js`, so the engine logs them without
    computing them again, and the base rule's verdicts [B, W] in `exact`, so that the drafts accepted
    only by the relaxation are counted apart (Verdict.relaxed).
    """

    lossless = False

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

    def accept(self, props, p, generators, thresholds=None):
        if any(not prop.is_chain for prop in props):
            raise ValueError(f"rule {self.name!r} relaxes chains only: a tree's nodes have no single position to "
                             "compare; use an exact rule (greedy, rejection, sample_match) for trees")
        return super().accept(props, p, generators, thresholds)

    def relaxation(self):
        return self.exact, self.js


def make_rule(spec: str, greedy: bool = False, threshold: float = 0.0) -> Rule:
    """The rule of a config string ('greedy', 'rejection', 'sample_match', 'js_relaxed(BASE)') for decoding
    greedily (temperature 0: every base rule is `greedy`) or by sampling."""
    spec = spec.strip()
    if spec.startswith("js_relaxed(") and spec.endswith(")"):
        return JSRelaxed(make_rule(spec[len("js_relaxed("):-1], greedy), threshold)
    rule = RULES.get(spec)  # an unknown name fails here, greedy or not
    return Greedy() if greedy else rule()
