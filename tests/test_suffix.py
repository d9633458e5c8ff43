"""SuffixDecoding (specbench.decoding.suffix, methods/suffix.py) against arctic-inference's own SuffixTree, whose
answers on 600 speculations are stored in tests/data/suffix_reference.json (docs/fidelity/cmp_suffix.py wrote them
from the reference's C++ module: random sequences with many count ties, path and tree speculation, every setting);
the method's run-wide tree across examples; what it refuses. Greedy equality with ar, the sampling chi-square,
windows and traces are the method contracts' (tests/test_method_contracts.py: suffix and suffix[shape=tree]); a
resumed and a warmed-up run give the uninterrupted rows (tests/test_carried_state.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import ROOT, small
from specbench.common.options import OptionError
from specbench.decoding.suffix import SuffixIndex, child_order
from specbench.runs.results import ROWS, read_rows
from specbench.runs.runner import build_method, run
from specbench.runs.traces import read_traces

REFERENCE = json.loads((ROOT / "tests" / "data" / "suffix_reference.json").read_text())


def f32(d: dict) -> tuple:
    return d["tokens"], d["parents"], [np.float32(p) for p in d["probs"]], np.float32(d["score"]), d["match_len"]


def test_speculation_equals_arctic_inference():
    n = trees = 0
    for config in REFERENCE:
        index = SuffixIndex(config["depth"])
        for s in config["sequences"]:
            index.new_sequence(s)
        for case in config["cases"]:
            d = index.speculate(case["context"], *case["args"])
            got = {"tokens": d.tokens, "parents": d.parents, "probs": d.probs, "score": d.score,
                   "match_len": d.match_len}
            assert f32(got) == f32(case["reference"]), (config["sequences"], case)
            n += 1
            trees += case["args"][-1] and len(set(d.parents)) < len(d.parents)  # a node with two children
    assert n == 600 and trees > 10  # trees that branch were compared, not only chains


def test_sibling_order_replays_the_references_lists():
    """Counts 5:2, 6:2, 7:3 reached in the order 5 6 6 5 7 7 7: a child moving up from the head of its run goes before
    the whole run above (5 before 6), one from inside it goes after (7 is last at 2, first at 3)."""
    assert child_order(np.array([5, 6, 6, 5, 7, 7, 7])) == [7, 5, 6]
    assert child_order(np.array([5, 6, 7, 7])) == [7, 5, 6]


def test_truncate_keeps_the_first_sequences():
    index = SuffixIndex(8)
    for s in ([1, 2, 3], [4, 5], [6]):
        index.new_sequence(s)
    index.truncate(2)
    assert index.data == [1, 2, 3, -1, 4, 5] and index.starts == [0, 4]
    index.truncate(0)
    assert index.data == [] and index.starts == []
    index.new_sequence([7, 8, 9])
    index.array  # cached at this length
    index.truncate(0)
    index.new_sequence([4, 5, 6])  # the same length again: the index reads the new tokens
    assert index.array.tolist() == [4, 5, 6] and index.speculate([9, 4, 5], 4).tokens == [6]


def test_the_run_tree_grows_with_each_recorded_example(tmp_path):
    """Each recorded example enters the run's tree (state run_outputs in the traces); a warm-up adds nothing;
    without global_cache the state stays empty and the rows carry none."""
    out = tmp_path / "run"
    run(small("method=suffix", "limit=3", "decode.max_new_tokens=16", "trace=true", "warmup=1"), out)
    rows, traces = read_rows(out / ROWS), read_traces(out)
    assert [r["carried_state"] for r in rows] == [{"outputs": 1}, {"outputs": 2}, {"outputs": 3}]
    assert [int(traces[traces["id"] == r["id"]]["run_outputs"].max()) for r in rows] == [0, 1, 2]
    out = tmp_path / "local"
    run(small("method=suffix", "method.global_cache=false", "limit=2", "decode.max_new_tokens=8"), out)
    assert all("carried_state" not in r for r in read_rows(out / ROWS))


def test_a_row_proposes_what_its_prompt_repeats():
    """Prompt 1 2 3 4 5 9 1 2 3: the match "1 2 3" (two occurrences, one followed by 4) gives 4 5 9 at probability 0.5
    each (at most 3 tokens: max_spec_factor 1 times the match length), the best score; a second row with nothing to
    match proposes nothing, and a row with no room proposes nothing either."""
    import torch

    from specbench.decoding.drafts import Drafting
    from specbench.decoding.sampling import Sampler, SamplingParams
    from specbench.methods.suffix import SuffixDraft

    m = build_method({"name": "suffix"})
    prompt = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    buf = torch.zeros((3, 20), dtype=torch.long)
    buf[0, :9] = torch.tensor(prompt)
    buf[1, :3] = torch.tensor([7, 8, 6])
    buf[2, :9] = torch.tensor(prompt)
    d = Drafting([9, 3, 9], [16, 16, 0], [m.policy] * 3, [None] * 3, Sampler(SamplingParams(0.0), 16), frozenset())
    props = SuffixDraft(m.drafter, 3, False).propose(buf, d)
    assert props[0].tokens == [4, 5, 9] and props[0].is_chain and props[0].q is None
    assert props[1].tokens == [] and props[2].tokens == []
    assert SuffixIndex(64).speculate(prompt, 16).tokens == []  # an empty tree speculates nothing
    index = SuffixIndex(64)
    index.new_sequence(prompt)
    assert index.speculate(prompt, 16).probs == [0.5, 0.5, 0.5]


def test_options_and_refusals():
    with pytest.raises(OptionError, match="method.global_cache must be true or false"):
        build_method({"name": "suffix", "global_cache": "yes"})
    with pytest.raises(OptionError, match="the lookup drafter proposes chains .shape chain.; got method.parts.shape=tree"):
        build_method({"name": "pld", "parts": {"shape": "tree"}})
    with pytest.raises(OptionError, match="method.min_token_prob"):
        build_method({"name": "suffix", "min_token_prob": 2})
    m = build_method({"name": "suffix", "parts": {"shape": "tree"}})
    m.plan.refuse(m.name, 4)  # trees decode in batches too, and compiled
    m.plan.refuse(m.name, compile=True)
    build_method({"name": "suffix"}).plan.refuse("suffix", 4)  # chains decode in batches
