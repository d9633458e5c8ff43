"""Acceptance rules: given drafts x [w], draft dists q [w, V] and target dists p [w+1, V], decide.

A rule is built once per run for its decode settings (`make_rule(spec, greedy)`) and called as
`rule(x, q, p, generator)`. It returns (ok [w] bool, fallback [w+1] long). The engine accepts the
longest prefix of ok, n = number of leading True, and emits fallback[n] as the next token: the
correction at the first rejected position, or the bonus token from p_{w+1} when all w drafts are
accepted. At temperature 0 every base rule is built as `greedy` (argmax matching); `js_relaxed`
then relaxes it.
"""

from __future__ import annotations

import torch

from specbench.common.registry import Registry
from specbench.decoding.sampling import js_distance

RULES: Registry = Registry("acceptance rule")


def leading_true(ok: torch.Tensor) -> int:
    """n = number of leading True values of ok [w] (one host sync)."""
    return int(ok.to(torch.int32).cumprod(0).sum().item()) if ok.numel() else 0


class Rule:
    """Base class; `lossless` says whether the rule preserves the target distribution."""

    name = "base"
    lossless = True

    def __call__(self, x: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(ok [w], fallback [w+1]) for drafts x [w] ~ q [w, V] against p [w+1, V]."""
        raise NotImplementedError  # pragma: no cover - abstract

    def relaxed(self, n: int) -> int:
        """Of the first n drafts of the last call, how many were accepted only by a relaxation (here: none)."""
        return 0

    def count(self, ok: torch.Tensor) -> tuple[int, int]:
        """(n, relaxed) of the last call's verdicts ok [w]: n = leading accepted drafts, and how many of those
        only a relaxation accepted (one host sync)."""
        n = leading_true(ok)
        return n, self.relaxed(n)


@RULES.register("greedy")
class Greedy(Rule):
    """Accept while x_i == argmax p_i; next = argmax p_{n+1}. Lossless at temperature 0, where every rule is this."""

    name = "greedy"

    def __call__(self, x, q, p, generator):
        top = p.argmax(-1)  # [w+1]
        return x == top[: x.shape[0]], top


@RULES.register("rejection")
class Rejection(Rule):
    """Leviathan et al. / Chen et al.: accept x_i w.p. min(1, p_i(x_i)/q_i(x_i)), else draw from
    norm(max(p_i - q_i, 0)); bonus from p_{w+1}. Lossless in distribution."""

    name = "rejection"

    def __call__(self, x, q, p, generator):
        w = x.shape[0]
        idx = torch.arange(w, device=x.device)
        px, qx = p[idx, x], q[idx, x]  # [w]
        u = torch.rand(w, generator=generator, device=p.device)
        ok = u * qx < px  # u < p/q without dividing; q(x) > 0 since x ~ q
        resid = (p[:w] - q).clamp_min(0.0)  # [w, V]
        mass = resid.sum(-1, keepdim=True)
        resid = torch.where(mass > 0, resid, p[:w])  # p == q: rejection impossible, avoid 0/0
        dists = torch.cat([resid, p[w:]], dim=0)  # [w+1, V]; multinomial normalises rows
        fallback = torch.multinomial(dists, 1, generator=generator).squeeze(-1)
        return ok, fallback


@RULES.register("sample_match")
class SampleMatch(Rule):
    """AdaSD Algorithm 1: draw y_i ~ p_i at every position; accept while x_i == y_i; next = y_{n+1}.
    Lossless in distribution (each emitted token is a draw from p given the accepted prefix)."""

    name = "sample_match"

    def __call__(self, x, q, p, generator):
        y = torch.multinomial(p, 1, generator=generator).squeeze(-1)  # [w+1]
        return x == y[: x.shape[0]], y


class JSRelaxed(Rule):
    """`js_relaxed(base)`: the base rule, but a mismatch at position i is also accepted when
    d_JS(p_i, q_i) <= T_V. Lossy. The owning method sets `threshold` (T_V) between iterations.

    The distances d_JS(p_i, q_i) [w] of the last call stay in `js`, so the engine logs them without
    computing them again, and the base rule's verdicts [w] in `exact`, so that the drafts accepted
    only by the relaxation are counted apart (`relaxed`).
    """

    lossless = False

    def __init__(self, base: Rule, threshold: float = 0.0) -> None:
        self.base = base
        self.threshold = threshold
        self.name = f"js_relaxed({base.name})"
        self.js: torch.Tensor | None = None
        self.exact: torch.Tensor | None = None

    def __call__(self, x, q, p, generator):
        self.js = js_distance(p[: x.shape[0]], q)  # [w]
        self.exact, fallback = self.base(x, q, p, generator)
        return self.exact | (self.js <= self.threshold), fallback

    def relaxed(self, n: int) -> int:
        """#{i < n : the base rule rejected x_i}: accepted drafts that only d_JS <= T_V let through."""
        return self.exact[:n].tolist().count(False)

    def count(self, ok: torch.Tensor) -> tuple[int, int]:
        """(n, relaxed) from one host copy of ok [w] and the base rule's verdicts [w]."""
        accepted, exact = torch.stack((ok, self.exact)).tolist()
        n = accepted.index(False) if False in accepted else len(accepted)
        return n, exact[:n].count(False)


def make_rule(spec: str, greedy: bool = False, threshold: float = 0.0) -> Rule:
    """The rule of a config string ('greedy', 'rejection', 'sample_match', 'js_relaxed(BASE)') for decoding
    greedily (temperature 0: every base rule is `greedy`) or by sampling."""
    spec = spec.strip()
    if spec.startswith("js_relaxed(") and spec.endswith(")"):
        return JSRelaxed(make_rule(spec[len("js_relaxed("):-1], greedy), threshold)
    rule = RULES.get(spec)  # an unknown name fails here, greedy or not
    return Greedy() if greedy else rule()
