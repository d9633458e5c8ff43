"""Stops inside accepted blocks: every lossless method ends where `ar` ends, with ar's tokens, reason and text.

Truth is `ar` (one token per iteration, so every stop falls between two of its iterations). For each method
a free greedy decode shows its accepted blocks; random positions inside one block then become an EOS token,
the end of a stop string, max_new_tokens and the context limit (several of them, in random order, often in
the same block), and the method must stop exactly where `ar` with the same settings stops.
"""

import random
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from helpers import SAME_VOCAB, bound_engine, compose_cfg
from specbench.bench import smoke_prompts
from specbench.decoding.engine import Generation
from specbench.decoding.compose import method_names
from specbench.methods.draft_model import DraftModel, Trained
from specbench.methods.eagle3 import Head
from specbench.models.pairs import load_pair
from specbench.runs.runner import build_method
from specbench.decoding.stopping import StopCriteria

# one vocab_size for both models so that hf_assisted (transformers' assisted generation) runs too
PAIR = SAME_VOCAB
FREE = 48  # tokens of the free decode whose blocks the stops are placed in
KINDS = ("eos", "stop_string", "length", "context")


def lossless_methods() -> list[str]:
    """Every registered method whose rows say lossless, ar aside (it is the truth), and the dependent heads aside:
    no trained head is at hand here to give accepted blocks long enough to cut (a head's stops are the same engine
    step 6; the method contracts decode the heads to ar's tokens, EOS and length stops included)."""
    return [n for n in method_names() if n != "ar" and not isinstance((m := build_method({"name": n})).drafter, Head)
            and m.plan.lossless]


@pytest.fixture(scope="module")
def pair():
    return load_pair(OmegaConf.to_container(compose_cfg(*PAIR).pair, resolve=True), torch.device("cpu"))




def decode(pair, ids: list[int]) -> str:
    """Text as the stop check sees it (special tokens skipped)."""
    return pair.tokenizer.decode(ids, skip_special_tokens=True)


def blocks(gen: Generation) -> list[tuple[int, int]]:
    """The new-token ranges [a, b) each iteration committed."""
    out, k = [], 0
    for r in gen.records:
        out.append((k, k + r.accepted + 1))
        k += r.accepted + 1
    return out


def place_stops(rng: random.Random, pair, free: list[int], a: int, b: int) -> dict:
    """Random stop settings whose stops complete at positions (1-based new-token counts) inside (a, b]."""
    kinds = rng.sample(KINDS, rng.randint(2, 4))
    where: dict[str, int] = {}
    settings: dict = {"eos": (), "stops": (), "max_new": FREE + 8, "room": None}
    for kind in kinds:
        pos = rng.randint(a + 1, b)
        if kind == "eos":  # a token that first occurs at pos plays EOS
            firsts = [k for k in range(a + 1, b + 1) if free[k - 1] not in free[: k - 1]]
            if not firsts:
                continue
            pos = rng.choice(firsts)
            settings["eos"] = (free[pos - 1],)
        elif kind == "stop_string":  # a suffix of decode(free[:pos]) not yet in decode(free[:pos-1])
            text, before = decode(pair, free[:pos]), decode(pair, free[: pos - 1])
            cands = [text[-j:] for j in range(1, 5) if j <= len(text) and text[-j:] not in before]
            if not cands:
                continue
            settings["stops"] = (rng.choice(cands),)
        elif kind == "length":
            settings["max_new"] = pos
        else:
            settings["room"] = pos
        where[kind] = pos
    settings["where"] = where
    return settings


def run_with(pair, method_name: str, drafter, prompt: list[int], s: dict) -> Generation:
    ctx = len(prompt) + s["room"] if s["room"] else None
    models = {"target": pair.target, "draft": drafter} if drafter is not None else {"target": pair.target}
    m = build_method({"name": method_name})
    if isinstance(m.drafter, Trained):  # no trained drafter here: `drafter` drafts in vanilla γ=8's loop
        m = replace(m, drafter=DraftModel())
    return bound_engine(m, models, pair.vocab_size, 0.0, s["eos"], pair.tokenizer, s["stops"], ctx
                        ).generate(prompt, s["max_new"])


def test_every_lossless_method_is_checked():
    """The methods checked: every lossless one but the heads (lossless_methods)."""
    names = lossless_methods()
    assert {"vanilla", "heuristic", "confidence", "gammatune", "gammatune_plus", "adasd_gen_only",
            "hf_assisted"} <= set(names)
    assert "draft_only" not in names and "adasd" not in names


@pytest.mark.parametrize("name", lossless_methods() + ["vanilla_self_draft"])
def test_stops_inside_accepted_blocks_match_ar(pair, name):
    """Several stops inside one accepted block (in random order): tokens, reason and text equal ar's."""
    self_draft = name == "vanilla_self_draft"  # the target drafts for itself: every block is fully accepted
    method = "vanilla" if self_draft else name
    drafter = pair.target if self_draft else pair.draft
    rng = random.Random(name)
    prompts = smoke_prompts(pair, 6)
    checked = cut_blocks = 0
    for trial in range(48):  # until enough blocks were checked (methods with short blocks need more trials)
        if checked >= 8 and cut_blocks >= 4:
            break
        prompt = prompts[trial % len(prompts)]
        free = run_with(pair, method, drafter, prompt, {"eos": (), "stops": (), "max_new": FREE, "room": None})
        long_blocks = [(a, b) for a, b in blocks(free) if b - a >= 2]
        if not long_blocks:
            continue
        a, b = rng.choice(long_blocks)
        s = place_stops(rng, pair, free.token_ids, a, b)
        if len(s["where"]) < 2:
            continue
        want = run_with(pair, "ar", None, prompt, s)
        got = run_with(pair, method, drafter, prompt, s)
        assert (got.token_ids, got.stop_reason, got.text) == (want.token_ids, want.stop_reason, want.text), (
            f"{name}, trial {trial}: stops {s['where']} in block {(a, b)}: got {got.stop_reason} after "
            f"{len(got.token_ids)} tokens, ar {want.stop_reason} after {len(want.token_ids)}")
        # the first stop placed is where ar stops (the placement is right), and it lies inside the block
        first = min(s["where"].values())
        assert len(want.token_ids) == first and a < first <= b
        checked += 1
        cut_blocks += first < b  # the method's last block held tokens past the stop, which were dropped
    assert checked >= 8 and cut_blocks >= 4, (checked, cut_blocks)


def test_a_stop_string_then_eos_in_one_block_stops_at_the_string(pair):
    """The audit's case: the stop string completes, then EOS follows in the same accepted block."""
    prompt = smoke_prompts(pair, 1)[0]
    free = run_with(pair, "vanilla", pair.target, prompt, {"eos": (), "stops": (), "max_new": FREE, "room": None})
    a, b = next((a, b) for a, b in blocks(free) if b - a >= 4)
    text = decode(pair, free.token_ids[: a + 2])
    stop = next(text[-j:] for j in range(1, 5) if text[-j:] not in decode(pair, free.token_ids[: a + 1]))
    eos = next(t for k, t in enumerate(free.token_ids[a + 2 : b], a + 2) if t not in free.token_ids[:k])
    s = {"eos": (eos,), "stops": (stop,), "max_new": FREE, "room": None}
    want = run_with(pair, "ar", None, prompt, s)
    got = run_with(pair, "vanilla", pair.target, prompt, s)
    assert want.stop_reason == got.stop_reason == "stop_string"
    assert got.token_ids == want.token_ids == free.token_ids[: a + 2]
    assert stop not in got.text and got.text == want.text


def test_first_stop_checks_each_token_in_ar_order():
    """StopCriteria.first_stop by hand: EOS before stop string before length before context, per token."""

    class Chars:  # a tokenizer whose token i is chr(i)
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    out = [ord(c) for c in "abXYcd"]
    s = StopCriteria(frozenset({ord("c")}), Chars(), ("XY",))
    assert s.first_stop(out, 0, 10, 10) == ("stop_string", 4)  # "XY" completes at token 4, EOS 'c' is token 5
    assert s.first_stop(out, 0, 3, 10) == ("length", 3)
    assert s.first_stop(out, 0, 10, 2) == ("context", 2)
    assert s.first_stop(out, 0, 4, 4) == ("stop_string", 4)  # one token ends it thrice: the stop string first
    assert StopCriteria(frozenset({ord("Y")}), Chars(), ("XY",)).first_stop(out, 0, 10, 10) == ("eos", 4)
    assert s.first_stop(out[:3], 0, 10, 10) == ("", 3)
    assert s.first_stop(out, 4, 10, 10) == ("eos", 5)  # only the new tokens out[4:] are checked
    assert s.text(out[:4], "stop_string") == "ab"
    with pytest.raises(ValueError, match="non-empty"):
        StopCriteria(frozenset(), Chars(), ("",))
