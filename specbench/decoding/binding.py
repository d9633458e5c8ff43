"""The pair as a method runs on it (`Binding`), handed to the method and its parts once before decoding."""

from __future__ import annotations

from dataclasses import dataclass
import torch
from transformers import PreTrainedTokenizerBase

from specbench.common.pair_view import PairView
from specbench.decoding.sampling import SamplingParams


@dataclass(frozen=True)
class Binding:
    """The pair as a method runs on it, fixed before decoding and handed over once by `Method.bind`."""

    models: dict[str, torch.nn.Module]  # pair role ('target', 'draft') -> the model playing it, for the roles the method runs
    tokenizer: PreTrainedTokenizerBase | None  # the pair's tokenizer (None for test models without one)
    vocab_size: int  # the shared tokenizer range; logits beyond it (embedding padding) are ignored
    eos_ids: frozenset[int]  # ids that end a generation
    params: SamplingParams  # decode settings: temperature (0 = greedy), top-k, top-p
    context_length: int | None = None  # the smallest model context, None if no model declares one
    pair: PairView | None = None  # the loaded specbench.models.pairs.Pair, for a method that loads a drafter trained for it
