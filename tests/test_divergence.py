"""Divergences explained: the engine's top-2 margins against a cache-free forward, a planted bug (a rule accepting
every draft) classed `suspect`, a constructed near-tie classed `near-tie`, and the report's overview and table."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import AcceptAll, FixedGamma, add_fields, pair_engine, write_run
from specbench.analysis import divergence, load, report
from specbench.common.near_ties import near_tie_limit

PROMPT = [5, 17, 42, 9, 77, 3]


def cache_free_top2(model, ids: list[int], vocab: int) -> tuple[float, int]:
    """(top-1 - top-2 logit, argmax) of the target's next-token logits after ids, from one forward without a cache."""
    with torch.no_grad():
        z = model(torch.tensor([ids], device=model.device)).logits[0, -1, :vocab].float()
    v, i = z.topk(2)
    return float(v[0] - v[1]), int(i[0])


@pytest.mark.parametrize("method", [{"name": "ar"}, {"name": "vanilla", "gamma": 4},
                                    {"name": "dyn_tree", "total_nodes": 8, "depth": 3, "top_k": 3, "parts": {"rule": "greedy"}}])
def test_margins_are_the_targets_top2_at_each_committed_token(tiny_pair, method):
    """Every lossless greedy method records, per token, the margin a cache-free forward of the target gives at that
    prefix, and commits its top-1 (off_top1 empty)."""
    gen = pair_engine(tiny_pair, method).generate(PROMPT, 20)
    assert len(gen.margins) == len(gen.token_ids) == 20 and gen.off_top1 == []
    for t in range(20):
        margin, top1 = cache_free_top2(tiny_pair.target, PROMPT + gen.token_ids[:t], tiny_pair.vocab_size)
        assert gen.token_ids[t] == top1
        assert gen.margins[t] == pytest.approx(margin, abs=1e-4)


def test_a_rule_that_accepts_wrong_tokens_is_suspect(tiny_pair):
    """The planted bug: a rule accepting every draft commits the draft's tokens; the first one that is not the
    target's top-1 is in off_top1 and the divergence from ar there is `suspect`, whatever the margin."""
    ar = pair_engine(tiny_pair, {"name": "ar"}).generate(PROMPT, 24)
    bad = pair_engine(tiny_pair, FixedGamma(AcceptAll())).generate(PROMPT, 24)
    assert bad.token_ids != ar.token_ids and bad.off_top1  # the test means something: wrong tokens were committed
    rows = [{"token_ids": g.token_ids, "top2_margins": g.margins, "off_top1": g.off_top1} for g in (ar, bad)]
    d = divergence.first_divergence("p", rows[0], rows[1], limit=1e9)  # even a huge near-tie threshold
    assert d.kind == "suspect" and d.position == bad.off_top1[0]
    assert d.ar_token == ar.token_ids[d.position] and d.run_token == bad.token_ids[d.position]


def row(tokens, margins, off=()):
    return {"token_ids": tokens, "top2_margins": margins, "off_top1": list(off)}


def test_first_divergence_by_hand():
    ar = row([1, 2, 3, 4], [2.0, 1.5, 0.004, 3.0])
    # a near-tie at position 2: ar's margin 0.004 < 0.01 (float32); the run's own margin there is larger
    d = divergence.first_divergence("x", ar, row([1, 2, 9, 8], [2.0, 1.5, 0.3, 1.0]), near_tie_limit("float32"))
    assert (d.position, d.ar_token, d.run_token, d.ar_margin, d.run_margin, d.kind) == (2, 3, 9, 0.004, 0.3, "near-tie")
    # the same place, but the run's token is not its verify's top-1: suspect
    assert divergence.first_divergence("x", ar, row([1, 2, 9, 8], [2.0, 1.5, 0.3, 1.0], [2]), 0.01).kind == "suspect"
    # a clear margin in float32 is suspect; the same margin in bfloat16 is within its noise
    clear = row([1, 2, 3, 4], [2.0, 1.5, 0.2, 3.0])
    assert divergence.first_divergence("x", clear, row([1, 2, 7], [2.0, 1.5, 0.2]), 0.01).kind == "suspect"
    assert divergence.first_divergence("x", clear, row([1, 2, 7], [2.0, 1.5, 0.2]),
                                       near_tie_limit("bfloat16")).kind == "near-tie"
    # same tokens, another length (a stop handled differently): suspect; equal rows: no divergence
    assert divergence.first_divergence("x", ar, row([1, 2, 3], [2.0, 1.5, 0.004]), 0.01).kind == "suspect"
    assert divergence.first_divergence("x", ar, ar, 0.01) is None
    # a row without margins (hf_assisted): ar's margin decides
    assert divergence.first_divergence("x", ar, {"token_ids": [1, 2, 5]}, 0.01).kind == "near-tie"
    assert near_tie_limit(None) == near_tie_limit("torch.float32") == 0.01


def test_the_report_counts_and_lists_divergences(tmp_path):
    """ar, a vanilla run with one near-tie and one suspect row, a lossy run (not compared) and a sampled group."""
    base = [{"new": 4, "s": 1.0, "id": f"q{i}"} for i in range(3)]
    ar = row([1, 2, 3, 4], [2.0, 1.5, 0.004, 3.0])
    add_fields(write_run(tmp_path, "ar", "ar", base), rows=[ar, ar, ar])
    add_fields(write_run(tmp_path, "vanilla", "vanilla", base, gamma=3),
               rows=[ar, row([1, 2, 9, 9], [2.0, 1.5, 0.01, 1.0]), row([1, 7, 3, 4], [2.0, 1.5, 0.004, 3.0])])
    add_fields(write_run(tmp_path, "adasd", "adasd", base), rows=[row([9, 9, 9, 9], [1.0] * 4)] * 3)
    rep = report.build_report(load.load_runs(tmp_path))
    ov = next(t for t in rep.tables if t.name == "overview").cells.droplevel(0)
    assert ov.loc["vanilla", ("", "diverged from ar")] == "2 of 3: 1 near-tie, 1 suspect"
    assert ov.loc["ar", ("", "diverged from ar")] == "" and ov.loc["adasd", ("", "diverged from ar")] == ""
    t = next(t for t in rep.tables if t.name == "divergences")
    got = {k[1]: list(v) for k, v in t.cells.iterrows()}
    assert got == {"vanilla · q1": ["2", "3", "9", "0.0040", "0.0100", "near-tie"],
                   "vanilla · q2": ["1", "2", "7", "1.5000", "1.5000", "suspect"]}
    assert "| vanilla · q1 | 2 | 3 | 9 | 0.0040 | 0.0100 | near-tie |" in t.markdown()
    # nothing diverged: no table
    (tmp_path / "vanilla" / "rows.jsonl").write_text("".join(
        json.dumps({**json.loads(line), **ar}) + "\n" for line in (tmp_path / "vanilla" / "rows.jsonl").open()))
    rep = report.build_report(load.load_runs(tmp_path))
    assert "divergences" not in [t.name for t in rep.tables]
    ov = next(t for t in rep.tables if t.name == "overview").cells.droplevel(0)
    assert ov.loc["vanilla", ("", "diverged from ar")] == "0 of 3"


def test_a_tie_with_the_top1_is_not_off_top1():
    """bfloat16 logits tie often: a committed token whose logit equals the column's maximum is a top-1, whichever index
    argmax or topk reports; one below it is off."""
    from specbench.decoding.margins import block_margins, top2

    logits = torch.tensor([[[1.0, 3.0, 3.0, 0.5], [2.0, 0.0, 1.0, 1.5]]])  # [B=1, keep=2, V=4]: column 0 ties 1 and 2
    tops = top2(logits, 4).tolist()
    assert [[a - b for a, b, _ in row] for row in tops] == [[0.0, 0.5]] and [t[0] for t in tops[0]] == [3.0, 2.0]
    for token in (1, 2):  # either of the tie, whichever index topk reports
        assert block_margins(tops, logits, [[0, 1]], [[token, 0]]) == [([0.0, 0.5], [])]
    assert block_margins(tops, logits, [[0, 1]], [[0, 3]]) == [([0.0, 0.5], [0, 1])]
    assert block_margins(tops, logits, [[1]], [[3]]) == [([0.5], [0])]  # the block's own columns
    two = torch.cat([logits, logits.flip(-1)])  # B = 2: row 1's column 1 is [1.5, 1.0, 0.0, 2.0]
    assert block_margins(top2(two, 4).tolist(), two, [[0], [1, 0]], [[2], [1, 0]]) == [([0.0], []), ([0.5, 0.0], [0, 1])]
    # a recorded zero margin at the first divergence is a tie also in rows that listed it as off (older rows)
    ar = row([1, 2, 3], [1.0, 0.0, 1.0])
    assert divergence.first_divergence("x", ar, row([1, 5, 3], [1.0, 0.0, 1.0], [1]), 0.01).kind == "near-tie"


def test_the_host_tops_index_is_the_first_argmax_at_ties():
    """host_tops' index is torch.argmax's (the first top-1, as a greedy decoder picks) also where the top two tie and
    topk reports another tied index; its values are the top two (bfloat16-like rounded logits tie often)."""
    from specbench.decoding.margins import host_tops, top2

    g = torch.Generator().manual_seed(0)
    logits = torch.randn((3, 6, 1000), generator=g).mul(2).round().to(torch.bfloat16)  # [B, keep, V_model]
    logits[0, 0, [5, 700]] = 20.0  # a tie topk reports in either order
    host = host_tops(top2(logits, 990), logits, 990)  # the model's padded entries 990.. are never a token
    z = logits[..., :990].float()
    assert [[int(t[2]) for t in row] for row in host] == z.argmax(-1).tolist()
    assert [[t[:2] for t in row] for row in host] == z.topk(2, dim=-1).values.tolist()
    assert host[0][0][2] == 5 and sum(t[0] == t[1] for row in host for t in row) >= 6  # ties were there to fix


def test_bench_classifies_where_two_greedy_generations_part(tiny_pair):
    """`bench engine` / `bench gpu` name each token difference from transformers a near-tie or suspect by the target's
    top-2 margin where the two part, from a cache-free forward of the prompt and the common prefix, checked here
    against a greedy decode without cache: at position 3, the target's runner-up token in place of its argmax is a
    near-tie under a limit above the margin and suspect under one below it; a token outside its top two is suspect."""
    from specbench.bench.common import divergence_class

    target, prompt = tiny_pair.target, [1, 5, 2]
    ours = []
    with torch.no_grad():
        for _ in range(6):  # greedy, every step a full forward
            z = target(input_ids=torch.tensor([prompt + ours])).logits[0, -1].float()
            if len(ours) == 3:
                top = z.topk(3)
                margin, second, third = float(top.values[0] - top.values[1]), int(top.indices[1]), int(top.indices[2])
            ours.append(int(z.argmax()))
    theirs = ours[:3] + [second] + ours[4:]
    assert divergence_class(target, prompt, ours, theirs, limit=margin + 1e-3).startswith(
        f"near-tie: the target's top-2 margin there {margin:.4f}")
    assert divergence_class(target, prompt, ours, theirs, limit=margin - 1e-3).startswith("suspect: ")
    assert divergence_class(target, prompt, ours, ours[:3] + [third], limit=1e9).startswith("suspect: ")
    assert divergence_class(target, prompt, ours, ours[:4]) == "suspect: the same tokens, another length"
