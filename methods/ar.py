"""`ar`: the target model alone, one token per forward (the papers' "Target" row)."""

from __future__ import annotations

from specbench.decoding.method import METHODS, Method


@METHODS.register("ar")
class Autoregressive(Method):
    """Plain autoregressive decoding with the target: the engine loop with w = 0.

    Each iteration is one target forward and one token drawn from p (argmax at T=0), so its
    tokens and timings are counted by exactly the code that counts the speculative methods'.
    """

    name = "ar"
    uses_draft = False
    verifier = "target"

    def __init__(self, rule: str = "rejection", **options) -> None:
        super().__init__(rule=rule, **options)  # with w = 0 every rule draws next ~ p_1
