"""Method.bind: the one hook through which a method gets the pair it runs on (models, tokenizer, vocabulary), its
drafter's bind the place a part reads it."""

import pytest
import torch

from specbench.decoding.compose import compose
from specbench.decoding.engine import Engine
from specbench.decoding.parts import Shape
from specbench.methods.draft_model import DraftModel
from specbench.methods.vanilla import Vanilla
from specbench.runs.runner import build_method, make_engine, sampling_params

PARAMS = sampling_params({"temperature": 0.0, "max_new_tokens": 48})


class StopAfterText(Vanilla):
    """vanilla γ=8 that stops drafting after a token of `stop_ids` (as a newline stop would)."""

    def __init__(self) -> None:
        super().__init__(gamma=8)
        self.stop_ids: set[int] = set()
        self.drafted: list[list[int]] = [[]]  # the drafts of each iteration

    def keep_drafting(self, i: int, q_i: torch.Tensor, token: int) -> bool:
        self.drafted[-1].append(token)
        return token not in self.stop_ids

    def update(self, record) -> None:
        self.drafted.append([])


class TextStops(DraftModel):
    """The pair's draft model; at bind, the ids whose text contains `text` (from the bound tokenizer over the bound
    vocabulary range) become the policy's stops."""

    def __init__(self, policy: StopAfterText, text: str) -> None:
        self.policy, self.text = policy, text

    def bind(self, binding, shape):
        tok = binding.tokenizer
        self.policy.stop_ids = {i for i in range(binding.vocab_size) if self.text in tok.decode([i])}
        return binding


def test_bind_gives_the_pair_models_tokenizer_and_vocabulary(tiny_pair):
    policy = StopAfterText()
    eng = make_engine(tiny_pair, compose(policy, TextStops(policy, "-"), Shape(), name="stop_after_text"), PARAMS, ())
    b = eng.method.bound
    assert b.tokenizer is tiny_pair.tokenizer and b.vocab_size == tiny_pair.vocab_size
    assert b.models == {"target": tiny_pair.target, "draft": tiny_pair.draft} and b.pair is tiny_pair
    assert b.eos_ids == frozenset(tiny_pair.eos_ids([tiny_pair.target, tiny_pair.draft])) and b.params == PARAMS
    want = {i for i in range(tiny_pair.vocab_size) if "-" in tiny_pair.tokenizer.decode([i])}
    assert policy.stop_ids == want and len(want) == 1
    gen = eng.generate(tiny_pair.tokenizer("Why is the sky blue?")["input_ids"], 48)
    stopped = [d for d, r in zip(policy.drafted, gen.records) if r.stop == "policy"]
    assert stopped and all(d[-1] in want for d in stopped)  # drafting stopped right after the text, every time
    assert all(t not in want for d in policy.drafted for t in d[:-1])  # and never ran past it


def test_draft_only_binds_only_the_draft_model(tiny_pair):
    m = make_engine(tiny_pair, build_method({"name": "draft_only"}), PARAMS, ()).method
    assert m.bound.models == {"draft": tiny_pair.draft} and m.plan.verifier == "draft" and m.plan.kind == "none"


def test_an_unbound_method_is_refused():
    with pytest.raises(ValueError, match="'vanilla' is not bound to a pair: bind it"):
        Engine(build_method({"name": "vanilla"}))
