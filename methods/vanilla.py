"""`vanilla`: speculative decoding with a fixed speculation length γ (the papers' "Vanilla" / "SpecDecode")."""

from __future__ import annotations

from specbench.decoding.policy import POLICIES, Policy, check_gamma


@POLICIES.register("vanilla")
class Vanilla(Policy):
    """Draft exactly γ tokens per iteration (fewer only at EOS or the length cap), then verify.

    Rule `rejection` by default (Leviathan et al.); `sample_match` or `greedy` by config.
    SD²'s "Pretrained" row is this method with γ = 8.
    """

    def __init__(self, gamma: int = 5) -> None:
        self.gamma = check_gamma(gamma)

    def window(self) -> int:
        return self.gamma

    def state(self) -> dict[str, float]:
        return {"gamma": self.gamma}
