"""The rule interface: the batch's chains in the verify's layout (`Chains`), the `Rule` base class and the registry
of rules by config name (`RULES`). The rules themselves are in specbench.decoding.acceptance (greedy, rejection,
sample_match, js_relaxed) and, as every other part, in a file each under methods/, found on the first lookup
(block: methods/block.py); the layout and the way a rule draws its random numbers are described there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from specbench.common.registry import Registry
from specbench.decoding.proposal import Proposal, Verdict
from specbench.decoding.sampling import exponentials
from specbench.decoding.state import to_device

RULES: Registry[type[Rule]] = Registry("rule", plugins="specbench.methods")  # a rule file in methods/ registers itself


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
    """Base class; `lossless` says whether the rule preserves the target distribution, `walks_trees` whether it
    decides trees too (its `walk`: specbench.decoding.trees) or chains only."""

    name = "base"
    lossless = True
    walks_trees = False

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
        return c.verdicts(ok, fallback, *self.last_decision())

    def walk(self, prop: Proposal, p: torch.Tensor, generator: torch.Generator | None) -> tuple[list[int], int]:
        """(path, next token) of the rule on one tree against p [n+1, V] (specbench.decoding.trees); a rule that
        decides chains only refuses."""
        raise ValueError(f"rule {self.name!r} verifies chains only: {self.chains_only}; trees need one of "
                         f"{', '.join(tree_rules())}")

    chains_only = "it decides one draft per position"  # why a rule without walk() cannot decide a tree

    def last_decision(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(exact [B, W], js [B, W]) of the last decision of a relaxed rule; (None, None) for an exact one."""
        return None, None

    def expected(self, c: Chains, p: torch.Tensor) -> torch.Tensor:
        """E[accepted drafts | the drafts] [B] float64, exact, for the chains c against p [B, W+1, V]: what the rule
        accepts on average on these very drafts (specbench.bench.rules compares rules on the same drafts)."""
        raise NotImplementedError(f"rule {self.name!r} has no closed form for its expected acceptance")


def tree_rules() -> list[str]:
    """The registered rules that walk trees."""
    return [name for name in RULES.names() if RULES.get(name).walks_trees]


def leading_product(c: Chains, a: torch.Tensor) -> torch.Tensor:
    """sum_j prod_{i <= j} a_i [B] over each row's draft columns, a [B, W] the per-draft acceptance probabilities."""
    a = torch.where(c.x >= 0, a.double(), torch.ones_like(a, dtype=torch.float64))  # pads: 1, so products run on
    return torch.where(c.x >= 0, a.cumprod(1), torch.zeros_like(a)).sum(1)
