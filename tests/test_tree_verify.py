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
    logits = s.feed_tree(buffer(PREFIX), len(PREFIX), TOKENS, PARENTS, [], keep_root=True)
    assert logits.shape == (1, 1 + len(TOKENS), ARCH["vocab_size"])
    torch.testing.assert_close(logits[0, 0], truth(model, PREFIX), atol=ATOL, rtol=0)
    for j in range(len(TOKENS)):
        torch.testing.assert_close(logits[0, 1 + j], node_truth(model, PREFIX, j), atol=ATOL, rtol=0)
    assert s.fed == [len(PREFIX)] and s.tree_nodes == list(range(len(TOKENS)))
    assert s.cache.get_seq_length() == len(PREFIX) + len(TOKENS) and s.calls == 1 + bool(pre)


@pytest.mark.parametrize("calls", [
    [[0, 1, 2], [3, 4, 5, 6, 7, 8, 9]],  # depth 1, then the deeper nodes
    [[0, 1, 2], [3, 5], [7]],  # depth by depth, expanding only some nodes (non-contiguous indices; one query)
])
def test_calls_equal_root_paths(model, calls):
    s = TreeState(model)
    cached: list[int] = []
    for c, nodes in enumerate(calls):
        logits = s.feed_tree(buffer(PREFIX), len(PREFIX), [TOKENS[j] for j in nodes], [PARENTS[j] for j in nodes],
                           list(cached), keep_root=c == 0, nodes=nodes)
        if c == 0:
            torch.testing.assert_close(logits[0, 0], truth(model, PREFIX), atol=ATOL, rtol=0)
        for k, j in enumerate(nodes):
            torch.testing.assert_close(logits[0, (c == 0) + k], node_truth(model, PREFIX, j), atol=ATOL, rtol=0)
        cached += nodes
        assert s.tree_nodes == cached and s.fed == [len(PREFIX)]


@pytest.mark.parametrize("path", [[2, 5], [2, 6, 9], [0], [1]])
def test_keep_path_then_continue(model, path):
    """After keep_path, an ordinary forward and a new tree continue prefix + path exactly."""
    s = TreeState(model)
    s.feed_tree(buffer(PREFIX), len(PREFIX), TOKENS, PARENTS, [], keep_root=True)
    s.keep_path(len(PREFIX), path)
    assert s.cache.get_seq_length() == len(PREFIX) + len(path) and s.fed == [len(PREFIX) + len(path)]
    assert s.tree_nodes == []
    seq = PREFIX + [TOKENS[j] for j in path] + [13]
    torch.testing.assert_close(s.forward(buffer(seq), len(seq), 1)[0, 0], truth(model, seq), atol=ATOL, rtol=0)
    logits = s.feed_tree(buffer(seq + [19]), len(seq) + 1, TOKENS, PARENTS, [], keep_root=True)
    torch.testing.assert_close(logits[0, 0], truth(model, seq + [19]), atol=ATOL, rtol=0)
    for j in (4, 8):
        torch.testing.assert_close(logits[0, 1 + j], node_truth(model, seq + [19], j), atol=ATOL, rtol=0)


def test_keep_path_beyond_the_cache(model):
    """A drafter's path runs past its cached nodes: only the cached prefix of the path is kept."""
    s = TreeState(model)
    s.feed_tree(buffer(PREFIX), len(PREFIX), TOKENS[:7], PARENTS[:7], [], keep_root=True)
    s.keep_path(len(PREFIX), [2, 6, 9])
    assert s.cache.get_seq_length() == len(PREFIX) + 2 and s.fed == [len(PREFIX) + 2]
    seq = PREFIX + [TOKENS[2], TOKENS[6], TOKENS[9]]
    torch.testing.assert_close(s.forward(buffer(seq), len(seq), 1)[0, 0], truth(model, seq), atol=ATOL, rtol=0)


def test_chain_equals_forward(model):
    chain = [7, 19, 23, 2, 61]
    a, b = TreeState(model), ModelState(model)
    got = a.feed_tree(buffer(PREFIX), len(PREFIX), chain, list(range(-1, len(chain) - 1)), [], keep_root=True)
    want = b.forward(buffer(PREFIX + chain), len(PREFIX) + len(chain), len(chain) + 1)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_refusals(model):
    s = TreeState(model)
    with pytest.raises(ValueError, match="keep_root needs a committed token"):
        s.feed_tree(buffer(PREFIX), 0, TOKENS, PARENTS, [], keep_root=True)
    with pytest.raises(ValueError, match="parent 3 is neither cached"):
        s.feed_tree(buffer(PREFIX), len(PREFIX), [1], [3], [], keep_root=True, nodes=[7])
    impl = model.config._attn_implementation
    try:
        model.config._attn_implementation = "flash_attention_2"
        with pytest.raises(ValueError, match="flash_attention_2.*cannot take"):
            TreeState(model)
    finally:
        model.config._attn_implementation = impl
