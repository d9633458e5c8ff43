"""Drafter `lookup`: prompt lookup decoding (Saxena, 2023): drafts copied from the prompt and the output so far, no draft model.

Lookup (transformers' PromptLookupCandidateGenerator, the same search): for n = min(max_ngram, L - 1) down to 1,
the last n committed tokens s = buf[L-n:L] are searched among all windows buf[j:j+n], left to right; the
first match with a continuation proposes c = buf[j+n : min(j+n+gamma, L)], cut before its first EOS (an empty
cut proposes nothing and ends the search, as there). No match: no drafts, one target forward gives one token.
Every draft has q = one-hot (specbench.decoding.drafts), so `rejection` is lossless at any temperature. Defaults
are transformers' (max_matching_ngram_size 2, prompt_lookup_num_tokens 10, here vanilla's gamma: conf/method/pld.yaml);
equal to hf_assisted's prompt lookup token for token and candidates for candidates on transformers 5.24.0
(tests/test_draft_sources.py). conf/method/pld_spec_bench.yaml is Spec-Bench's PLD row (max_ngram 3, 10 tokens).
"""

from __future__ import annotations

import torch

from specbench.common.options import integer
from specbench.decoding.drafts import DraftSource, Drafting, fixed_proposals
from specbench.decoding.method import Binding
from specbench.decoding.parts import DRAFTERS, Drafter, Needs, Shape
from specbench.decoding.proposal import Proposal
from specbench.decoding.state import Counted


def lookup(ids: torch.Tensor | list[int], max_ngram: int, num_tokens: int, eos_ids: frozenset[int]) -> list[int]:
    """The tokens that followed the first earlier occurrence of the longest matching suffix of ids [L] (n-gram of
    at most max_ngram tokens), at most num_tokens of them and none from the first EOS on; [] without a match."""
    ids = torch.as_tensor(ids)
    L = ids.numel()
    for n in range(min(max_ngram, L - 1), 0, -1):
        # windows ids[j:j+n] equal to the suffix, j < L - n (a continuation exists); the search is vectorised
        starts = (ids.unfold(0, n, 1)[: L - n] == ids[L - n :]).all(1).nonzero()
        if starts.numel():
            j = int(starts[0])
            cont = ids[j + n : min(j + n + num_tokens, L)].tolist()
            return cont[: next((k for k, x in enumerate(cont) if x in eos_ids), len(cont))]
    return []


class Lookup(DraftSource):
    """Prompt lookup over each row's committed tokens buf[b, :L_b], at most the row's cap of tokens (the policy's
    window, fewer near the length limit)."""

    def __init__(self, max_ngram: int, vocab: int, eos_ids: frozenset[int]) -> None:
        self.max_ngram, self.vocab, self.eos_ids = max_ngram, vocab, eos_ids

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        found = [lookup(buf[b, :L], self.max_ngram, m, self.eos_ids) if m > 0 else []
                 for b, (L, m) in enumerate(zip(d.L, d.w_max))]
        return fixed_proposals(found, d)  # no draft forwards


@DRAFTERS.register("lookup")
class PromptLookup(Drafter):
    """Prompt lookup: the continuation of the longest matching n-gram (at most `max_ngram` tokens), at most the
    policy's window of drafts per iteration (gamma, transformers' prompt_lookup_num_tokens)."""

    needs = Needs(proposes=("chain",), pair_draft=False)

    def __init__(self, max_ngram: int = 2) -> None:
        self.max_ngram = integer(max_ngram, "method.max_ngram", low=1)

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        return Lookup(self.max_ngram, binding.vocab_size, binding.eos_ids)

