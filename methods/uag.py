"""Drafter `retokenized` (conf/method/uag.yaml): universal assisted generation: a draft model with another tokenizer than the target's, its drafts
re-tokenized through text (Timor et al. 2025; transformers' AssistedCandidateGeneratorDifferentTokenizers).

One iteration at B = 1, with T_t / T_d the target / draft tokenizers (decode keeps special tokens, so chat
markers that both know, such as ChatML's, map to each other):
  1. the draft's context c = T_d.encode(T_t.decode(buf[:L])); its KV cache keeps the longest prefix it shares
     with the previous iteration's context (the rest is re-fed), as transformers keeps the common diagonal;
  2. the draft greedily writes up to gamma draft tokens d (stopping at its EOS) after c;
  3. the new text s = T_d.decode(c + d) minus T_d.decode(c) (a trailing partial UTF-8 character dropped) becomes
     target ids: T_t.encode(T_t.decode(last lookbehind committed ids) + s) minus those committed ids when the
     re-encoding reproduces them, else T_t.encode(s) alone; cut at tokens left and at the first target EOS;
  4. these target ids are drafts with q = one-hot (specbench.decoding.drafts), verified by the target.
Under greedy decoding every accepted token is the target's argmax, so the output equals `ar`'s. Where transformers
differs: it decodes with skip_special_tokens=True and re-encodes with special tokens added, aligns the re-encodings
by the longest common diagonal of the last `target_lookbehind` / `assistant_lookbehind` (10) tokens, also stops the
assistant at its confidence threshold (0.4) and drafts num_assistant_tokens (20) per iteration, so its candidates
per iteration can differ (under greedy its tokens cannot). Temperature > 0 is refused (Needs.greedy_only).
"""

from __future__ import annotations

import os
import sys

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specbench.common.options import OptionError, integer
from specbench.decoding.drafts import DraftSource, Drafting, fixed_proposals
from specbench.decoding.method import Binding
from specbench.decoding.parts import DRAFTERS, Drafter, Needs, Shape
from specbench.decoding.proposal import Proposal
from specbench.decoding.state import Counted, ModelState, model_state
from specbench.decoding.stopping import as_text


def new_text(tok: PreTrainedTokenizerBase, context: list[int], new: list[int]) -> str:
    """The text the tokens `new` add after `context` under tokenizer tok, without a trailing partial character."""
    before, after = as_text(tok.decode(context)), as_text(tok.decode(context + new))
    return after[len(os.path.commonprefix([before, after])) :].rstrip("\ufffd")


def to_target(tok: PreTrainedTokenizerBase, committed: list[int], text: str, lookbehind: int) -> list[int]:
    """Target ids that continue the committed ids [L] with `text`: the re-encoding of the last lookbehind committed
    tokens' text plus `text`, minus those tokens when it reproduces them; else the encoding of `text` alone."""
    window = committed[max(0, len(committed) - lookbehind) :]
    ids = tok.encode(as_text(tok.decode(window)) + text, add_special_tokens=False)
    if ids[: len(window)] == window:
        return ids[len(window) :]
    return tok.encode(text, add_special_tokens=False)


class Retokenized(DraftSource):
    """A draft model of another vocabulary; its greedy drafts re-tokenized for the target (one row)."""

    def __init__(self, state: ModelState, target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase,
                 draft_eos: frozenset[int], lookbehind: int) -> None:
        self.state = state
        self.target_tok, self.draft_tok, self.draft_eos = target_tok, draft_tok, draft_eos
        self.lookbehind = lookbehind
        self.vocab = len(draft_tok)  # logits beyond the draft tokenizer (embedding padding) are ignored
        self.ids: list[int] = []  # the draft tokens of the last iteration (context and drafts)

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        draft = self.state
        if d.w_max[0] <= 0:
            return fixed_proposals([[]], d)
        committed = buf[0, : d.L[0]].tolist()
        ctx = self.draft_tok.encode(self.target_tok.decode(committed), add_special_tokens=False)
        same = len(os.path.commonprefix([self.ids, ctx]))
        draft.crop(min(draft.fed[0], same, len(ctx) - 1))  # the cache keeps what is still the context
        gamma = d.policies[0].window()  # draft tokens this iteration (the policy's window)
        dbuf = torch.zeros((1, len(ctx) + gamma), dtype=torch.long)
        dbuf[0, : len(ctx)] = torch.tensor(ctx)
        new: list[int] = []
        for i in range(gamma):  # greedy draft tokens d_1..d_k (k <= gamma), stopping at the draft's EOS
            x = int(draft.forward(dbuf, len(ctx) + i, 1)[0, 0, : self.vocab].argmax())
            dbuf[0, len(ctx) + i] = x
            new.append(x)
            if x in self.draft_eos:
                break
        self.ids = ctx + new
        prop = to_target(self.target_tok, committed, new_text(self.draft_tok, ctx, new), self.lookbehind)
        return fixed_proposals([prop], d, steps=len(new))


@DRAFTERS.register("retokenized")
class Retokenize(Drafter):
    """A draft model with its own tokenizer drafting the policy's window (gamma) of greedy draft tokens, re-tokenized
    for the target and verified (lossless); as many target candidates per iteration as their text gives."""

    needs = Needs(proposes=("chain",), cross_tokenizer=True,
                  one_row="re-tokenizes each row's context for its draft model and decodes one row at a time",
                  greedy_only="with sampling, transformers drafts across vocabularies by Universal Speculative "
                  "Decoding (draft logits mapped onto the shared tokens), another algorithm not implemented here; use "
                  "method=hf_assisted for it")

    def __init__(self, lookbehind: int = 10) -> None:
        self.lookbehind = integer(lookbehind, "method.lookbehind", low=1)

    def budget(self, nodes: int) -> int:
        """Target candidates per iteration: as many as the window's draft tokens' text gives (not capped)."""
        return sys.maxsize

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        draft, target_tok = binding.models["draft"], binding.tokenizer
        d_tok = (binding.pair.draft_tokenizer if binding.pair is not None else None) or target_tok
        if not isinstance(draft, PreTrainedModel) or target_tok is None or d_tok is None:
            raise OptionError("the retokenized drafter re-tokenizes drafts through text: it needs a transformers draft "
                              "model and the pair's tokenizers")
        eos = {d_tok.eos_token_id}  # the pair's draft_tokenizer None: the target's
        gen = draft.generation_config.eos_token_id if draft.generation_config is not None else None
        eos |= set(gen if isinstance(gen, list) else [gen])
        return Retokenized(model_state(states["draft"]), target_tok, d_tok, frozenset(eos - {None}),
                           self.lookbehind)
