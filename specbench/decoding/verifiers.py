"""Steps 2 and 4 of the engine for one proposal shape, picked once per generation (`for_parts`): how a verify feeds
the batch's proposals to the target and how its cache then keeps each row's accepted path.

- chains (`ChainVerify`, B >= 1, eager or compiled): row b's n_b drafts go to buf[b, L_b:L_b+n_b], fed causally
  after its uncached tokens; the cache keeps its first L_b + n positions, the prefix and the n accepted drafts.
- trees (`TreeVerify`, B >= 1, eager): each row's uncached tokens and n_b nodes in one forward with tree attention
  (TreeState.feed_trees: node j sees the row's prefix and its root path, at position L_b - 1 + depth(j)); the cache
  keeps each row's prefix and its accepted path's nodes (TreeState.keep_paths). A batch whose proposals are all
  chains (or empty) takes `ChainVerify`'s causal forward, the same logits without a tree mask.
"""

from __future__ import annotations

import torch

from specbench.decoding.proposal import Proposal, Verdict
from specbench.decoding.state import ModelState, write
from specbench.decoding.tree_state import tree_state


class ChainVerify:
    """Chains of B >= 1 rows, right-aligned in one block (ModelState.forward)."""

    def feed(self, target: ModelState, buf: torch.Tensor, L: list[int], props: list[Proposal],
             layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [B, max n_b + 1, V_model], row b's last n_b + 1 columns p at its root (the last committed token)
        and after each of its drafts x_1..x_n, and with `layers` those layers' states of the block fed
        [len(layers), B, width, H] (else None)."""
        w = [len(prop) for prop in props]
        if any(w):  # every drafted token into its row's buffer, in one write
            write(buf, [(b, L[b] + i) for b, n in enumerate(w) for i in range(n)],
                  [x for prop in props for x in prop.tokens])
        logits = target.forward(buf, [n + k for n, k in zip(L, w)], max(w) + 1, layers)
        return logits, target.take_hidden()

    def keep(self, target: ModelState, buf: torch.Tensor, L: list[int], verdicts: list[Verdict],
             blocks: list[list[int]]) -> None:
        """Row b's cache keeps buf[b, :L_b + n_b], n_b its accepted drafts (the rest is rolled back), and its next
        token goes to buf[b, L_b + n_b]: the accepted drafts are in buf already, where feed wrote them."""
        write(buf, [(b, n + v.accepted) for b, (n, v) in enumerate(zip(L, verdicts))], [v.token for v in verdicts])
        target.crop([n + v.accepted for n, v in zip(L, verdicts)])


class TreeVerify:
    """Trees of B >= 1 rows, right-aligned in one block (TreeState.feed_trees)."""

    def __init__(self) -> None:
        self.chain = ChainVerify()

    def feed(self, target: ModelState, buf: torch.Tensor, L: list[int], props: list[Proposal],
             layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [B, max n_b + 1, V_model], row b's last n_b + 1 columns p at its root then at each of its nodes in
        proposal order (target: the TreeState the engine gives the verifier of a method whose plan verifies trees),
        and the states of `layers` as ChainVerify's. When every row's proposal is a chain, ChainVerify feeds them."""
        if all(prop.is_chain for prop in props):
            return self.chain.feed(target, buf, L, props, layers)
        logits = tree_state(target).feed_trees(buf, L, [p.tokens for p in props], [p.parents for p in props], True,
                                               layers=layers)
        return logits, target.take_hidden()

    def keep(self, target: ModelState, buf: torch.Tensor, L: list[int], verdicts: list[Verdict],
             blocks: list[list[int]]) -> None:
        """Row b's cache keeps buf[b, :L_b] and its accepted path's nodes; its block [n_b + 1] (the path's tokens
        and the next) goes to buf[b, L_b:]. Chains fed causally are kept as ChainVerify keeps them."""
        tree = tree_state(target)
        if not any(tree.forest.nodes):
            return self.chain.keep(tree, buf, L, verdicts, blocks)
        write(buf, [(b, L[b] + i) for b, block in enumerate(blocks) for i in range(len(block))],
              [t for block in blocks for t in block])
        tree.keep_paths(L, [v.path for v in verdicts])


def for_parts(trees: bool) -> ChainVerify | TreeVerify:
    """The verify of a method whose parts propose trees (Plan.trees) or chains."""
    return TreeVerify() if trees else ChainVerify()
