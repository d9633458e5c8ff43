"""The engine against independent truth: target-only greedy output, fresh forwards, hand-set stops."""

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from helpers import pair_engine, small
from specbench.runs.runner import run


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def ar_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("ar")
    run(small("method=ar", "decode.max_new_tokens=48"), out)
    return rows(out)


@pytest.mark.parametrize("gamma", [1, 3, 5, 8])
def test_vanilla_greedy_equals_target_greedy(tmp_path, ar_rows, gamma):
    summary = run(small("method=vanilla", f"method.gamma={gamma}", "decode.max_new_tokens=48"), tmp_path)
    got = rows(tmp_path)
    assert len(got) == len(ar_rows) == 24  # every smoke prompt
    for a, v in zip(ar_rows, got):
        assert a["id"] == v["id"]
        assert v["token_ids"] == a["token_ids"], f"{v['id']}: vanilla gamma={gamma} differs from ar"
    # the test is only meaningful if drafts were both accepted and rejected
    assert 0.1 < summary["acceptance_rate"] < 0.95
    assert max(v["drafted"] for v in got) > 0


def test_ar_generates_what_the_target_argmax_gives(tiny_pair, ar_rows):
    """ar's tokens equal a plain no-cache argmax loop over the target (independent of the engine)."""
    from specbench.data.prompting import encode
    from specbench.evaluators.smoke import Smoke

    ex = Smoke().examples()[0]
    ids = encode(tiny_pair.tokenizer, ex)
    seq = torch.tensor([ids], device=tiny_pair.target.device)
    with torch.no_grad():
        for _ in range(48):
            logits = tiny_pair.target(seq).logits[0, -1, : tiny_pair.vocab_size]
            seq = torch.cat([seq, logits.argmax().view(1, 1)], dim=1)
    assert ar_rows[0]["token_ids"] == seq[0, len(ids):].tolist()


def test_cache_crop_semantics(tiny_pair):
    """transformers' Cache.crop(-k) drops the last k tokens: logits after cropping match a fresh forward."""
    model = tiny_pair.target
    ids = torch.arange(3, 23, device=model.device).view(1, -1)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, cache=cache, use_cache=True)
        assert cache.get_seq_length() == 20
        cache.crop(-8)
        assert cache.get_seq_length() == 12
        nxt = torch.tensor([[99]], device=model.device)
        a = model(input_ids=nxt, cache=cache, use_cache=True).logits[0, -1]
        b = model(input_ids=torch.cat([ids[:, :12], nxt], 1)).logits[0, -1]
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        cache.crop(5)  # a positive length is not accepted by this transformers version


def test_eos_stops_both_at_the_same_token(tiny_pair):
    ids = tiny_pair.tokenizer("Why is the sky blue?")["input_ids"]
    free = pair_engine(tiny_pair, {"name": "ar"}).generate(ids, 40).token_ids
    eos = free[len(free) // 2]  # a token the target emits mid-way plays EOS
    cut = free.index(eos) + 1
    a = pair_engine(tiny_pair, {"name": "ar"}, eos_ids={eos}).generate(ids, 40)
    v = pair_engine(tiny_pair, {"name": "vanilla", "gamma": 5}, eos_ids={eos}).generate(ids, 40)
    assert a.token_ids == v.token_ids == free[:cut]
    assert a.stop_reason == v.stop_reason == "eos"


def test_stop_string_cuts_text_and_tokens_alike(tiny_pair):
    tok = tiny_pair.tokenizer
    ids = tok("Write a haiku about the sea.")["input_ids"]
    free = pair_engine(tiny_pair, {"name": "ar"}).generate(ids, 40)
    stop = free.text[10:12]
    a = pair_engine(tiny_pair, {"name": "ar"}, stop_strings=(stop,)).generate(ids, 40)
    v = pair_engine(tiny_pair, {"name": "vanilla", "gamma": 8}, stop_strings=(stop,)).generate(ids, 40)
    assert a.token_ids == v.token_ids and a.stop_reason == v.stop_reason == "stop_string"
    assert a.text == v.text == free.text[: free.text.index(stop)]
    assert stop in tok.decode(a.token_ids) and stop not in tok.decode(a.token_ids[:-1])


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_max_new_tokens_is_exact(tiny_pair, max_new):
    ids = tiny_pair.tokenizer("def fibonacci(n):")["input_ids"]
    a = pair_engine(tiny_pair, {"name": "ar"}).generate(ids, max_new)
    v = pair_engine(tiny_pair, {"name": "vanilla", "gamma": 5}).generate(ids, max_new)
    assert len(a.token_ids) == len(v.token_ids) == max_new and a.token_ids == v.token_ids
    assert v.stop_reason == "length"
    assert all(r.drafted <= max_new - 1 for r in v.records)


def test_context_limit_stops_generation(tiny_pair):
    ids = tiny_pair.tokenizer("Name the planets.")["input_ids"]
    ctx = len(ids) + 6
    v = pair_engine(tiny_pair, {"name": "vanilla", "gamma": 5}, context=ctx).generate(ids, 40)
    assert v.stop_reason == "context" and len(ids) + len(v.token_ids) == ctx


def test_draft_only_uses_the_draft_model(tiny_pair):
    ids = tiny_pair.tokenizer("What is 17 times 23?")["input_ids"]
    gen = pair_engine(tiny_pair, {"name": "draft_only"}).generate(ids, 12)
    out = gen.token_ids
    assert (gen.target_calls, gen.draft_calls) == (0, len(gen.records)) == (0, 12)  # counted by the role called
    seq = torch.tensor([ids], device=tiny_pair.draft.device)
    with torch.no_grad():
        for _ in range(12):
            nxt = tiny_pair.draft(seq).logits[0, -1, : tiny_pair.vocab_size].argmax().view(1, 1)
            seq = torch.cat([seq, nxt], 1)
    assert out == seq[0, len(ids):].tolist()
