"""`draft_only`: the draft model alone (the papers' "Draft" row)."""

from __future__ import annotations

from specbench.decoding.method import METHODS

from specbench.methods.ar import Autoregressive


@METHODS.register("draft_only")
class DraftOnly(Autoregressive):
    """Autoregressive decoding with the pair's draft model standing in as the verifier."""

    name = "draft_only"
    verifier = "draft"
