"""Tree acceptance: walk a `Proposal` tree from the root against the target's p [n+1, V] and return the accepted path.

Every rule walks down from the root. At a node with target distribution r (initially p there) and children
c_1..c_k holding tokens x_1..x_k it either accepts a child and descends (r := p at that child), or emits a token and
stops; a leaf emits a draw from p there (the bonus token). The result is (path of node indices, emitted token).

- greedy (`greedy_path`): descend into the first child whose token is argmax r; else emit argmax r. At temperature 0
  the target emits argmax p, so this is exact.
- multi-step speculative sampling (`multi_step_path`, SpecInfer), children drawn independently from q: accept c_i
  w.p. min(1, r(x_i)/q(x_i)); on rejection r := norm(max(r - q, 0)). One round is the chain rule of Leviathan et al.:
  P(emit y) = q(y) min(1, r(y)/q(y)) + P(reject) r'(y) = min(q, r)(y) + max(r - q, 0)(y) = r(y). The next child is
  a fresh draw from q, independent of the rejected ones, so the round after a rejection samples r' exactly the same
  way; if none is accepted a draw from the last r' is emitted. By induction the emitted token is ~ r, and given that
  c_i was accepted the tokens below it follow p at c_i.
- recursive rejection sampling (`recursive_rejection_path`), children chosen without replacement. Children sampled
  from q without replacement: c_i ~ q_i = q with x_1..x_{i-1} removed and renormalised; accept w.p.
  min(1, r(x_i)/q_i(x_i)), on rejection r := norm(max(r - q_i, 0)). A rejection only happens when r(x_i) < q_i(x_i),
  so r' puts no mass on x_i and q_{i+1} (which lacks x_i) proposes for r' as in the round above: still ~ r.
  A deterministic choice of distinct tokens (top-k of q, or q None) is the one-hot q_i = e_{x_i}: accept w.p. r(x_i),
  on rejection r := norm(r with x_i set to 0), i.e. draw y ~ r and ask the children in turn whether they are y.
  Treating such children as independent draws from q is biased: they are not distributed as q. Children past q's
  support (padded in when k exceeds it) are such a fixed choice too: q_i = e_{x_i}.
- sample match (`sample_match_path`, AdaSD's rule on trees): draw y ~ p at the node; descend into the first child
  whose token is y, else emit y. Every token taken is a draw from p given the path above it.
"""

from __future__ import annotations

from typing import Callable

import torch

from specbench.decoding.proposal import TOP_K, WITHOUT_REPLACEMENT, Proposal

def greedy_path(prop: Proposal, top: list[int]) -> tuple[list[int], int]:
    """(path, next token): descend while a child's token is top at the node (top [n+1]: argmax of p [n+1, V])."""
    kids, node = prop.children(), -1
    path: list[int] = []
    while True:
        nxt = next((c for c in kids[node + 1] if prop.tokens[c] == top[node + 1]), None)
        if nxt is None:
            return path, top[node + 1]
        path.append(nxt)
        node = nxt


def _draw(r: torch.Tensor, generator: torch.Generator | None) -> int:
    """y ~ r [V] (multinomial normalises)."""
    return int(torch.multinomial(r, 1, generator=generator).item())


def _renorm(r: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """norm(r) [V], or fallback [V] when r has no mass (float rounding where the rejection was impossible)."""
    mass = r.sum()
    return r / mass if mass > 0 else fallback


def _accepts(r: torch.Tensor, q: torch.Tensor, x: int, generator: torch.Generator | None) -> bool:
    """u < min(1, r(x)/q(x)) for u ~ U[0, 1), written u q(x) < r(x) as acceptance.Rejection does (r, q [V])."""
    u = torch.rand(1, generator=generator, device=r.device)
    return bool((u * q[x] < r[x]).item())


def _rejection_walk(prop: Proposal, p: torch.Tensor, generator: torch.Generator | None,
                    proposals: Callable[[list[int]], torch.Tensor]) -> tuple[list[int], int]:
    """(path, next token) of the rule: accept c_i w.p. min(1, r/q_i), else r := norm(max(r - q_i, 0)), where
    proposals(kids) gives q_i [k, V] for the children kids [k] of a node."""
    children, path, node = prop.children(), [], -1
    while True:
        r, kids = p[node + 1], children[node + 1]
        qs = proposals(kids) if kids else None
        for i, c in enumerate(kids):
            assert qs is not None  # the node has children, whose q proposals() gave
            if _accepts(r, qs[i], prop.tokens[c], generator):
                path.append(c)
                node = c
                break
            r = _renorm((r - qs[i]).clamp_min(0.0), r)  # the residual: the target given this rejection
        else:  # none accepted (or a leaf): emit a draw from the residual
            return path, _draw(r, generator)


def _one_hot(prop: Proposal, kids: list[int], p: torch.Tensor) -> torch.Tensor:
    """e_{x_c} [k, V] for the children kids [k]."""
    q = torch.zeros((len(kids), p.shape[-1]), dtype=p.dtype, device=p.device)
    q[torch.arange(len(kids)), torch.tensor([prop.tokens[c] for c in kids])] = 1.0
    return q


def multi_step_path(prop: Proposal, p: torch.Tensor, generator: torch.Generator | None = None
                    ) -> tuple[list[int], int]:
    """(path, next token) by SpecInfer's multi-step speculative sampling; siblings independent draws from q [n, V]
    (q None: one-hot), p [n+1, V]."""
    q = prop.q.to(p.dtype) if prop.q is not None else None
    return _rejection_walk(prop, p, generator, lambda kids: q[kids] if q is not None else _one_hot(prop, kids, p))


def _without_replacement(prop: Proposal, kids: list[int], q: torch.Tensor) -> torch.Tensor:
    """q_1..q_k [k, V]: q_1 = q at the parent, q_{i+1} = norm(q_i with x_i set to 0) (e_{x_{i+1}} if that is 0)."""
    rows = [q[kids[0]]]
    for c, nxt in zip(kids[:-1], kids[1:]):
        left = rows[-1].clone()
        left[prop.tokens[c]] = 0.0
        pad = torch.zeros_like(left)  # k beyond q's support: x_{i+1} was padded in, a fixed choice: one-hot q
        pad[prop.tokens[nxt]] = 1.0
        rows.append(_renorm(left, pad))
    return torch.stack(rows)


def recursive_rejection_path(prop: Proposal, p: torch.Tensor, generator: torch.Generator | None = None
                             ) -> tuple[list[int], int]:
    """(path, next token) by recursive rejection sampling; siblings chosen without replacement: TOP_K or q None
    (distinct tokens, one-hot q_i) or WITHOUT_REPLACEMENT (drawn from q [n, V]); p [n+1, V]."""
    if prop.q is None or prop.siblings == TOP_K:
        return _rejection_walk(prop, p, generator, lambda kids: _one_hot(prop, kids, p))
    if prop.siblings != WITHOUT_REPLACEMENT:
        raise ValueError(f"recursive rejection needs siblings {TOP_K!r} or {WITHOUT_REPLACEMENT!r} (or q None), "
                         f"not {prop.siblings!r}")
    q = prop.q.to(p.dtype)
    return _rejection_walk(prop, p, generator, lambda kids: _without_replacement(prop, kids, q))


def sample_match_path(prop: Proposal, p: torch.Tensor, generator: torch.Generator | None = None
                      ) -> tuple[list[int], int]:
    """(path, next token): y ~ p [n+1, V] at the node; descend into the first child whose token is y, else emit y."""
    kids, node = prop.children(), -1
    path: list[int] = []
    while True:
        y = _draw(p[node + 1], generator)
        nxt = next((c for c in kids[node + 1] if prop.tokens[c] == y), None)
        if nxt is None:
            return path, y
        path.append(nxt)
        node = nxt
