"""AdaSD (Lu et al., "AdaSD: Adaptive Speculative Decoding for Efficient Language Model Inference"): an entropy
stop T_G for drafting and a JS-distance acceptance relaxation T_V, both learned during decoding (Algorithm 1),
plus the ablations and the Appendix B variants of the T_V update.

Registered names (docs/design.md section 4): `adasd`, `adasd_gen_only`, `adasd_verify_only`,
`adasd_variant_a`, `adasd_variant_b`, `adasd_variant_c`. They differ only in whether the entropy
stop is on, whether the rule is `js_relaxed(base)`, and the T_V formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specbench.common.options import real
from specbench.decoding.method import (METHODS, IterationRecord, Method, check_gamma, check_option,
                                       option_error, state_values)
from specbench.decoding.sampling import entropy_bits

BASE_RULES = ("sample_match", "rejection")
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


@METHODS.register("adasd")
class AdaSD(Method):
    """AdaSD, Algorithm 1: window W = 20, stop after token i when H(q_i) > T_G, rule
    `js_relaxed(sample_match)` with threshold T_V; T_G = T_V = 0 at the start.

    Which tokens enter the lists (Algorithm 1, lines 10-16): the verify loop appends to L_D^A
    every draft that passes "if x_i != y_i and T_V < d_JS(p_i || q_i)" (line 16, reached whenever
    that test fails), so drafts accepted only through the JS relaxation count as accepted. The
    first draft that fails it goes to L_E^R and L_D^R (lines 12-13) and the loop breaks (line 15):
    only the first rejected draft of an iteration is recorded; the drafts after it enter no list.
    In the engine's record that is L_D^A += js[:n], and if n < w: L_E^R += H(q_{n+1}),
    L_D^R += d_JS(p_{n+1}, q_{n+1}). Section 4.3 agrees ("the entropy of the rejected candidate
    token is recorded", singular); section 4.4's "the JS distance of each newly generated token is
    recorded ... based on whether it was accepted or rejected" is read through the algorithm's break.

    Updates after every iteration (lines 18-19): T_G = average(L_E^R),
    T_V = (average(L_D^A) + average(L_D^R)) / 2. A formula that needs the mean of an empty list
    leaves its threshold unchanged (docs/design.md; the paper initialises the lists to [null]), so
    T_G stays 0 until the first rejection and T_V stays 0 until both lists are non-empty.
    Strict inequalities as in the paper: drafting stops when T_G < H(q_i) (line 6, the token is
    kept), a mismatch is accepted when d_JS <= T_V (line 11; JSRelaxed does `js <= threshold`).

    Options: `gamma` (the window W), `rule` (base rule: sample_match as in the paper, or rejection),
    `persist` (false: state per generation call as in Algorithm 1; true: thresholds,
    lists and counters carry across the run's examples: reset() then does nothing, each row saves
    them (carried_state) so a resumed run continues exactly, and the warm-up leaves them unchanged),
    `fixed_t_v` (a number forces T_V and disables its update, for tests and ablations; the lists are
    still kept). The logged state is t_g and t_v after the update.
    """

    name = "adasd"
    needs_stats = True  # the update reads H(q_i) and d_JS(p_i, q_i) of every draft
    entropy_stop = True  # draft policy: stop once H(q_i) > T_G
    relaxed = True  # rule: js_relaxed(base) with threshold T_V

    def __init__(self, gamma: int = 20, rule: str = "sample_match", persist: bool = False,
                 fixed_t_v: float | None = None, **options) -> None:
        if rule not in BASE_RULES:
            raise option_error(self.name, f"method.parts.rule must be one of {', '.join(BASE_RULES)} (the base rule of "
                                          f"js_relaxed), got {rule!r}")
        super().__init__(rule=f"js_relaxed({rule})" if self.relaxed else rule, **options)
        self.max_window = check_gamma(self.name, gamma)
        self.persist = bool(persist)
        if fixed_t_v is not None and not self.relaxed:
            raise option_error(self.name, f"method.fixed_t_v must be null (this method has no verification "
                                          f"threshold), got {fixed_t_v!r}")
        self.fixed_t_v = check_option(self.name, real, fixed_t_v, "fixed_t_v", low=0, high=1, null=True)  # JS distance
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

    def relaxation(self) -> float:
        """T_V, which the js_relaxed rule accepts mismatches by (the engine hands each row's to the rule)."""
        return self.t_v

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
        assert js is not None and entropy is not None  # needs_stats: the engine computes both for every draft
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

    def carried_state(self) -> dict[str, Any] | None:
        if not self.persist:
            return None
        return {k: getattr(self, k) for k in CARRIED[:4]} | {k: [getattr(self, k).total, getattr(self, k).n]
                                                               for k in CARRIED[4:]}

    def restore_state(self, state: dict[str, Any]) -> None:
        t_g, t_v, c_a, c_r, *lists = state_values(self.name, state, CARRIED)
        self.t_g, self.c_a, self.c_r = float(t_g), int(c_a), int(c_r)
        self.t_v = float(t_v)
        for k, (total, n) in zip(CARRIED[4:], lists):
            setattr(self, k, RunningMean(float(total), int(n)))

    def policy_state(self) -> dict[str, float]:
        out: dict[str, float] = {"t_g": self.t_g} if self.entropy_stop else {"gamma": self.max_window}
        if self.relaxed:
            out["t_v"] = self.t_v
        return out


@METHODS.register("adasd_gen_only")
class AdaSDGenOnly(AdaSD):
    """Gen-Only ablation (section 5.3): the entropy stop T_G with the base rule alone (lossless)."""

    name = "adasd_gen_only"
    relaxed = False


@METHODS.register("adasd_verify_only")
class AdaSDVerifyOnly(AdaSD):
    """Verify-Only ablation (section 5.3, "we fix the candidate token length to five"): fixed γ,
    `js_relaxed(base)` with the adaptive T_V; no entropy stop."""

    name = "adasd_verify_only"
    entropy_stop = False

    def __init__(self, gamma: int = 5, rule: str = "sample_match", persist: bool = False,
                 fixed_t_v: float | None = None, **options) -> None:
        super().__init__(gamma, rule, persist, fixed_t_v, **options)


@METHODS.register("adasd_variant_a")
class AdaSDVariantA(AdaSD):
    """Appendix B, Variant A: T_V = sum(d_a) / n_a, the mean JS distance of accepted drafts."""

    name = "adasd_variant_a"

    def verify_threshold(self) -> float | None:
        return self.acc_js.mean


@METHODS.register("adasd_variant_b")
class AdaSDVariantB(AdaSD):
    """Appendix B, Variant B: T_V = (sum(d_a) + sum(d_r)) / (n_a + n_r), the pooled mean.

    The formula holds no per-list mean, so it is defined (and applied) as soon as either list
    has an entry: after a first iteration with only a rejection, T_V = that rejection's d_JS.
    """

    name = "adasd_variant_b"

    def verify_threshold(self) -> float | None:
        n = self.acc_js.n + self.rej_js.n
        return (self.acc_js.total + self.rej_js.total) / n if n else None


@METHODS.register("adasd_variant_c")
class AdaSDVariantC(AdaSD):
    """Appendix B, Variant C: T_V = (c_a·mean(d_a) + c_r·mean(d_r)) / (c_a + c_r), c_a (c_r) =
    iterations with at least one accepted (rejected) draft.

    c_a = 0 exactly when L_D^A is empty (c_r likewise), where the formula has the term 0·(0/0):
    as for AdaSD, T_V then keeps its value, so C moves only once both lists are non-empty.
    With c_a == c_r it equals AdaSD's midpoint (the paper's remark).
    """

    name = "adasd_variant_c"

    def verify_threshold(self) -> float | None:
        a, r = self.acc_js.mean, self.rej_js.mean
        if a is None or r is None:
            return None
        return (self.c_a * a + self.c_r * r) / (self.c_a + self.c_r)
