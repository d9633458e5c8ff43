"""Acceptance rules: given each row's proposal (specbench.decoding.proposal) and the target's distributions, decide.

A rule is built once per run for its decode settings (`make_rule(spec, greedy)`). The engine calls it once per
iteration for the whole batch, `rule.accept(proposals, p, generators, thresholds)`, and gets one Verdict per row:
the accepted root path and the next token after it. On a chain of drafts x [w] with draft dists q [w, V] and
target dists p [w+1, V] a rule is the per-row call `rule(x, q, p, generator)` -> (ok [w] bool, fallback [w+1]
long): the accepted path is the longest prefix of ok, n = number of leading True, and fallback[n] is the next
token: the correction at the first rejected position, or the bonus token from p_{w+1} when all w drafts are
accepted. On a tree the rule walks down from the root (specbench.decoding.trees). At temperature 0 every base
rule is built as `greedy` (argmax matching); `js_relaxed` then relaxes it. Greedy acceptance is `Greedy`'s alone:
the engine asks no rule for its type.
"""

from __future__ import annotations

import torch

from specbench.common.registry import Registry
from specbench.decoding import trees
from specbench.decoding.proposal import Proposal, Verdict
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

    def accept(self, props: list[Proposal], p: torch.Tensor, generators: list[torch.Generator | None],
               thresholds: list[float] | None = None) -> list[Verdict]:
        """One verdict per row b of a batch: props [B] with n_b nodes, p [B, K, V] whose last n_b + 1 columns are
        row b's target distributions (root first), a generator per row; `thresholds` [B] are the rows'
        relaxation thresholds (T_V), which exact rules ignore. A chain is decided by the per-row call, a tree by
        its walk from the root."""
        K, out = p.shape[1], []
        for b, prop in enumerate(props):
            n, g = len(prop), generators[b]
            pb = p[b, K - n - 1 :]  # [n+1, V]
            if not prop.is_chain:
                path, token = trees.tree_path(self.name, prop, pb, g)
                out.append(Verdict(path, token))
                continue
            x = torch.tensor(prop.tokens, dtype=torch.long, device=p.device)
            ok, fallback = self.decide(x, prop.verify_q(p.shape[-1], p.device), pb, g, thresholds, b)
            n_ok, relaxed, token = self.settle(ok, fallback)
            out.append(Verdict(list(range(n_ok)), token, relaxed, self.distances()))
        return out

    def decide(self, x: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None,
               thresholds: list[float] | None, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row b's chain verdicts (ok [w], fallback [w+1]): the per-row call (a relaxed rule reads thresholds[b])."""
        return self(x, q, p, generator)

    def distances(self) -> torch.Tensor | None:
        """d_JS(p_i, q_i) [w] of the last chain decided, when the rule computed them (a relaxed rule)."""
        return None

    def settle(self, ok: torch.Tensor, fallback: torch.Tensor) -> tuple[int, int, int]:
        """(n, relaxed, next token) of the last call's verdicts ok [w] and fallback [w+1]: n = leading accepted
        drafts, how many of those only a relaxation accepted, and fallback[n]; one host copy."""
        w = ok.shape[0]
        vals = torch.cat((ok.long(), fallback.long())).tolist()
        n = next((i for i in range(w) if not vals[i]), w)
        return n, self.relaxed(n), vals[w + n]


@RULES.register("greedy")
class Greedy(Rule):
    """Accept while x_i == argmax p_i; next = argmax p_{n+1}. Lossless at temperature 0, where every rule is this."""

    name = "greedy"

    def __call__(self, x, q, p, generator):
        top = p.argmax(-1)  # [w+1]
        return x == top[: x.shape[0]], top

    def accept(self, props, p, generators, thresholds=None):
        """One argmax over the batch's p [B, K, V] (one host copy), then each row's longest root path whose every
        token is the argmax at its parent, and the argmax after it (chains and trees alike). A subclass that
        redefines the per-row chain call is decided by that call."""
        if type(self).__call__ is not Greedy.__call__:
            return super().accept(props, p, generators, thresholds)
        K, top = p.shape[1], p.argmax(-1).tolist()  # [B, K]
        out = []
        for b, prop in enumerate(props):
            path, token = trees.greedy_path(prop, top[b][K - len(prop) - 1 :])
            out.append(Verdict(path, token))
        return out


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
        return self.relax(x, q, p, generator, self.threshold)

    def relax(self, x: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None,
              threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The base rule's verdicts on x [w], each mismatch also accepted when d_JS(p_i, q_i) <= threshold."""
        self.js = js_distance(p[: x.shape[0]], q)  # [w]
        self.exact, fallback = self.base(x, q, p, generator)
        return self.exact | (self.js <= threshold), fallback

    def accept(self, props, p, generators, thresholds=None):
        if any(not prop.is_chain for prop in props):
            raise ValueError(f"rule {self.name!r} relaxes chains only: a tree's nodes have no single position to "
                             "compare; use an exact rule (greedy, rejection, sample_match) for trees")
        return super().accept(props, p, generators, thresholds)

    def decide(self, x, q, p, generator, thresholds, b):
        return self.relax(x, q, p, generator, self.threshold if thresholds is None else thresholds[b])

    def distances(self) -> torch.Tensor | None:
        return self.js

    def relaxed(self, n: int) -> int:
        """#{i < n : the base rule rejected x_i}: accepted drafts that only d_JS <= T_V let through."""
        return self.exact[:n].tolist().count(False)

    def settle(self, ok: torch.Tensor, fallback: torch.Tensor) -> tuple[int, int, int]:
        """(n, relaxed, next token) from one host copy of ok [w], the base rule's verdicts [w] and fallback [w+1]."""
        w = ok.shape[0]
        vals = torch.cat((ok.long(), self.exact.long(), fallback.long())).tolist()
        n = next((i for i in range(w) if not vals[i]), w)
        return n, vals[w : w + n].count(0), vals[2 * w + n]


def make_rule(spec: str, greedy: bool = False, threshold: float = 0.0) -> Rule:
    """The rule of a config string ('greedy', 'rejection', 'sample_match', 'js_relaxed(BASE)') for decoding
    greedily (temperature 0: every base rule is `greedy`) or by sampling."""
    spec = spec.strip()
    if spec.startswith("js_relaxed(") and spec.endswith(")"):
        return JSRelaxed(make_rule(spec[len("js_relaxed("):-1], greedy), threshold)
    rule = RULES.get(spec)  # an unknown name fails here, greedy or not
    return Greedy() if greedy else rule()
