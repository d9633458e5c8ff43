"""A method's policy: how far a row drafts, when it stops, what it learns from each iteration (its other parts, the
drafter, the shape and the rule, are in specbench.decoding.parts and specbench.decoding.rule).

A policy file under `methods/` subclasses `Policy` and registers itself in `POLICIES` under its name; the engine
gives every row of a batch its own copy (its state: thresholds, γ) and the runner carries `carried` from one
example to the next.
"""

from __future__ import annotations

from typing import Any

import torch

from specbench.common.registry import Registry
from specbench.decoding.records import IterationRecord

POLICIES: Registry[type["Policy"]] = Registry("policy", plugins="specbench.methods")


class Policy:
    """`ar`'s policy: a window of 0, so the engine drafts nothing (its subclasses draft)."""

    reads_stats = False  # update() reads H(q_i) and d_JS(p_i, q_i) of every draft: the engine computes them

    def reset(self) -> None:
        """Start of a generation call (per example)."""

    def window(self) -> int:
        """The speculation length of the next iteration: the most tokens a chain drafts."""
        return 0

    def keep_drafting(self, i: int, q_i: torch.Tensor, token: int) -> bool:
        """After drafting token i (1-based) with draft distribution q_i [V]: draft another?"""
        return True

    def update(self, record: IterationRecord) -> None:
        """Learn from the iteration just finished."""

    def relaxation(self) -> float | None:
        """The threshold T_V a relaxed rule accepts mismatches by (AdaSD); None: the rule is exact."""
        return None

    def state(self) -> dict[str, float]:
        """What an iteration logs of the policy (thresholds, γ)."""
        return {}

    @property
    def carried(self) -> dict[str, Any] | None:
        """The state carried from one example to the next as JSON values (floats round-trip exactly), None when
        every example starts afresh; the runner saves it with each row and sets it on resume."""
        return None

    @carried.setter
    def carried(self, state: dict[str, Any]) -> None:
        raise ValueError(f"this policy carries no state across examples; got {state!r} to restore")


def state_values(name: str, state: Any, keys: tuple[str, ...]) -> list[Any]:
    """The values of `keys` in a saved carried state, which must hold exactly those keys."""
    if not isinstance(state, dict) or set(state) != set(keys):
        raise ValueError(f"method {name!r}: a carried state holds exactly the keys {', '.join(keys)}; got {state!r}")
    return [state[k] for k in keys]


def fixed_window(policy: Policy) -> bool:
    """Does the policy draft its whole window whatever the tokens (keep_drafting not overridden)? Then a compiled
    draft loop needs no host synchronisation before the window ends."""
    return type(policy).keep_drafting is Policy.keep_drafting


def check_gamma(gamma: int, key: str = "gamma") -> int:
    """A speculation length γ >= 1 held by the option `key` (true is not 1)."""
    from specbench.common.options import integer

    return integer(gamma, f"method.{key}", low=1)
