"""`vanilla`: speculative decoding with a fixed speculation length γ (the papers' "Vanilla" / "SpecDecode")."""

from __future__ import annotations

from specbench.decoding.method import METHODS, Method, check_gamma


@METHODS.register("vanilla")
class Vanilla(Method):
    """Draft exactly γ tokens per iteration (fewer only at EOS or the length cap), then verify.

    Rule `rejection` by default (Leviathan et al.); `sample_match` or `greedy` by config.
    SD²'s "Pretrained" row is this method with γ = 8.
    """

    name = "vanilla"

    def __init__(self, gamma: int = 5, rule: str = "rejection", **options) -> None:
        super().__init__(rule=rule, **options)
        self.gamma = check_gamma(self.name, gamma)

    def window(self) -> int:
        return self.gamma

    def policy_state(self) -> dict[str, float]:
        return {"gamma": self.gamma}
