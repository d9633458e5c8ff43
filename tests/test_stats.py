"""entropy_bits and js_distance (specbench/decoding/sampling.py) against scipy, batched and on edge cases."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.special import entr, rel_entr
from scipy.stats import entropy

from specbench.decoding.sampling import entropy_bits, js_distance


def random_dists(seed: int, b: int, v: int) -> np.ndarray:
    """b distributions over v symbols [b, v]: flat, peaked (softmax of scaled logits) and sparse."""
    rng = np.random.default_rng(seed)
    flat = rng.dirichlet(np.ones(v), size=b // 3)
    logits = rng.normal(size=(b // 3, v)) * rng.uniform(0.5, 8.0, size=(b // 3, 1))
    peaked = np.exp(logits - logits.max(1, keepdims=True))
    sparse = rng.dirichlet(np.full(v, 0.1), size=b - 2 * (b // 3))
    sparse[rng.random(sparse.shape) < 0.3] = 0.0  # exact zeros
    sparse[:, 0] += 1e-3  # keep every row non-empty
    out = np.concatenate([flat, peaked, sparse])
    return out / out.sum(1, keepdims=True)


def scipy_entropy(p: np.ndarray) -> np.ndarray:
    return np.array([entropy(row, base=2) for row in p])


def scipy_js(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.array([jensenshannon(a, b, base=2) for a, b in zip(p, q)])


@pytest.mark.parametrize("v", [2, 8, 300])
def test_entropy_matches_scipy_batched(v):
    p = random_dists(v, 60, v)
    got = entropy_bits(torch.from_numpy(p))
    assert got.shape == (60,)
    np.testing.assert_allclose(got.numpy(), scipy_entropy(p), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("v", [2, 8, 300])
def test_js_distance_matches_scipy_batched(v):
    p, q = random_dists(100 + v, 60, v), random_dists(200 + v, 60, v)
    got = js_distance(torch.from_numpy(p), torch.from_numpy(q))
    assert got.shape == (60,)
    np.testing.assert_allclose(got.numpy(), scipy_js(p, q), rtol=1e-7, atol=1e-9)


def raw_js(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """d_JS by scipy's elementwise rel_entr on p and q as given (jensenshannon renormalises its inputs, which moves
    a tiny distance by more than itself when float32 / bf16 probabilities sum to 1 only within rounding)."""
    m = 0.5 * (p + q)
    return np.sqrt(0.5 * (rel_entr(p, m).sum(-1) + rel_entr(q, m).sum(-1)) / np.log(2))


def test_float32_as_the_engine_uses_them():
    """The engine's probabilities are float32; the statistics of those very numbers are computed in float64."""
    P, Q = torch.from_numpy(random_dists(7, 90, 264)).float(), torch.from_numpy(random_dists(8, 90, 264)).float()
    p, q = P.double().numpy(), Q.double().numpy()  # the same float32 values, in float64
    assert entropy_bits(P).dtype == js_distance(P, Q).dtype == torch.float64
    np.testing.assert_allclose(entropy_bits(P).numpy(), entr(p).sum(-1) / np.log(2), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(js_distance(P, Q).numpy(), raw_js(p, q), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_js_of_nearly_equal_distributions_is_not_rounded_to_zero(dtype):
    """d_JS about 1e-5..1e-3 between two float32 / bf16 softmaxes (float32 arithmetic gave exactly 0 below ~3e-4)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 1000, generator=g) * 3
    P = torch.softmax(x, -1).to(dtype)
    Q = torch.softmax(x + 1e-4 * torch.randn(16, 1000, generator=g), -1).to(dtype)
    want = raw_js(P.double().numpy(), Q.double().numpy())
    assert (want > 1e-7).all() and (want < 1e-3).all()
    got = js_distance(P, Q).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_extra_batch_dims():
    p, q = random_dists(1, 24, 16), random_dists(2, 24, 16)
    got = js_distance(torch.from_numpy(p).view(2, 3, 4, 16), torch.from_numpy(q).view(2, 3, 4, 16))
    assert got.shape == (2, 3, 4)
    np.testing.assert_allclose(got.reshape(-1).numpy(), scipy_js(p, q), rtol=1e-7, atol=1e-9)


def test_entropy_edge_cases():
    one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    assert entropy_bits(one_hot).item() == 0.0
    assert entropy_bits(torch.full((8,), 1 / 8, dtype=torch.float64)).item() == pytest.approx(3.0, abs=1e-12)
    assert entropy_bits(torch.full((264,), 1 / 264)).item() == pytest.approx(np.log2(264), abs=1e-5)
    # hand-worked: H(1/2, 1/4, 1/8, 1/8) = 1/2 + 2/4 + 3/8 + 3/8 = 1.75 bits, zeros contribute 0
    assert entropy_bits(torch.tensor([0.5, 0.25, 0.0, 0.125, 0.125])).item() == pytest.approx(1.75, abs=1e-6)


def test_js_edge_cases():
    f64 = dict(dtype=torch.float64)
    a = torch.tensor([1.0, 0.0, 0.0], **f64)
    b = torch.tensor([0.0, 0.5, 0.5], **f64)
    assert js_distance(a, b).item() == pytest.approx(1.0, abs=1e-12)  # disjoint supports: the maximum
    assert js_distance(b, a).item() == pytest.approx(1.0, abs=1e-12)
    assert js_distance(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx(1.0, abs=1e-6)
    p = torch.from_numpy(random_dists(3, 30, 50))
    assert torch.equal(js_distance(p, p), torch.zeros(30, **f64))  # identical: exactly 0
    assert js_distance(a, a).item() == 0.0  # identical one-hot
    # hand-worked: p = (1, 0), q = (1/2, 1/2), m = (3/4, 1/4):
    # D_JS = 1/2 KL(p||m) + 1/2 KL(q||m) = 1/2 log2(4/3) + 1/2 (1/2 log2(2/3) + 1/2 log2(2)) ~ 0.3113
    dj = 0.5 * np.log2(4 / 3) + 0.5 * (0.5 * np.log2(2 / 3) + 0.5 * np.log2(2.0))
    got = js_distance(torch.tensor([1.0, 0.0], **f64), torch.tensor([0.5, 0.5], **f64)).item()
    assert got == pytest.approx(np.sqrt(dj), abs=1e-12)
    assert got == pytest.approx(jensenshannon([1.0, 0.0], [0.5, 0.5], base=2), abs=1e-12)


@pytest.mark.parametrize("which", ["p", "q", "both"])
def test_js_with_zeros_in_p_or_q(which):
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(12), size=20), rng.dirichlet(np.ones(12), size=20)
    if which in ("p", "both"):
        p[:, :4] = 0.0
    if which in ("q", "both"):
        q[:, 3:7] = 0.0  # with "both": column 3 is zero in both
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    got = js_distance(torch.from_numpy(p), torch.from_numpy(q)).numpy()
    assert np.isfinite(got).all() and (got >= 0).all() and (got <= 1).all()
    np.testing.assert_allclose(got, scipy_js(p, q), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(entropy_bits(torch.from_numpy(p)).numpy(), scipy_entropy(p), rtol=1e-9)
