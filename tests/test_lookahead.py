"""Lookahead decoding (methods/lookahead.py) against a brute-force reference: LADE's loop (lade 0.0.2,
decoding.py's greedy jacobi_greedy_search_multilevel with ALWAYS_FWD_ONE; its window bookkeeping ported line by line
below) with every forward cache-free over the whole sequence and LADE's attention mask built from its block rules
(models/llama.py j_make_causal_mask_multilevel), not from tree parents. `lade` itself needs transformers 4.x (its
model patch), so it does not run here. Greedy equality with ar, the sampling chi-square, windows and traces are the
method contracts' (tests/test_method_contracts.py: lookahead)."""

from __future__ import annotations

import random

import pytest
import torch

from helpers import pair_engine
from specbench.common.options import OptionError
from specbench.decoding.compose import compose
from specbench.decoding.parts import OwnTree
from specbench.methods.lookahead import Lookahead, Window, trie
from specbench.methods.vanilla import Vanilla
from specbench.runs.runner import build_method

PROMPT = "one two three one two three one two three one two"


def lade_step(past: list, fill: int, c: int, top: list[int], pool: dict, G: int, N: int) -> int:
    """LADE's update after a forward (decoding.py, the branch on past_tokens[1] / past_tokens[LEVEL - 2], ALWAYS_FWD_ONE,
    GUESS_SET_SIZE != -1); returns the new fill level."""
    LEVEL = N
    if past[1] is None:
        past[0] = past[0][1:]
        past[1] = list(top)
        return fill + 1
    if past[LEVEL - 2] is None:
        for level in range(fill + 1):
            past[level] = past[level][1:]
        past[fill + 1] = list(top)[1:]
        return fill + 1
    W = len(top)
    for i in range(W):
        key = c if i == 0 else past[0][i - 1]
        tup = tuple(past[ll][i] for ll in range(1, LEVEL - 1)) + (top[i],)
        grams = pool.setdefault(key, [])
        if tup in grams:
            grams.remove(tup)
            grams.append(tup)
        elif len(grams) < G:
            grams.append(tup)
        else:
            pool[key] = grams[1:] + [tup]
    past[0] = past[1][1:]
    for level in range(1, LEVEL - 2):
        past[level] = past[level + 1][:]
    past[LEVEL - 2] = list(top)
    return fill


def lade_inputs(past: list, fill: int, guesses: list[list[int]], L: int):
    """The window's and the guesses' tokens, positions and attention over them (LADE's mask: block 0 = the root and
    level 0, causal; level ll's column k sees block 0's columns <= k and column k of levels 1..ll; a guess is causal
    and sees the root) as sets of the nodes each node sees; positions L - 1 + offset."""
    toks, pos, sees, where = [], [], [], {}
    for ll in range(fill + 1):
        for k, x in enumerate(past[ll]):
            col = k + 1 if ll == 0 else k  # block 0's column of level 0's token k is k + 1 (column 0 is the root)
            where[(ll, col)] = len(toks)
            toks.append(x)
            pos.append(L - 1 + (k + 1 if ll == 0 else ll + k))
            if ll == 0:
                sees.append({where[(0, j)] for j in range(1, col + 1)})
            else:
                sees.append({where[(0, j)] for j in range(1, col + 1)} | {where[(m, col)] for m in range(1, ll + 1)})
    for g in guesses:
        start = len(toks)
        for t, x in enumerate(g):
            toks.append(x)
            pos.append(L + t)
            sees.append(set(range(start, start + t + 1)))
    return toks, pos, sees


def reference(model, prompt: list[int], max_new: int, W: int, N: int, G: int, seed: int) -> tuple[list[int], list[int], dict]:
    """(new tokens, accepted drafts per iteration, the pool) of LADE's loop, cache-free, every matching token of the
    best guess and the bonus accepted; the window skips an iteration whose deepest node passes the tokens left."""
    rng = random.Random(seed)
    tokens = list(prompt)
    past = [[rng.choice(prompt) for _ in range(W + N - 3)]] + [None] * (N - 2)
    fill, pool, accepted = 0, {}, []
    while len(tokens) - len(prompt) < max_new:
        L, c = len(tokens), tokens[-1]
        cap = max_new - (L - len(prompt)) - 1
        grams = pool.get(c, []) if past[N - 2] is not None else []
        t_tokens, t_parents = trie(grams, cap, frozenset())
        paths = {}
        for j, a in enumerate(t_parents):
            paths[j] = (paths[a] if a >= 0 else []) + [t_tokens[j]]
        guesses = [paths[j] for j in range(len(t_tokens))]  # every trie node's root path: a guess of its own
        levels = [lv for lv in past if lv is not None]
        deepest = max([len(levels[0])] + [len(lv) - 1 + m for m, lv in enumerate(levels) if m])
        window = deepest <= cap
        toks, pos, sees = lade_inputs(past, fill, [] if not window else [], L) if window else ([], [], [])
        n_w = len(toks)
        gt, gp, gs = lade_inputs([[]], 0, guesses, L)
        toks, pos, sees = toks + gt, pos + gp, sees + [{n_w + s for s in ss} for ss in gs]
        ids = torch.tensor([tokens + toks])
        T = len(tokens) + len(toks)
        allowed = torch.zeros((T, T), dtype=torch.bool)
        allowed[: len(tokens), : len(tokens)] = torch.tril(torch.ones(len(tokens), len(tokens), dtype=torch.bool))
        for i, ss in enumerate(sees):
            allowed[len(tokens) + i, : len(tokens)] = True
            for s in ss:
                allowed[len(tokens) + i, len(tokens) + s] = True
        mask = torch.zeros((1, 1, T, T)).masked_fill(~allowed, torch.finfo(torch.float32).min)
        position = torch.tensor([list(range(len(tokens))) + pos])
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, position_ids=position).logits[0]
        arg = out.argmax(-1).tolist()
        y0 = arg[L - 1]
        best, hits = 0, [y0]
        for gi, g in enumerate(guesses):
            correct = [y0] + [arg[L + n_w + gi_off] for gi_off in range(sum(len(x) for x in guesses[:gi]),
                                                                       sum(len(x) for x in guesses[:gi + 1]))]
            k = 0
            while k < len(g) and g[k] == correct[k]:
                k += 1
            if k > best:
                best, hits = k, correct[: k + 1]
        accepted.append(best)
        if window:
            top = arg[L + n_w - len(levels[-1]) : L + n_w]
            fill = lade_step(past, fill, c, top, pool, G, N)
        tokens += hits
    return tokens[len(prompt) : len(prompt) + max_new], accepted, pool


@pytest.mark.parametrize("W, N, G", [(4, 3, 3), (5, 4, 4)])
def test_lookahead_equals_the_cache_free_lade_loop(tiny_pair, W, N, G):
    """Tokens, drafts accepted per iteration and the final n-gram pool equal the reference's."""
    seen = []

    class Keep(Lookahead):  # the lookahead drafter, its proposer kept to read the pool afterwards
        def source(self, *args):
            src = super().source(*args)
            seen.append(src)
            return src

    prompt = tiny_pair.tokenizer(PROMPT)["input_ids"]
    method = compose(Vanilla(), Keep(width=W, ngram=N, guesses=G), OwnTree(), "greedy", "lookahead")
    gen = pair_engine(tiny_pair, method).generate(prompt, 48)
    want, accepted, pool = reference(tiny_pair.target, prompt, 48, W, N, G, 10)
    assert gen.token_ids == want
    assert [r.accepted for r in gen.records] == accepted
    assert seen[0].window.pool == pool and pool  # the n-grams were collected
    assert gen.token_ids == pair_engine(tiny_pair, {"name": "ar"}).generate(prompt, 48).token_ids


def test_the_window_is_a_tree_of_lades_mask():
    """Levels [L_0 = a b], [L_1 = c d e], [L_2 = f g h] under the root: L_0 a chain, each column a chain under its B_0
    node (column 0 under the root)."""
    w = Window([1], 3, 4, 2, 0)
    w.levels = [[10, 11], [20, 21, 22], [30, 31, 32]]
    tokens, parents = w.tree()
    assert tokens == [10, 11, 20, 21, 22, 30, 31, 32]
    assert parents == [-1, 0, -1, 0, 1, 2, 3, 4]
    assert w.depth() == 4  # L_2's column 2: its B_0 node at depth 2, then L_1 and itself


def test_pool_keeps_the_newest_grams_and_a_trie_merges_prefixes():
    w = Window([1], 3, 3, 2, 0)
    for g in [(1, 2), (3, 4), (1, 2), (5, 6)]:
        w.add(7, g)
    assert w.pool[7] == [(1, 2), (5, 6)]  # (3, 4) was the oldest when (5, 6) came
    assert trie([(1, 2), (1, 3), (4, 5)], 10, frozenset()) == ([1, 2, 3, 4, 5], [-1, 0, 0, -1, 3])
    assert trie([(1, 2), (1, 3), (4, 5)], 3, frozenset()) == ([1, 2, 3], [-1, 0, 0])
    assert trie([(9, 2), (1, 3)], 10, frozenset({9})) == ([9, 1, 3], [-1, -1, 1])  # nothing below an EOS


def test_options_and_refusals():
    with pytest.raises(OptionError, match="method.ngram"):
        build_method({"name": "lookahead", "ngram": 2})
    with pytest.raises(OptionError, match="method.width"):
        build_method({"name": "lookahead", "width": 1})
    m = build_method({"name": "lookahead"})
    with pytest.raises(OptionError, match="one row at a time"):
        m.plan.refuse(m.name, batch_size=2)
    with pytest.raises(OptionError, match="look-ahead window runs on the eager path only"):
        m.plan.refuse(m.name, compile=True)


def test_a_runs_one_token_cost_is_never_an_iteration_that_fed_the_window(tmp_path):
    """Lookahead's zero-draft iterations still feed its window: the records count those look-only nodes
    (call_seconds look_nodes), the run's predicted speedup takes target_1 from the ar calibration instead of them,
    and a run whose zero-draft iterations fed one token (prompt lookup finding no match) keeps them."""
    import json

    from helpers import small
    from specbench.runs.runner import run as run_job

    common = ("limit=2", "decode.max_new_tokens=24", "threads=1")
    look = run_job(small("method=lookahead", *common), tmp_path / "lookahead")
    rows = [json.loads(x) for x in (tmp_path / "lookahead" / "rows.jsonl").read_text().splitlines()]
    fed = [r["call_seconds"]["look_nodes"] for r in rows]
    assert any(f.get("0", 0) > 0 for f in fed), fed  # w = 0 iterations that fed the window
    assert look["call_costs"]["target_1_from"] == "calibration"
    pld = run_job(small("method=pld", *common), tmp_path / "pld")
    seen = [json.loads(x)["call_seconds"] for x in (tmp_path / "pld" / "rows.jsonl").read_text().splitlines()]
    assert any(s["verify_s"].get("0") for s in seen) and all(set(s["look_nodes"].values()) <= {0} for s in seen)
    assert pld["call_costs"]["target_1_from"] == "rows"
