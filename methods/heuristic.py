"""`heuristic`: transformers' "heuristic" speculation-length schedule, native (GammaTune's "HFHeuristic")."""

from __future__ import annotations

from typing import Any

from specbench.decoding.method import METHODS, IterationRecord, Method, check_gamma, state_values


def next_gamma(gamma: int, drafted: int, matches: int) -> int:
    """γ + 2 if every candidate matched, else max(1, γ - 1) (transformers' update_candidate_strategy)."""
    return gamma + 2 if matches == drafted else max(1, gamma - 1)


def transformers_matches(record: IterationRecord) -> int:
    """The match count transformers feeds its schedule for this iteration.

    transformers cuts the accepted tokens after the first EOS and then recounts
    n_matches = len(valid_tokens) - 1 (generation/utils.py, _assisted_decoding, step 3). When the
    drafter ended on an EOS (stop == "eos") and the target accepted every draft, the EOS is the
    last valid token, so transformers counts one match fewer than the engine's `accepted`.
    """
    eos_accepted = record.stop == "eos" and record.drafted > 0 and record.accepted == record.drafted
    return record.accepted - 1 if eos_accepted else record.accepted


@METHODS.register("heuristic")
class Heuristic(Method):
    """Draft γ tokens; after each iteration γ += 2 if all drafts were accepted, else γ = max(1, γ - 1).

    This is transformers' `num_assistant_tokens_schedule="heuristic"` (Mamou et al. 2024a), read from
    transformers' generation/candidate_generator.py, AssistedCandidateGenerator.update_candidate_strategy (the
    same code in 5.23 and 5.24; equal to hf_assisted iteration for iteration on 5.24.0, tests/test_fidelity.py):
      - "all accepted" is num_matches == candidate_length, so an iteration that drafted nothing (the length
        cap) also counts as all accepted (γ += 2), and an accepted drafted EOS does not (see
        `transformers_matches`); both only matter when γ is kept across examples;
      - γ has no upper bound (the engine caps each draft at max_new_tokens and the context).
    The initial γ0 (option `gamma`) defaults to 5: transformers' num_assistant_tokens default while
    "heuristic" was its default schedule (up to 4.4x); since then the default is 20 with a constant schedule
    (set gamma=20 to match). `persist=false` (default) restarts from γ0 at every example, like
    transformers' "heuristic_transient"; `persist=true` keeps γ across the run's examples, like
    "heuristic" on one assistant model, where transformers writes num_assistant_tokens back to the
    assistant's generation_config after each call.
    Rule `rejection` (built as `greedy` at temperature 0).
    """

    name = "heuristic"

    def __init__(self, gamma: int = 5, persist: bool = False, rule: str = "rejection", **options) -> None:
        super().__init__(rule=rule, **options)
        self.gamma0 = check_gamma(self.name, gamma)  # γ0; self.gamma is the current γ
        self.persist = bool(persist)
        self.gamma = self.gamma0

    def reset(self) -> None:
        if not self.persist:
            self.gamma = self.gamma0

    def window(self) -> int:
        return self.gamma

    def update(self, record: IterationRecord) -> None:
        self.gamma = next_gamma(self.gamma, record.drafted, transformers_matches(record))

    def policy_state(self) -> dict[str, float]:
        return {"gamma": self.gamma}

    def carried_state(self) -> dict[str, Any] | None:
        return {"gamma": self.gamma} if self.persist else None

    def restore_state(self, state: dict[str, Any]) -> None:
        (gamma,) = state_values(self.name, state, ("gamma",))
        self.gamma = check_gamma(self.name, gamma)
