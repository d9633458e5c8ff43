"""The compiled decode path (`engine.compile=true`, specbench.decoding.compiled) against the eager one.

Under greedy decoding the compiled path must give exactly the eager path's tokens and (drafted, accepted)
schedule for every lossless method that accepts it, on tiny_random (the smoke prompts) and on the toy pair (toy
arithmetic problems); each pair is loaded once so every method reuses the compiled graphs of its models. The
static cache's roll-back (a position reset) is checked against a cache-free forward, and every refusal names
engine.compile.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

import specbench.runs.runner as runner
from helpers import TEST_DEVICE, compose_cfg, pair_engine, small
from specbench.common.options import OptionError
from specbench.data.dataset import build_dataset
from specbench.data.prompting import encode
from specbench.decoding.compiled import StaticState, width
from specbench.decoding.compose import method_names
from specbench.models.pairs import load_pair
from specbench.runs.results import ROWS, read_rows

MAX_NEW, PROMPTS = 24, 4
NEEDS_TRAINING = ("distilled", "sd2")  # their drafters come from task=distill runs (test_method_contracts covers them)


def refuses(name: str) -> bool:
    """Does method `name` (as configured) refuse the compiled path?"""
    try:
        runner.build_method(OmegaConf.to_container(compose_cfg(f"method={name}").method, resolve=True)
                            ).plan.refuse(name, compile=True)
    except OptionError:
        return True
    return False


def lossless_compiled() -> list[str]:
    """Methods that are lossless as configured and run compiled (the trained-drafter ones aside)."""
    names = []
    for name in method_names():
        if name in NEEDS_TRAINING or refuses(name):
            continue
        cfg = OmegaConf.to_container(compose_cfg(f"method={name}").method, resolve=True)
        if runner.build_method(cfg).plan.lossless:
            names.append(name)
    return names


# the toy pair (76 s of CI) runs in the slow lane; tiny_random, every method the same way, in CI
@pytest.fixture(scope="module", params=["tiny_random", pytest.param("toy", marks=pytest.mark.slow)])
def pair_prompts(request):
    """(pair, prompt ids): tiny_random with the smoke prompts, the toy pair with toy arithmetic problems."""
    dataset = "smoke" if request.param == "tiny_random" else "toy_arith"
    cfg = compose_cfg(f"pair={request.param}", f"dataset={dataset}")
    pair = load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device(TEST_DEVICE))
    examples = build_dataset(OmegaConf.to_container(cfg.dataset, resolve=True)).examples()[:PROMPTS]
    return pair, [encode(pair.tokenizer, ex) for ex in examples]


def decode(pair, name: str, prompts: list[list[int]], compile: bool) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Greedy tokens and (drafted, accepted) per iteration of method `name` on each prompt."""
    cfg = OmegaConf.to_container(compose_cfg(f"method={name}").method, resolve=True)
    engine = pair_engine(pair, cfg, eos_ids=pair.eos_ids([pair.target, pair.draft]), compile=compile)
    out = []
    for ids in prompts:
        gen = engine.generate(ids, MAX_NEW)
        assert gen.decode_s >= gen.target_model_s + gen.draft_model_s > 0, f"{name}: model time exceeds wall time"
        out.append((gen.token_ids, [(r.drafted, r.accepted) for r in gen.records]))
    return out


def test_compiled_equals_eager(pair_prompts):
    pair, prompts = pair_prompts
    names = lossless_compiled()
    assert {"ar", "vanilla", "pld", "layer_skip", "gammatune"} <= set(names), names
    for name in names:
        eager, compiled = decode(pair, name, prompts, False), decode(pair, name, prompts, True)
        for i, (a, b) in enumerate(zip(eager, compiled)):
            assert b[0] == a[0], f"{name}, prompt {i}: compiled tokens differ from eager"
            assert b[1] == a[1], f"{name}, prompt {i}: compiled (drafted, accepted) schedule differs from eager"


def test_rollback_is_a_position_reset(tiny_pair):
    """Feed 6 tokens, roll back to 3 and feed 2 others: logits equal a cache-free forward of the 5 tokens."""
    model = tiny_pair.target
    state = StaticState(model, 1, 64)
    buf = torch.tensor([[5, 17, 42, 99, 7, 8]], device=model.device)
    state.forward(buf, 3, 1)  # the prompt: eager on a fresh cache, compiled on a reused one
    state.forward(buf, 6, 3)
    state.crop(3)
    buf[0, 3:5] = torch.tensor([120, 3])
    got = state.forward(buf, 5, 2)  # width 2: a compiled graph
    with torch.no_grad():
        want = model(buf[:, :5]).logits[:, 3:5]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (width(1), width(3), width(6), width(33)) == (1, 4, 8, None)


def test_a_tree_on_the_static_cache_equals_its_root_paths(tiny_pair):
    """A tree forward on the static cache (its mask a graph input), then keep_paths moving the accepted path's nodes
    into place, then a second tree and a chain forward: every logit equals the cache-free forward of its root path."""
    from specbench.decoding.proposal import ancestors

    model = tiny_pair.target
    state = StaticState(model, 1, 64)
    prefix, tokens, parents = [5, 17, 42, 99, 7], [11, 22, 33, 44, 55], [-1, -1, 0, 1, 3]

    def truth(ids):
        with torch.no_grad():
            return model(torch.tensor([ids], device=model.device)).logits[0, -1]

    def check(logits, prefix):
        torch.testing.assert_close(logits[0, 0], truth(prefix), rtol=1e-4, atol=1e-4)
        for j, anc in enumerate(ancestors(parents)):
            torch.testing.assert_close(logits[0, 1 + j], truth(prefix + [tokens[a] for a in anc]), rtol=1e-4,
                                       atol=1e-4)

    buf = torch.tensor([prefix + [0] * 16], device=model.device)
    state.forward(buf, 3, 1)  # a cached prefix: eager on a fresh cache
    check(state.feed_trees(buf, [5], [tokens], [parents], True), prefix)  # width 8: a compiled graph
    state.keep_paths([5], [[1, 3, 4]])  # not a prefix of the node columns: copied into place
    kept = prefix + [22, 44, 55]
    assert state.fed == [8] and state.forest.nodes == [[]]
    buf[0, : len(kept) + 1] = torch.tensor(kept + [9])
    check(state.feed_trees(buf, [9], [tokens], [parents], True), kept + [9])
    state.keep_paths([9], [[0, 2]])
    buf[0, 9:12] = torch.tensor([11, 33, 6])
    torch.testing.assert_close(state.forward(buf, 12, 1)[0, 0], truth(kept + [9, 11, 33, 6]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("overrides, needle", [
    (("method=hf_assisted",), "another library's loop"),
    (("method=sd2",), "hidden states"),
    (("method=vanilla", "batch_size=2"), "batch_size=1"),
    (("method=vanilla", "engine.compile=yes"), "engine.compile"),
    (("method=vanilla", "+engine.fullgraph=true"), "engine.fullgraph"),
])
def test_refusals_name_the_key(tmp_path, overrides, needle):
    cfg = small(*overrides, "engine.compile=true" if "engine.compile=yes" not in overrides else "limit=1")
    with pytest.raises(OptionError, match=needle) as err:
        runner.run(cfg, tmp_path / "run")
    assert "engine" in str(err.value)
    assert not (tmp_path / "run" / ROWS).exists()


def test_compiled_run_has_its_own_folder(tmp_path):
    """engine.compile=true is part of the run identity and decodes through the runner."""
    from specbench.runs.layout import job_dir

    cfg = small("method=vanilla", "limit=2", "decode.max_new_tokens=8", "engine.compile=true",
                f"paths.results={tmp_path}")
    folder = job_dir(cfg)
    assert "engine.compile=true" in folder.name
    runner.run(cfg, tmp_path / "run")
    assert [r["id"] for r in read_rows(tmp_path / "run" / ROWS)]
