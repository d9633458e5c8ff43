"""`ar`: the target model alone, one token per forward (the papers' "Target" row); `draft_only`, the draft model
alone (the papers' "Draft" row), is the same with `method.verifier=draft` (conf/method/draft_only.yaml). With the
drafter `none`, each iteration is one forward and one token drawn from p (argmax at T=0), counted by exactly the
code that counts the speculative methods'.
"""

from __future__ import annotations

from specbench.decoding.policy import POLICIES, Policy

@POLICIES.register("ar")
class Autoregressive(Policy):
    """Draft nothing: the base policy's window of 0."""
