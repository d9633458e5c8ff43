"""Tree drafting end to end: the trees spec_tree and dyn_tree propose against a brute-force rebuild from cache-free
draft forwards (which also checks the draft cache's compaction after every verify), their traces, and the refusals
in batches and on the compiled path."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from helpers import compose_cfg, pair_engine, small
from specbench.common.options import OptionError
from specbench.data.dataset import build_dataset
from specbench.data.prompting import encode
from specbench.decoding.proposal import Proposal, ancestors, chain
from specbench.models.pairs import load_pair
from specbench.runs.runner import build_method, run
from specbench.runs.traces import read_traces

MAX_NEW = 40


@pytest.fixture(scope="module")
def toy():
    """The toy pair (float32) and three toy_arith prompts."""
    cfg = compose_cfg("pair=toy", "pair.dtype=float32", "dataset=toy_arith")
    pair = load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device("cpu"))
    examples = build_dataset(OmegaConf.to_container(cfg.dataset, resolve=True)).examples()[:3]
    return pair, [encode(pair.tokenizer, ex) for ex in examples]


def draft_q(pair, ids: list[int]) -> torch.Tensor:
    """q(. | ids) [V] of the draft from one forward without a cache (softmax at T = 1, the tokenizer's range)."""
    with torch.no_grad():
        logits = pair.draft(torch.tensor([ids])).logits[0, -1, : pair.vocab_size].float()
    return torch.softmax(logits, -1)


def top(q: torch.Tensor, k: int) -> list[int]:
    """The k most likely ids of q, best first."""
    return [int(i) for i in torch.topk(q, k).indices]


def eagle2_tree(pair, prefix: list[int], depth: int, top_k: int, total: int, eos: set[int]
                ) -> set[tuple[int, ...]]:
    """EAGLE-2's tree after prefix, rebuilt by brute force: the token paths of the `total` best nodes by cumulative
    draft log-probability, growing the top_k best nodes of each depth (an EOS node has no children) into their
    top_k children."""
    q0 = draft_q(pair, prefix)
    level = [((x,), math.log(float(q0[x]))) for x in top(q0, top_k)]
    nodes = list(level)
    for _ in range(depth - 1):
        grow = sorted([n for n in level if n[0][-1] not in eos], key=lambda n: -n[1])[:top_k]
        level = []
        for path, score in grow:
            q = draft_q(pair, prefix + list(path))
            level += [(path + (x,), score + math.log(float(q[x]))) for x in top(q, top_k)]
        nodes += level
    return {path for path, _ in sorted(nodes, key=lambda n: -n[1])[:total]}


def static_tree(pair, prefix: list[int], paths: list[list[int]], eos: set[int]) -> set[tuple[int, ...]]:
    """The token paths of a static tree of rank paths after prefix (nothing below an EOS), by brute force."""
    out: dict[tuple[int, ...], tuple[int, ...]] = {(): ()}
    for ranks in sorted(paths, key=len):
        parent = out.get(tuple(ranks[:-1]))
        if parent is None or (parent and parent[-1] in eos):
            continue
        out[tuple(ranks)] = parent + (top(draft_q(pair, prefix + list(parent)), ranks[-1] + 1)[ranks[-1]],)
    return set(out.values()) - {()}


def token_paths(tokens: list[int], parents: list[int]) -> set[tuple[int, ...]]:
    """Each node's root path as tokens."""
    return {tuple(tokens[a] for a in anc) for anc in ancestors(parents)}


@pytest.mark.parametrize("cfg", [{"name": "dyn_tree", "depth": 4, "top_k": 3, "total_nodes": 10},
                                 {"name": "spec_tree", "paths": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}],
                         ids=["dyn_tree", "spec_tree"])
def test_every_iterations_tree_is_the_brute_force_tree(toy, cfg):
    """Greedy decoding with trace: the output is ar's, and at every iteration the proposed tree (tokens and parents)
    is the tree rebuilt from cache-free draft forwards after the committed prefix: the draft cache kept exactly the
    accepted path after every verify, and the target's cache likewise (else the output would leave ar's)."""
    pair, prompts = toy
    eos = pair.eos_ids([pair.target, pair.draft])
    ar = pair_engine(pair, {"name": "ar"}, eos_ids=eos)
    engine = pair_engine(pair, cfg, eos_ids=eos)
    branched = 0
    for prompt in prompts:
        gen = engine.generate(prompt, MAX_NEW, trace=True)
        assert gen.token_ids == ar.generate(prompt, MAX_NEW).token_ids
        committed = 0
        for rec in gen.records:
            prefix = prompt + gen.token_ids[:committed]
            left = MAX_NEW - committed - 1
            if rec.tree is None:  # nothing could be drafted (the length cap)
                assert rec.drafted == 0 and left <= 0
            else:
                tree = rec.tree
                if cfg["name"] == "dyn_tree":
                    want = eagle2_tree(pair, prefix, cfg["depth"], cfg["top_k"], min(cfg["total_nodes"], left), eos)
                else:
                    want = static_tree(pair, prefix, cfg["paths"][: left], eos)
                assert token_paths(tree["tokens"], tree["parents"]) == want
                path = tree["path"]
                assert [tree["parents"][j] for j in path] == ([-1] + path[:-1] if path else [])  # a root path
                assert [tree["tokens"][j] for j in path] == gen.token_ids[committed : committed + len(path)]
                assert rec.accepted == len(path) and rec.drafted == len(tree["tokens"])
                branched += len(set(tree["parents"])) < len(tree["parents"])
            committed += rec.accepted + 1
    assert branched  # trees with siblings were verified


def test_a_trees_trace_records_its_nodes_and_path(tmp_path):
    """trace=true writes each iteration's depth and tree (tokens, parents, accepted path) beside the chain columns;
    the summary has nodes_per_call and the acceptance at each depth."""
    summary = run(small("method=dyn_tree", "method.total_nodes=6", "decode.max_new_tokens=12", "limit=2",
                        "trace=true"), tmp_path)
    traces = read_traces(tmp_path)
    trees = traces["tree"].dropna()
    assert len(trees) and all(len(t["tokens"]) == len(t["parents"]) == d for t, d in
                              zip(trees, traces.loc[trees.index, "drafted"]))
    assert (traces.loc[trees.index, "depth"] >= 1).all()
    from specbench.runs.results import ROWS, read_rows

    rows = read_rows(tmp_path / ROWS)
    assert summary["nodes_per_call"] == pytest.approx(sum(r["drafted"] for r in rows)
                                                      / sum(r["target_calls"] for r in rows))
    assert summary["nodes_per_call"] == pytest.approx(traces["drafted"].sum() / len(traces))  # one call per iteration
    assert summary["acceptance_by_depth"] and all(0 <= a <= 1 for a in summary["acceptance_by_depth"])


@pytest.mark.parametrize("name", ["dyn_tree"])
def test_trees_run_in_a_batch_and_on_the_compiled_path(tmp_path, name):
    """A run at batch_size=3 writes each row's batch_size=1 tokens (tests/test_batch.py checks the engine against
    ar), and so does a compiled run (tests/test_compiled.py: tokens and schedules); the compiled path takes one row."""
    from specbench.runs.results import read_rows

    run(small(f"method={name}", "limit=5"), tmp_path / "b1")
    run(small(f"method={name}", "batch_size=3", "limit=5"), tmp_path / "b3")
    one, three = read_rows(tmp_path / "b1" / "rows.jsonl"), read_rows(tmp_path / "b3" / "rows.jsonl")
    assert [r["token_ids"] for r in three] == [r["token_ids"] for r in one]
    assert [r["batch_size"] for r in three] == [3, 3, 3, 2, 2]
    run(small(f"method={name}", "engine.compile=true", "limit=5"), tmp_path / "c")
    assert [r["token_ids"] for r in read_rows(tmp_path / "c" / "rows.jsonl")] == [r["token_ids"] for r in one]
    with pytest.raises(OptionError, match="engine.compile=true decodes one example at a time"):
        run(small(f"method={name}", "engine.compile=true", "batch_size=2", "limit=2"), tmp_path / "c2")


@pytest.mark.parametrize("options, match", [
    ({"paths": [[0], [1, 1]]}, r"method.paths: \[1, 1\] is listed but its parent path \[1\]"),
    ({"paths": [[0], [0, 0], [0, 0]]}, "lists a path twice"),
    ({"paths": [[0], [0, 0], [1, 0]]}, r"its parent path \[1\] is not"),
    ({"paths": [[0], [-1]]}, "sibling ranks >= 0"),
    ({"paths": []}, "non-empty list of root paths"),
    ({"branching": [], "paths": None}, "method.branching"),
    ({"branching": [2, 0]}, "method.branching"),
    ({"drafter_kind": "eagle"}, "method.drafter_kind must be one of distilled, sd2"),
    ({"parts": {"rule": "js_relaxed(rejection)"}}, "method.parts.rule must be one of greedy, rejection, sample_match"),
    ({"branching": [10, 10, 10]}, r"1110 nodes per tree; at most 1024"),
    ({"name": "dyn_tree", "total_nodes": 2000}, r"method.total_nodes must be an integer in \[1, 1024\]"),
    ({"name": "dyn_tree", "top_k": 0}, "method.top_k"),
    ({"name": "dyn_tree", "top_k": 10000}, r"method.top_k must be an integer in \[1, 32\]"),
    ({"name": "dyn_tree", "depth": 1000}, r"method.depth must be an integer in \[1, 64\]"),
])
def test_a_bad_tree_shape_names_its_key(options, match):
    with pytest.raises(OptionError, match=match):
        build_method({"name": "spec_tree", **options})


def test_a_proposal_knows_its_shape():
    """A chain is the tree with one child per node; depths and children follow the parents."""
    c = chain([5, 6, 7])
    assert c.is_chain and c.parents == [-1, 0, 1] and c.depths() == [1, 2, 3]
    t = Proposal([5, 6, 7, 8], [-1, -1, 0, 2])
    assert not t.is_chain and t.depths() == [1, 1, 2, 3] and t.children() == [[0, 1], [2], [], [3], []]
    assert t.q_rows(10)[3].tolist() == [0.0] * 8 + [1.0, 0.0]  # deterministic: one-hot q


# --- sampling: the first two tokens of a tree method follow the target's exact joint (table LMs, T = 1) ---

TREES = {"spec_tree": {"name": "spec_tree", "paths": [[0], [1], [2], [0, 0], [0, 1], [1, 0]]},
         "dyn_tree": {"name": "dyn_tree", "depth": 2, "top_k": 3, "total_nodes": 5}}


N_TREE = 6000  # decodes per tree test: the wrong variant below is rejected (p < 1e-6) at 4000 of the same trees


@pytest.mark.parametrize("name", list(TREES))
def test_a_tree_methods_sampled_tokens_follow_the_target(name):
    """N_TREE decodes of 3 tokens at T = 1: the first iteration verifies a tree whose root has 3 children, so the
    first two tokens go through recursive rejection over siblings, descent, correction and bonus; chi-square against
    p(t1) p(t2 | t1) computed from the table target directly."""
    from helpers import chi2_pvalue, joint_counts, table_engine, target_joint
    from table_lm import TableLM

    target, draft = TableLM(8, 11), TableLM(8, 12)
    engine = table_engine(build_method(TREES[name]), target, draft, 1.0, 64)
    counts = joint_counts(engine, N_TREE)
    assert counts.sum() == N_TREE
    assert chi2_pvalue(counts, target_joint(target)) > 1e-3


def test_top_k_children_verified_as_if_drawn_fail_the_same_test():
    """The wrong variant: the same trees, but the rule told the children were drawn from q (SpecInfer's rule, which
    needs independent draws) although they are q's top ranks: the chi-square test rejects it."""
    from helpers import chi2_pvalue, joint_counts, table_engine, target_joint
    from table_lm import TableLM
    from specbench.decoding import tree_drafts
    from specbench.decoding.proposal import SAMPLED

    class DrawnClaim(tree_drafts.TreeDraft):
        def propose(self, buf, d):
            return [Proposal(p.tokens, p.parents, p.q, p.why, SAMPLED, p.steps) for p in super().propose(buf, d)]

    method = build_method(TREES["spec_tree"])
    method.drafter.source = lambda states, binding, shape, fixed: DrawnClaim(states["draft"], shape.grower())
    target, draft = TableLM(8, 11), TableLM(8, 12)
    counts = joint_counts(table_engine(method, target, draft, 1.0, 64), 4000)
    assert chi2_pvalue(counts, target_joint(target)) < 1e-6


@pytest.mark.parametrize("kind", ["distilled", "sd2"])
def test_a_tree_with_a_trained_drafter_decodes_ars_tokens(tmp_path, trained_drafter, kind):
    """dyn_tree with a task=distill drafter (sd2: steered by the verifier's states at the accepted path's last node,
    taken from the tree verify itself) decodes, greedily, the tokens of ar on the same pair."""
    from helpers import SAME_VOCAB

    folder = trained_drafter(kind, *SAME_VOCAB)
    common = (*SAME_VOCAB, "decode.max_new_tokens=24", "limit=4")
    run(small(*common, "method=ar"), tmp_path / "ar")
    run(small(*common, "method=dyn_tree", f"method.drafter={folder}", f"method.drafter_kind={kind}", "trace=true"),
        tmp_path / "tree")
    from specbench.runs.results import ROWS, read_rows

    ar_rows, tree_rows = read_rows(tmp_path / "ar" / ROWS), read_rows(tmp_path / "tree" / ROWS)
    assert [r["token_ids"] for r in tree_rows] == [r["token_ids"] for r in ar_rows]
    assert max(read_traces(tmp_path / "tree")["depth"].dropna()) > 1  # trees, not chains
