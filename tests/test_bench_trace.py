"""`bench engine --trace`: the profiler's forwards are the engine's own forward calls, and what is outside them."""

from __future__ import annotations

import json

from helpers import pair_engine
from specbench.bench import cli
from specbench.bench.trace import trace

PROMPT = [5, 17, 42, 9, 77, 3]


def test_a_trace_marks_every_forward_and_keeps_the_engines_ops_outside(tiny_pair, tmp_path):
    """Every model forward the engine counted is one marked span; the margins' one top-2 per iteration is outside
    them; the chrome trace is written."""
    engine = pair_engine(tiny_pair, {"name": "vanilla", "gamma": 3})
    gen = engine.generate(PROMPT, 12)  # warm-up, and the calls to find (greedy: the traced run is the same)
    t = trace(engine, [PROMPT], 12, [tiny_pair.target, tiny_pair.model("draft")], tmp_path / "v.json")
    assert t.iterations == len(gen.records) and t.forwards == gen.target_calls + gen.draft_calls > t.iterations
    assert t.ops["aten::topk"][0] == t.iterations and "aten::linear" not in t.ops  # the models' ops are inside
    assert 0 < t.forward < t.wall and json.loads((tmp_path / "v.json").read_text())["traceEvents"]
    assert f"{t.iterations} iterations, {t.forwards} model forwards" in t.summary()


def test_the_trace_option_writes_both_loops_traces(tmp_path, capsys):
    assert cli.main(["engine", "--pair", "tiny_random", "--prompts", "1", "--max-new-tokens", "6",
                     "--trace", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ar_eager.json", "trace.md", "vanilla_eager.json"]
    text = (tmp_path / "trace.md").read_text()
    assert "### ar eager" in text and "### vanilla eager" in text and text.strip() in capsys.readouterr().out
