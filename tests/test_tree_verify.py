"""Tree attention (specbench.decoding.tree_state) against cache-free forwards of prefix + each node's root path."""

import pytest
import torch

from specbench.decoding.proposal import ancestors
from specbench.decoding.state import ModelState
from specbench.decoding.tree_state import TreeState
from specbench.models.tiny import tiny_llama

ARCH = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.6)
PREFIX = [5, 17, 3, 42, 8, 60, 1, 33, 21, 9, 14, 50]  # L = 12 committed tokens
# 3 root children; 0 -> 3, 4; 2 -> 5, 6; 3 -> 7; 5 -> 8; 6 -> 9 (depths 1, 1, 1, 2, 2, 2, 2, 3, 3, 3)
TOKENS = [11, 22, 33, 44, 55, 6, 7, 18, 29, 30]
PARENTS = [-1, -1, -1, 0, 0, 2, 2, 3, 5, 6]
ATOL = 1e-4


@pytest.fixture(scope="module", params=["eager", "sdpa"])
def model(request):
    m = tiny_llama(3, **ARCH)
    m.set_attn_implementation(request.param)
    return m


def truth(model, ids: list[int]) -> torch.Tensor:
    """Cache-free logits [V] at the last of ids."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def node_truth(model, prefix: list[int], j: int) -> torch.Tensor:
    return truth(model, prefix + [TOKENS[a] for a in ancestors(PARENTS)[j]])


def buffer(ids: list[int]) -> torch.Tensor:
    return torch.tensor([ids + [0] * 8])  # [1, N]: trailing slots the feeds must not read


def test_mask_is_sensitive(model):
    """The check is meaningful: node 3 after its root path differs from node 3 after all earlier nodes."""
    assert not torch.allclose(node_truth(model, PREFIX, 3), truth(model, PREFIX + TOKENS[:4]), atol=1e-2)


@pytest.mark.parametrize("pre", [0, 8])
def test_one_call_equals_root_paths(model, pre):
    s = TreeState(model)
    if pre:
        s.forward(buffer(PREFIX), pre, 1)
    logits = s.feed_trees(buffer(PREFIX), [len(PREFIX)], [TOKENS], [PARENTS], keep_root=True)
    assert logits.shape == (1, 1 + len(TOKENS), ARCH["vocab_size"])
    torch.testing.assert_close(logits[0, 0], truth(model, PREFIX), atol=ATOL, rtol=0)
    for j in range(len(TOKENS)):
        torch.testing.assert_close(logits[0, 1 + j], node_truth(model, PREFIX, j), atol=ATOL, rtol=0)
    assert s.fed == [len(PREFIX)] and s.forest.nodes == [list(range(len(TOKENS)))]
    assert s.cache.get_seq_length() == len(PREFIX) + len(TOKENS) and s.calls == 1 + bool(pre)


@pytest.mark.parametrize("calls", [
    [[0, 1, 2], [3, 4, 5, 6, 7, 8, 9]],  # depth 1, then the deeper nodes
    [[0, 1, 2], [3, 5], [7]],  # depth by depth, expanding only some nodes (non-contiguous indices; one query)
])
def test_calls_equal_root_paths(model, calls):
    s = TreeState(model)
    cached: list[int] = []
    for c, nodes in enumerate(calls):
        logits = s.feed_trees(buffer(PREFIX), [len(PREFIX)], [[TOKENS[j] for j in nodes]],
                              [[PARENTS[j] for j in nodes]], keep_root=c == 0, nodes=[nodes])
        if c == 0:
            torch.testing.assert_close(logits[0, 0], truth(model, PREFIX), atol=ATOL, rtol=0)
        for k, j in enumerate(nodes):
            torch.testing.assert_close(logits[0, (c == 0) + k], node_truth(model, PREFIX, j), atol=ATOL, rtol=0)
        cached += nodes
        assert s.forest.nodes == [cached] and s.fed == [len(PREFIX)]


@pytest.mark.parametrize("path", [[2, 5], [2, 6, 9], [0], [1]])
def test_keep_path_then_continue(model, path):
    """After keep_paths, an ordinary forward and a new tree continue prefix + path exactly."""
    s = TreeState(model)
    s.feed_trees(buffer(PREFIX), [len(PREFIX)], [TOKENS], [PARENTS], keep_root=True)
    s.keep_paths([len(PREFIX)], [path])
    assert s.cache.get_seq_length() == len(PREFIX) + len(path) and s.fed == [len(PREFIX) + len(path)]
    assert s.forest.nodes == [[]]
    seq = PREFIX + [TOKENS[j] for j in path] + [13]
    torch.testing.assert_close(s.forward(buffer(seq), len(seq), 1)[0, 0], truth(model, seq), atol=ATOL, rtol=0)
    logits = s.feed_trees(buffer(seq + [19]), [len(seq) + 1], [TOKENS], [PARENTS], keep_root=True)
    torch.testing.assert_close(logits[0, 0], truth(model, seq + [19]), atol=ATOL, rtol=0)
    for j in (4, 8):
        torch.testing.assert_close(logits[0, 1 + j], node_truth(model, seq + [19], j), atol=ATOL, rtol=0)


def test_keep_path_beyond_the_cache(model):
    """A drafter's path runs past its cached nodes: only the cached prefix of the path is kept."""
    s = TreeState(model)
    s.feed_trees(buffer(PREFIX), [len(PREFIX)], [TOKENS[:7]], [PARENTS[:7]], keep_root=True)
    s.keep_paths([len(PREFIX)], [[2, 6, 9]])
    assert s.cache.get_seq_length() == len(PREFIX) + 2 and s.fed == [len(PREFIX) + 2]
    seq = PREFIX + [TOKENS[2], TOKENS[6], TOKENS[9]]
    torch.testing.assert_close(s.forward(buffer(seq), len(seq), 1)[0, 0], truth(model, seq), atol=ATOL, rtol=0)


def test_chain_equals_forward(model):
    chain = [7, 19, 23, 2, 61]
    a, b = TreeState(model), ModelState(model)
    got = a.feed_trees(buffer(PREFIX), [len(PREFIX)], [chain], [list(range(-1, len(chain) - 1))], keep_root=True)
    want = b.forward(buffer(PREFIX + chain), len(PREFIX) + len(chain), len(chain) + 1)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_refusals(model):
    s = TreeState(model)
    with pytest.raises(ValueError, match="a forward needs something to feed"):
        s.feed_trees(buffer(PREFIX), [0], [[]], [[]], keep_root=True)
    with pytest.raises(ValueError, match="parent 3 is neither cached"):
        s.feed_trees(buffer(PREFIX), [len(PREFIX)], [[1]], [[3]], keep_root=True, nodes=[[7]])
    impl = model.config._attn_implementation
    try:
        model.config._attn_implementation = "flash_attention_2"
        with pytest.raises(ValueError, match="flash_attention_2.*cannot take"):
            TreeState(model)
    finally:
        model.config._attn_implementation = impl


# --- several rows: each row's nodes against the cache-free forwards of its own prefix and root paths ---

ROWS = [PREFIX, [7, 7, 2, 40, 13], PREFIX[3:] + [2]]  # committed tokens of 3 rows, of different lengths
TREES = [(TOKENS, PARENTS), ([], []), ([TOKENS[j] for j in (0, 1, 3, 7)], [-1, -1, 0, 2])]  # row 1: no nodes


def rows_buffer(rows: list[list[int]]) -> torch.Tensor:
    """[B, N]: each row's ids, zeros after them (slots the feeds must not read)."""
    width = max(map(len, rows)) + 8
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


def check_rows(model, logits: torch.Tensor, rows: list[list[int]], trees: list[tuple], keep_root: bool) -> None:
    """Row b's root (when kept) and nodes, right-aligned in logits [B, keep, V], equal their cache-free truth."""
    for b, (prefix, (tokens, parents)) in enumerate(zip(rows, trees)):
        if keep_root:
            torch.testing.assert_close(logits[b, -len(tokens) - 1], truth(model, prefix), atol=ATOL, rtol=0)
        for j, anc in enumerate(ancestors(parents)):
            got = logits[b, logits.shape[1] - len(tokens) + j]
            torch.testing.assert_close(got, truth(model, prefix + [tokens[a] for a in anc]), atol=ATOL, rtol=0)


def test_a_batch_of_trees_equals_each_rows_root_paths(model):
    """Three rows, partly cached to different lengths, feed trees of different sizes (one none) in one forward;
    each row then keeps its own path (rows' rejected nodes become holes), continues with an ordinary forward and
    a second tree, and a row leaves the batch: every logit equals the cache-free forward of the row's own tokens."""
    s = TreeState(model, 3)
    s.forward(rows_buffer(ROWS), [len(ROWS[0]) - 4, 2, len(ROWS[2]) - 1], 1)  # a cached prefix per row
    logits = s.feed_trees(rows_buffer(ROWS), [len(r) for r in ROWS], [t for t, _ in TREES], [p for _, p in TREES],
                          keep_root=True)
    assert logits.shape == (3, 1 + len(TOKENS), ARCH["vocab_size"]) and s.calls == 2
    check_rows(model, logits, ROWS, TREES, True)
    paths = [[2, 6, 9], [], [0, 2]]  # root paths: 6 is a child of 2, 9 of 6; row 2: 2 of 0
    s.keep_paths([len(r) for r in ROWS], paths)
    kept = [r + [TREES[b][0][j] for j in p] for b, (r, p) in enumerate(zip(ROWS, paths))]
    assert s.fed == [len(k) for k in kept] and s.forest.nodes == [[], [], []]
    assert s.mask is not None and s.mask.sum(1).tolist() == s.fed  # each row's tokens, the rest holes
    step = [k + [13 + b] for b, k in enumerate(kept)]
    nxt = s.forward(rows_buffer(step), [len(x) for x in step], 1)
    for b, x in enumerate(step):
        torch.testing.assert_close(nxt[b, 0], truth(model, x), atol=ATOL, rtol=0)
    again = [TREES[2], TREES[0], TREES[1]]
    logits = s.feed_trees(rows_buffer(step), [len(x) for x in step], [t for t, _ in again], [p for _, p in again],
                          keep_root=False)
    check_rows(model, logits, step, again, False)
    s.keep_paths([len(x) for x in step], [[0], [], []])
    s.select([2, 0])  # row 1 leaves
    last = [step[2] + [5], step[0] + [TREES[2][0][0], 6]]
    nxt = s.forward(rows_buffer(last), [len(x) for x in last], 1)
    for b, x in enumerate(last):
        torch.testing.assert_close(nxt[b, 0], truth(model, x), atol=ATOL, rtol=0)
