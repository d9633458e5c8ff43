"""What a method, a trained drafter or a head reads of the loaded pair (specbench.models.pairs.Pair) beyond the models
of its roles: the one view of it that decoding and models share, neither importing the other."""

from __future__ import annotations

from typing import Protocol

from transformers import PreTrainedModel, PreTrainedTokenizerBase


class PairView(Protocol):
    """The pair's name, target, tokenizers and models by role: for a drafter or head trained for the pair (its folder's
    pair and verifier are checked) and for re-tokenized drafts (the draft's own tokenizer)."""

    @property
    def name(self) -> str: ...
    @property
    def target(self) -> PreTrainedModel: ...
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...
    @property
    def draft_tokenizer(self) -> PreTrainedTokenizerBase | None: ...
    def model(self, role: str) -> PreTrainedModel: ...
