"""Method.bind: the one hook through which a method gets the pair it runs on (models, tokenizer, vocabulary)."""

import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.methods.vanilla import Vanilla
from specbench.runs.runner import build_method, make_engine, sampling_params

PARAMS = sampling_params({"temperature": 0.0, "max_new_tokens": 48})


class StopAfterText(Vanilla):
    """vanilla γ=8 that stops drafting after a token whose text contains `text` (as a newline stop would):
    the token ids come from the bound tokenizer over the bound vocabulary range."""

    name = "stop_after_text"

    def __init__(self, text: str) -> None:
        super().__init__(gamma=8)
        self.text = text
        self.stop_ids: set[int] = set()
        self.drafted: list[list[int]] = [[]]  # the drafts of each iteration

    def bind(self, binding) -> None:
        super().bind(binding)
        tok = binding.tokenizer
        self.stop_ids = {i for i in range(binding.vocab_size) if self.text in tok.decode([i])}

    def keep_drafting(self, i: int, q_i: torch.Tensor, token: int) -> bool:
        self.drafted[-1].append(token)
        return token not in self.stop_ids

    def update(self, record) -> None:
        self.drafted.append([])


def test_bind_gives_the_pair_models_tokenizer_and_vocabulary(tiny_pair):
    m = StopAfterText("-")
    eng = make_engine(tiny_pair, m, PARAMS, ())
    b = m.binding
    assert b.tokenizer is tiny_pair.tokenizer and b.vocab_size == tiny_pair.vocab_size
    assert m.verifier_model is tiny_pair.target and m.draft_model is tiny_pair.draft and b.pair is tiny_pair
    assert b.eos_ids == frozenset(tiny_pair.eos_ids([tiny_pair.target, tiny_pair.draft])) and b.params == PARAMS
    want = {i for i in range(tiny_pair.vocab_size) if "-" in tiny_pair.tokenizer.decode([i])}
    assert m.stop_ids == want and len(want) == 1
    gen = eng.generate(tiny_pair.tokenizer("Why is the sky blue?")["input_ids"], 48)
    policy = [d for d, r in zip(m.drafted, gen.records) if r.stop == "policy"]
    assert policy and all(d[-1] in want for d in policy)  # drafting stopped right after the text, every time
    assert all(t not in want for d in m.drafted for t in d[:-1])  # and never ran past it


def test_draft_only_binds_only_the_draft_model(tiny_pair):
    m = build_method({"name": "draft_only"})
    make_engine(tiny_pair, m, PARAMS, ())
    assert m.binding.models == {"draft": tiny_pair.draft} and m.verifier_model is tiny_pair.draft and m.draft_model is None


def test_an_unbound_method_is_refused():
    with pytest.raises(ValueError, match="'vanilla' is not bound to a pair: call method.bind"):
        Engine(build_method({"name": "vanilla"}))
