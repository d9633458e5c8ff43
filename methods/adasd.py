"""AdaSD (Lu et al., "AdaSD: Adaptive Speculative Decoding for Efficient Language Model Inference"): an entropy
stop T_G for drafting and a JS-distance acceptance relaxation T_V, both learned during decoding (Algorithm 1), plus
the ablations and Appendix B's T_V variants (docs/design.md section 4), which differ only in whether the entropy stop
is on, whether the rule is `js_relaxed(base)`, and the T_V formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specbench.common.options import OptionError, real
from specbench.decoding.policy import POLICIES, Policy, check_gamma, state_values
from specbench.decoding.records import IterationRecord
from specbench.decoding.sampling import entropy_bits

# what `persist` carries across examples: thresholds, counters and the lists as [sum, count]
CARRIED = ("t_g", "t_v", "c_a", "c_r", "rej_entropy", "rej_js", "acc_js")


@dataclass
class RunningMean:
    """One of Algorithm 1's lists kept as (sum, count): the mean is all the update reads."""

    total: float = 0.0
    n: int = 0

    def add(self, values: list[float]) -> None:
        """Append values to the list."""
        self.total += sum(values)
        self.n += len(values)

    @property
    def mean(self) -> float | None:
        """average(L), or None for an empty list."""
        return self.total / self.n if self.n else None


@POLICIES.register("adasd")
class AdaSD(Policy):
    """AdaSD, Algorithm 1: window W = 20, stop after token i when H(q_i) > T_G, rule `js_relaxed(sample_match)` with
    threshold T_V; T_G = T_V = 0 at the start.

    The lists (lines 10-16): every draft that passes "if x_i != y_i and T_V < d_JS(p_i || q_i)" goes to L_D^A
    (line 16), so drafts accepted only by the JS relaxation count as accepted; the first that fails it goes to L_E^R
    and L_D^R (lines 12-13) and the loop breaks (line 15), so later drafts enter no list. In the engine's record:
    L_D^A += js[:n], and if n < w: L_E^R += H(q_{n+1}), L_D^R += d_JS(p_{n+1}, q_{n+1}). Section 4.3 agrees ("the
    entropy of the rejected candidate token is recorded", singular); section 4.4's "the JS distance of each newly
    generated token is recorded ... based on whether it was accepted or rejected" is read through that break.
    Updates after every iteration (lines 18-19): T_G = average(L_E^R), T_V = (average(L_D^A) + average(L_D^R)) / 2;
    the mean of an empty list leaves its threshold unchanged (the paper initialises the lists to [null]), so T_G
    stays 0 until the first rejection and T_V until both lists are non-empty. Strict inequalities as in the paper:
    drafting stops when T_G < H(q_i) (line 6, the token kept), a mismatch is accepted when d_JS <= T_V (line 11).

    Options: `gamma` (W), `method.parts.rule` (the base rule: sample_match as in the paper, or rejection), `persist`
    (true: thresholds, lists and counters carry across the run's examples, saved with each row so a resumed run
    continues exactly; the warm-up leaves them unchanged), `fixed_t_v` (forces T_V and disables its update, the
    lists still kept). The logged state is t_g and t_v after the update.
    """

    reads_stats = True  # the update reads H(q_i) and d_JS(p_i, q_i) of every draft
    entropy_stop = True  # draft policy: stop once H(q_i) > T_G
    relaxed = True  # rule: js_relaxed(base) with threshold T_V

    def __init__(self, gamma: int = 20, persist: bool = False, fixed_t_v: float | None = None) -> None:
        self.max_window = check_gamma(gamma)
        self.persist = bool(persist)
        if fixed_t_v is not None and not self.relaxed:
            raise OptionError(f"method.fixed_t_v must be null (this method has no verification threshold), got "
                              f"{fixed_t_v!r}")
        self.fixed_t_v = real(fixed_t_v, "method.fixed_t_v", low=0, high=1, null=True)  # JS distance
        self.clear()

    def clear(self) -> None:
        """Algorithm 1's initialisation: empty lists, T_G = T_V = 0, zero sequence counters."""
        self.rej_entropy = RunningMean()  # L_E^R
        self.rej_js = RunningMean()  # L_D^R
        self.acc_js = RunningMean()  # L_D^A
        self.c_a = 0  # iterations with at least one accepted draft (variant C)
        self.c_r = 0  # iterations with a rejected draft (variant C)
        self.t_g = 0.0
        self.t_v = 0.0 if self.fixed_t_v is None else self.fixed_t_v

    def relaxation(self) -> float | None:
        """T_V, which the js_relaxed rule accepts mismatches by (the engine hands each row's to the rule)."""
        return self.t_v if self.relaxed else None

    def reset(self) -> None:
        """New generation call: fresh state unless `persist`."""
        if not self.persist:
            self.clear()

    def window(self) -> int:
        return self.max_window

    def keep_drafting(self, i: int, q_i: torch.Tensor, token: int) -> bool:
        """Continue while H(q_i) <= T_G (line 6 breaks when T_G < H(q_i))."""
        return not self.entropy_stop or float(entropy_bits(q_i)) <= self.t_g

    def update(self, record: IterationRecord) -> None:
        """Lines 10-19: record the accepted drafts and the first rejected one, then refresh T_G, T_V."""
        w, n = record.drafted, record.accepted
        if w == 0:  # nothing drafted (length cap): nothing to record
            return
        js, entropy = record.js, record.entropy
        assert js is not None and entropy is not None  # reads_stats: the engine computes both for every draft
        self.acc_js.add(js[:n])  # line 16, JS-relaxed acceptances included
        self.c_a += int(n > 0)
        if n < w:  # lines 12-13: the first rejected draft, position n+1
            self.rej_entropy.add([entropy[n]])
            self.rej_js.add([js[n]])
            self.c_r += 1
        if self.rej_entropy.mean is not None:
            self.t_g = self.rej_entropy.mean  # line 18: T_G = average(L_E^R)
        t_v = self.verify_threshold()
        if self.relaxed and self.fixed_t_v is None and t_v is not None:
            self.t_v = t_v

    def verify_threshold(self) -> float | None:
        """Line 19: T_V = (average(L_D^A) + average(L_D^R)) / 2; None if a list is empty."""
        a, r = self.acc_js.mean, self.rej_js.mean
        return None if a is None or r is None else (a + r) / 2

    @property
    def carried(self) -> dict[str, Any] | None:
        if not self.persist:
            return None
        return {k: getattr(self, k) for k in CARRIED[:4]} | {k: [getattr(self, k).total, getattr(self, k).n]
                                                               for k in CARRIED[4:]}

    @carried.setter
    def carried(self, state: dict[str, Any]) -> None:
        t_g, t_v, c_a, c_r, *lists = state_values("adasd", state, CARRIED)
        self.t_g, self.c_a, self.c_r = float(t_g), int(c_a), int(c_r)
        self.t_v = float(t_v)
        for k, (total, n) in zip(CARRIED[4:], lists):
            setattr(self, k, RunningMean(float(total), int(n)))

    def state(self) -> dict[str, float]:
        out: dict[str, float] = {"t_g": self.t_g} if self.entropy_stop else {"gamma": self.max_window}
        if self.relaxed:
            out["t_v"] = self.t_v
        return out


@POLICIES.register("adasd_gen_only")
class AdaSDGenOnly(AdaSD):
    """Gen-Only ablation (section 5.3): the entropy stop T_G with the base rule alone (lossless)."""

    relaxed = False


@POLICIES.register("adasd_verify_only")
class AdaSDVerifyOnly(AdaSD):
    """Verify-Only ablation (section 5.3, "we fix the candidate token length to five"): fixed γ,
    `js_relaxed(base)` with the adaptive T_V; no entropy stop."""

    entropy_stop = False

    def __init__(self, gamma: int = 5, persist: bool = False, fixed_t_v: float | None = None) -> None:
        super().__init__(gamma, persist, fixed_t_v)


@POLICIES.register("adasd_variant_a")
class AdaSDVariantA(AdaSD):
    """Appendix B, Variant A: T_V = sum(d_a) / n_a, the mean JS distance of accepted drafts."""

    def verify_threshold(self) -> float | None:
        return self.acc_js.mean


@POLICIES.register("adasd_variant_b")
class AdaSDVariantB(AdaSD):
    """Appendix B, Variant B: T_V = (sum(d_a) + sum(d_r)) / (n_a + n_r), the pooled mean, defined as soon as either
    list has an entry (after a first iteration with only a rejection, T_V = its d_JS)."""

    def verify_threshold(self) -> float | None:
        n = self.acc_js.n + self.rej_js.n
        return (self.acc_js.total + self.rej_js.total) / n if n else None


@POLICIES.register("adasd_variant_c")
class AdaSDVariantC(AdaSD):
    """Appendix B, Variant C: T_V = (c_a·mean(d_a) + c_r·mean(d_r)) / (c_a + c_r), c_a (c_r) = iterations with at
    least one accepted (rejected) draft. c_a = 0 exactly when L_D^A is empty (c_r likewise), where the formula has the
    term 0·(0/0): T_V then keeps its value, as AdaSD's. With c_a == c_r it is AdaSD's midpoint (the paper's remark)."""

    def verify_threshold(self) -> float | None:
        a, r = self.acc_js.mean, self.rej_js.mean
        if a is None or r is None:
            return None
        return (self.c_a * a + self.c_r * r) / (self.c_a + self.c_r)
