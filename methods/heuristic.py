"""`heuristic`: transformers' "heuristic" speculation-length schedule, native (GammaTune's "HFHeuristic")."""

from __future__ import annotations

from typing import Any

from specbench.decoding.policy import POLICIES, Policy, check_gamma, state_values
from specbench.decoding.records import IterationRecord


def next_gamma(gamma: int, drafted: int, matches: int) -> int:
    """γ + 2 if every candidate matched, else max(1, γ - 1) (transformers' update_candidate_strategy)."""
    return gamma + 2 if matches == drafted else max(1, gamma - 1)


def transformers_matches(record: IterationRecord) -> int:
    """The match count transformers' schedule gets: it cuts the accepted tokens after the first EOS and recounts
    n_matches = len(valid_tokens) - 1 (generation/utils.py, _assisted_decoding, step 3), so when the drafter ended on
    an EOS the target accepted with every draft, it counts one match fewer than the engine's `accepted`."""
    eos_accepted = record.stop == "eos" and record.drafted > 0 and record.accepted == record.drafted
    return record.accepted - 1 if eos_accepted else record.accepted


@POLICIES.register("heuristic")
class Heuristic(Policy):
    """Draft γ tokens; after each iteration γ += 2 if all drafts were accepted, else γ = max(1, γ - 1).

    transformers' `num_assistant_tokens_schedule="heuristic"` (Mamou et al. 2024a), read from
    AssistedCandidateGenerator.update_candidate_strategy (generation/candidate_generator.py, the same in 5.23 and
    5.24; equal to hf_assisted iteration for iteration on 5.24.0, tests/test_fidelity.py): "all accepted" is
    num_matches == candidate_length, so an iteration that drafted nothing (the length cap) counts as all accepted
    and an accepted drafted EOS does not (`transformers_matches`), which matters only when γ is kept across
    examples; γ has no upper bound (the engine caps each draft at max_new_tokens and the context).
    γ0 (`gamma`) defaults to 5, transformers' num_assistant_tokens while "heuristic" was its default schedule (up to
    4.4x; since then 20, constant: set gamma=20 to match). `persist=false` restarts from γ0 at every example, like
    "heuristic_transient"; `persist=true` keeps γ across the run's examples, like "heuristic" on one assistant model,
    whose num_assistant_tokens transformers writes back to its generation_config after each call.
    """

    def __init__(self, gamma: int = 5, persist: bool = False) -> None:
        self.gamma0 = check_gamma(gamma)  # γ0; self.gamma is the current γ
        self.persist = bool(persist)
        self.gamma = self.gamma0

    def reset(self) -> None:
        if not self.persist:
            self.gamma = self.gamma0

    def window(self) -> int:
        return self.gamma

    def update(self, record: IterationRecord) -> None:
        self.gamma = next_gamma(self.gamma, record.drafted, transformers_matches(record))

    def state(self) -> dict[str, float]:
        return {"gamma": self.gamma}

    @property
    def carried(self) -> dict[str, Any] | None:
        return {"gamma": self.gamma} if self.persist else None

    @carried.setter
    def carried(self, state: dict[str, Any]) -> None:
        (gamma,) = state_values("heuristic", state, ("gamma",))
        self.gamma = check_gamma(gamma)
