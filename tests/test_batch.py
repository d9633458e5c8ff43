"""Batched decoding against independent truth: each row of a batch as decoded alone and as `ar` at B = 1.

Greedy: every lossless method at B in {2, 5, 8} gives each row exactly ar's B = 1 tokens, on tiny_random and
on the toy pair in float32, with prompts of very different lengths in one batch; lossy methods give their own
B = 1 tokens; adaptive methods trace the same schedule per row (γ, drafted, accepted, stop exactly; AdaSD and
confidence thresholds to float32 rounding, since a batched forward sums in another order). Sampling: the
first two tokens of every row of a B = 4 batch (four prompts of different lengths) follow that row's exact
target joint (chi-square), for `rejection` and `sample_match`, and a wrong rule fails the same test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from helpers import TEST_DEVICE, V, AcceptAll, FixedGamma, chi2_pvalue, compose_cfg, pair_engine, table_engine, target_joint
from specbench.data.dataset import build_dataset
from specbench.data.prompting import encode
from specbench.decoding.acceptance import RULES
from specbench.models.pairs import load_pair
from specbench.runs.runner import build_method
from table_lm import TableLM

MAX_NEW = 40
LOSSLESS = ["ar", "vanilla", "heuristic", "confidence", "gammatune", "gammatune_plus", "adasd_gen_only", "pld",
            "layer_skip", "spec_tree", "dyn_tree"]
LOSSY = ["draft_only", "adasd"]
THRESHOLDS = ("t_g", "t_v", "threshold")  # float thresholds: equal to float32 rounding


def pair_and_prompts(name: str, dataset: str) -> tuple:
    """The pair (float32, CPU) and 8 prompts of very different lengths (one made twice as long)."""
    cfg = compose_cfg(f"pair={name}", f"dataset={dataset}")
    pair = load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device(TEST_DEVICE))
    examples = build_dataset(OmegaConf.to_container(cfg.dataset, resolve=True)).examples()[:8]
    prompts = [encode(pair.tokenizer, ex) for ex in examples]
    prompts[1] = prompts[1] + prompts[2] + prompts[3]  # several times the shortest prompt
    prompts[4] = prompts[4][-3:]
    return pair, prompts


@pytest.fixture(scope="module", params=[("tiny_random", "smoke"), ("toy", "toy_arith")], ids=["tiny_random", "toy"])
def setup(request):
    torch.set_num_threads(1)
    pair, prompts = pair_and_prompts(*request.param)
    eos = pair.eos_ids([pair.target, pair.draft])
    ar = [pair_engine(pair, {"name": "ar"}, eos_ids=eos).generate(p, MAX_NEW).token_ids for p in prompts]
    return pair, prompts, eos, ar


def batched(engine, prompts: list[list[int]], B: int, max_new: int = MAX_NEW) -> list:
    """Generations of the prompts decoded B at a time."""
    return [g for i in range(0, len(prompts), B) for g in engine.generate_batch(prompts[i : i + B], max_new)]


def schedule(gen) -> list[tuple]:
    """The per-iteration schedule: drafted, accepted, stop, and the integer policy state (γ)."""
    return [(r.drafted, r.accepted, r.stop, {k: v for k, v in r.state.items() if k not in THRESHOLDS})
            for r in gen.records]


@pytest.mark.parametrize("name", LOSSLESS + LOSSY)
def test_every_row_gets_its_batch_size_1_tokens(setup, name):
    pair, prompts, eos, ar = setup
    engine = pair_engine(pair, {"name": name}, eos_ids=eos)
    alone = [engine.generate(p, MAX_NEW) for p in prompts]
    assert len({len(p) for p in prompts}) > 4 and max(map(len, prompts)) > 3 * min(map(len, prompts))
    for B in (2, 5, 8):
        gens = batched(engine, prompts, B)
        for i, (g, a) in enumerate(zip(gens, alone)):
            if name in LOSSLESS:
                assert g.token_ids == ar[i], f"{name} B={B} row {i}: tokens differ from ar at B=1"
            assert g.token_ids == a.token_ids and g.stop_reason == a.stop_reason, f"{name} B={B} row {i}"
            assert schedule(g) == schedule(a), f"{name} B={B} row {i}: schedule differs from B=1"
            for rb, ra in zip(g.records, a.records):
                for k in THRESHOLDS:
                    if k in ra.state:
                        assert rb.state[k] == pytest.approx(ra.state[k], rel=1e-5, abs=1e-6), (name, B, i, k)
            assert g.batch_rows == min(B, len(prompts) - B * (i // B))
            assert g.target_calls == a.target_calls  # one target call per iteration, with or without others
            if engine.method.plan.kind != "none":  # draft_only's calls are the draft's verify calls
                assert sum(r.draft_steps for r in g.records) == g.draft_calls >= a.draft_calls
    if name not in ("ar", "draft_only"):
        assert any(r.accepted < r.drafted for g in alone for r in g.records)  # rejections did happen


def test_time_shares_sum_to_the_batch_wall_time(setup):
    pair, prompts, eos, _ = setup
    gens = pair_engine(pair, {"name": "vanilla"}, eos_ids=eos).generate_batch(prompts, MAX_NEW)
    latest = max(g.latency_s for g in gens)
    assert sum(g.decode_s for g in gens) == pytest.approx(latest, rel=1e-6)
    assert all(0 < g.decode_s <= g.latency_s <= latest for g in gens)
    assert sum(g.target_model_s + g.draft_model_s for g in gens) <= latest
    # a row that finished early left the batch: it took part in fewer calls than the longest row
    assert min(g.target_calls for g in gens) < max(g.target_calls for g in gens)


def test_a_finished_row_costs_no_more_forwards(setup):
    """Rows leave the batch when they stop: the rows the models ran, summed over their forwards, equal the calls
    the rows took part in (a batch that kept finished rows would run B rows in every forward)."""
    pair, prompts, eos, _ = setup
    engine = pair_engine(pair, {"name": "vanilla"}, eos_ids=eos)
    ran = {"target": 0, "draft": 0}
    hooks = [m.register_forward_pre_hook(lambda mod, args, kw, r=role: ran.__setitem__(r, ran[r] + kw["input_ids"].shape[0]),
                                         with_kwargs=True) for role, m in (("target", pair.target), ("draft", pair.draft))]
    try:
        gens = engine.generate_batch(prompts, MAX_NEW)
    finally:
        for h in hooks:
            h.remove()
    assert ran["target"] == sum(g.target_calls for g in gens) < len(prompts) * max(g.target_calls for g in gens)
    assert ran["draft"] == sum(g.draft_calls for g in gens)


def test_sd2_rows_are_steered_apart(tiny_pair, trained_drafter):
    """sd2 with a random steering map: each row is steered by its own verifier states (tokens and schedule as
    at B = 1, which a steering shared across rows would change)."""
    from safetensors.torch import load_file, save_file

    import shutil

    folder = trained_drafter("sd2")
    st = load_file(folder / "steering.safetensors")
    copies = {}
    for name, scale in (("random", 0.005), ("zero", 0.0)):
        copies[name] = folder.parent / f"sd2_{name}"
        shutil.copytree(folder, copies[name], dirs_exist_ok=True)
        w = torch.randn(st["w_s.weight"].shape, generator=torch.Generator().manual_seed(0)) * scale
        save_file({**st, "w_s.weight": w}, copies[name] / "steering.safetensors")
    _, prompts = pair_and_prompts("tiny_random", "smoke")
    engine = pair_engine(tiny_pair, build_method({"name": "sd2", "drafter": str(copies["random"])}))
    alone = [engine.generate(p, MAX_NEW) for p in prompts]
    plain = pair_engine(tiny_pair, build_method({"name": "sd2", "drafter": str(copies["zero"])}))
    unsteered = [plain.generate(p, MAX_NEW) for p in prompts]
    assert [schedule(g) for g in alone] != [schedule(g) for g in unsteered]  # the steering matters
    for B in (3, 8):
        for g, a in zip(batched(engine, prompts, B), alone):
            assert g.token_ids == a.token_ids and schedule(g) == schedule(a)


# --- sampling: each row of a B = 4 batch follows its own exact target distribution ---

PROMPTS4 = [[1, 5, 2], [3], [4, 4, 6, 1, 7, 0, 2], [2, 6]]
N4 = 4_000  # batches: samples per row


def row_pvalues(method, seed: int = 100) -> list[float]:
    """Chi-square p-value of each row's first two tokens over N4 batches of the four prompts (row b's generator
    seeded seed + b: under the null a row's p-value falls below 1e-3 at one seed in a thousand)."""
    target, draft = TableLM(V, 11), TableLM(V, 12)
    engine = table_engine(method, target, draft, 1.0, 64)
    gens = [torch.Generator().manual_seed(seed + b) for b in range(len(PROMPTS4))]
    counts = np.zeros((len(PROMPTS4), V, V))
    for _ in range(N4):
        for b, g in enumerate(engine.generate_batch(PROMPTS4, 3, gens)):
            counts[b, g.token_ids[0], g.token_ids[1]] += 1
    return [chi2_pvalue(counts[b], target_joint(target, p)) for b, p in enumerate(PROMPTS4)]


@pytest.mark.parametrize("name", ["rejection", "sample_match"])
def test_batched_sampling_follows_each_rows_target(name):
    assert min(row_pvalues(FixedGamma(RULES.get(name)()))) > 1e-3


def test_a_wrong_rule_fails_the_batched_test():
    assert max(row_pvalues(FixedGamma(AcceptAll()))) < 1e-6


# the root has 3 children: recursive rejection over siblings, descent, correction and bonus in each row's first tokens
TREES = {"spec_tree": {"name": "spec_tree", "paths": [[0], [1], [2], [0, 0], [0, 1], [1, 0]]},
         "dyn_tree": {"name": "dyn_tree", "depth": 2, "top_k": 3, "total_nodes": 5}}


@pytest.mark.parametrize("name", list(TREES))
def test_batched_trees_follow_each_rows_target(name):
    """B = 4 rows of different lengths verify their trees in one forward (tree masks per row): each row's first two
    tokens follow its exact target joint (tests/test_trees.py shows the test fails trees told they were drawn)."""
    assert min(row_pvalues(build_method(TREES[name]), 300)) > 1e-3


def test_distilled_rows_equal_ar(tiny_pair, trained_drafter):
    """`distilled` (vanilla γ = 8 with a trained drafter) at B in {3, 8}: each row is ar's B = 1 output."""
    _, prompts = pair_and_prompts("tiny_random", "smoke")
    engine = pair_engine(tiny_pair, build_method({"name": "distilled", "drafter": str(trained_drafter("distilled"))}))
    ar = pair_engine(tiny_pair, {"name": "ar"})
    truth = [ar.generate(p, MAX_NEW).token_ids for p in prompts]
    for B in (3, 8):
        assert [g.token_ids for g in batched(engine, prompts, B)] == truth


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU lane)")
@pytest.mark.parametrize("name", ["ar", "vanilla", "gammatune", "adasd_gen_only", "confidence"])
def test_cuda_rows_equal_ar_in_float32(name):
    """On CUDA, float32: each row of a batch (B in {4, 8}) gets ar's B = 1 tokens on the toy pair."""
    cfg = compose_cfg("pair=toy", "pair.dtype=float32", "dataset=toy_arith")
    pair = load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device("cuda"))
    examples = build_dataset(OmegaConf.to_container(cfg.dataset, resolve=True)).examples()[:16]
    prompts = [encode(pair.tokenizer, ex) for ex in examples]
    prompts[1] = prompts[1] + prompts[2] + prompts[3]
    eos = pair.eos_ids([pair.target, pair.draft])
    truth = [pair_engine(pair, {"name": "ar"}, eos_ids=eos).generate(p, 96).token_ids for p in prompts]
    engine = pair_engine(pair, {"name": name}, eos_ids=eos)
    for B in (4, 8):
        got = [g for i in range(0, len(prompts), B) for g in engine.generate_batch(prompts[i : i + B], 96)]
        assert [g.token_ids for g in got] == truth, f"{name} B={B}"


def test_a_suffix_row_keeps_its_own_trees_when_others_leave(setup):
    """suffix without the run's tree: each row drafts from its own suffix tree, so a B = 4 row's schedule is its
    B = 1 schedule even after rows before it in the batch have finished and left (which shifts the batch positions;
    a drafter that keyed trees by position drafted the next row from the finished row's tree)."""
    pair, prompts, eos, ar = setup
    engine = pair_engine(pair, {"name": "suffix", "global_cache": False}, eos_ids=eos)
    alone = [engine.generate(p, MAX_NEW) for p in prompts]
    gens = batched(engine, prompts, 4)
    assert len({g.latency_s for g in gens[:4]}) > 1  # rows left the batch at different iterations
    for i, (g, a) in enumerate(zip(gens, alone)):
        assert g.token_ids == a.token_ids == ar[i], f"row {i}"
        assert schedule(g) == schedule(a), f"row {i}: {len(g.records)} iterations at B = 4, {len(a.records)} at B = 1"
    assert any(r.accepted for g in alone for r in g.records)  # drafts were accepted


def test_tree_and_head_rows_at_batch_size_64_are_their_ar_tokens():
    """Sixty-four toy_arith prompts in one batch (and two of 32): every row of spec_tree, dyn_tree, eagle3_tree (a
    random head) and medusa (head 1 the target's own output layer, so drafts are accepted) is ar's B = 1 decode."""
    from specbench.decoding.compose import compose
    from specbench.methods.dyn_tree import DynamicTree
    from specbench.methods.eagle3 import Eagle3
    from specbench.methods.medusa import Medusa
    from specbench.methods.spec_tree import StaticTree
    from specbench.methods.vanilla import Vanilla
    from test_heads import random_eagle3, random_medusa

    cfg = compose_cfg("pair=toy", "pair.dtype=float32", "dataset=toy_arith")
    pair = load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device(TEST_DEVICE))
    prompts = [encode(pair.tokenizer, ex) for ex in build_dataset(OmegaConf.to_container(cfg.dataset, resolve=True)
                                                                  ).examples()[:64]]
    eos = pair.eos_ids([pair.target, pair.draft])
    ar = [pair_engine(pair, {"name": "ar"}, eos_ids=eos).generate(p, 48).token_ids for p in prompts]
    medusa = random_medusa(pair.target)
    with torch.no_grad():
        medusa[0][0].linear.weight.zero_()
        medusa[0][0].linear.bias.zero_()
        medusa[0][-1].weight.copy_(pair.target.get_output_embeddings().weight)
    head = random_eagle3(pair.target, draft_vocab=pair.vocab_size // 2)
    methods = {"spec_tree": {"name": "spec_tree"}, "dyn_tree": {"name": "dyn_tree"},
               "eagle3_tree": compose(Vanilla(), Eagle3(head=head), DynamicTree(), "rejection"),
               "medusa": compose(Vanilla(), Medusa(head=medusa), StaticTree(paths=[[0], [1], [0, 0], [1, 0]]))}
    for name, method in methods.items():
        engine = pair_engine(pair, method, eos_ids=eos)
        for B in (32, 64):
            gens = batched(engine, prompts, B, 48)
            assert [g.token_ids for g in gens] == ar, f"{name} B={B}"
            assert sum(r.accepted for g in gens for r in g.records) > 0, name
