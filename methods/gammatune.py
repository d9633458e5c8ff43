"""GammaTune and GammaTune+: adaptive speculation length (Gautam et al., "Token-Driven GammaTune: Adaptive
Calibration for Enhanced Speculative Decoding", Algorithm 1).

After each iteration with A accepted drafts out of a planned window γ:
    A' = A + δ           if A == γ (every planned draft accepted: expand)   else A
    γ̄  = clip((1 - η) γ̄ + η A', γ_min, γ_max)                              (EWMA, bounded)
    γ  = ceil(γ̄)
Algorithm 1 writes `γ <- A + δ` on line 2 and overwrites γ on line 5, which would make δ a no-op; we follow the
text (eq. 7, "increases A by a tunable offset δ"). "A == γ" compares with the planned window, so an iteration cut
short (EOS, the length cap, GammaTune+'s confidence stop) with all its drafts accepted does not expand. The paper
gives no values: defaults η = 0.5, δ = 2, γ_min = 1, γ_max = 24, initial γ = 5 (it sweeps the initial γ over 1..8,
12, 16, 20, 24). (γ̄, γ) restart at the initial γ every generation call unless `persist: true`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from specbench.common.options import OptionError, integer, real
from specbench.decoding.policy import POLICIES, Policy, check_gamma, state_values
from specbench.decoding.records import IterationRecord


def gammatune_step(gamma: int, gamma_bar: float, accepted: int, eta: float, delta: int,
                   gamma_min: int, gamma_max: int) -> tuple[int, float]:
    """One GammaTune update: (γ, γ̄, A) -> (new γ, new γ̄)."""
    a = accepted + delta if accepted == gamma else accepted  # eq. 7: expand when all accepted
    gamma_bar = min(gamma_max, max(gamma_min, (1 - eta) * gamma_bar + eta * a))  # eq. 8
    return math.ceil(gamma_bar), gamma_bar


@POLICIES.register("gammatune")
class GammaTune(Policy):
    """Adaptive γ from the EWMA of accepted counts (the module docstring's update)."""

    def __init__(self, gamma: int = 5, eta: float = 0.5, delta: int = 2, gamma_min: int = 1,
                 gamma_max: int = 24, persist: bool = False) -> None:
        self.gamma0 = check_gamma(gamma)
        check_gamma(gamma_min, "gamma_min")
        if not gamma_min <= gamma_max:
            raise OptionError(f"method.gamma_min must be <= method.gamma_max, got gamma_min={gamma_min} > "
                              f"gamma_max={gamma_max}")
        real(eta, "method.eta", low=0, high=1, low_open=True)
        integer(delta, "method.delta", low=0)
        self.eta, self.delta, self.gamma_min, self.gamma_max = eta, delta, gamma_min, gamma_max
        self.persist = persist
        self.gamma, self.gamma_bar = self.gamma0, float(self.gamma0)

    def reset(self) -> None:
        if not self.persist:
            self.gamma, self.gamma_bar = self.gamma0, float(self.gamma0)

    def window(self) -> int:
        return self.gamma

    def update(self, record: IterationRecord) -> None:
        if record.drafted == 0:  # nothing was speculated (length cap): no evidence
            return
        self.gamma, self.gamma_bar = gammatune_step(self.gamma, self.gamma_bar, record.accepted, self.eta,
                                                    self.delta, self.gamma_min, self.gamma_max)

    def state(self) -> dict[str, float]:
        return {"gamma": self.gamma, "gamma_bar": self.gamma_bar}

    @property
    def carried(self) -> dict[str, Any] | None:
        return {"gamma": self.gamma, "gamma_bar": float(self.gamma_bar)} if self.persist else None

    @carried.setter
    def carried(self, state: dict[str, Any]) -> None:
        gamma, gamma_bar = state_values("gammatune", state, ("gamma", "gamma_bar"))
        self.gamma, self.gamma_bar = check_gamma(gamma), float(gamma_bar)


@POLICIES.register("gammatune_plus")
class GammaTunePlus(GammaTune):
    """GammaTune plus the confidence stop: end the draft after a token with max_v q_i(v) < τ."""

    def __init__(self, tau: float = 0.4, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tau = real(tau, "method.tau", low=0, high=1)

    def keep_drafting(self, i: int, q_i: torch.Tensor, token: int) -> bool:
        return bool(q_i.max() >= self.tau)
