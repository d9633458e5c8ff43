"""Drafter `suffix` (conf/method/suffix.yaml): SuffixDecoding (Oliaro et al., NeurIPS 2025): drafts from suffix trees, no draft model.

Two trees speculate (specbench.decoding.suffix) from the row's last `max_depth` tokens: the row's own, over its
prompt and output so far, and the run's, over the outputs of the examples decoded before it (`global_cache`); the
higher score is proposed (the row's own on ties, as arctic-inference's SuffixDecodingCache.speculate), at most
min(gamma, max_spec_factor * match length + max_spec_offset) tokens, each of estimated probability at least
min_token_prob. Shape `chain`: the path of most frequent continuations (arctic-inference's vLLM integration); shape
`tree`: the paper's best-first speculation tree (batch_size 1, eager). Drafts are one-hot: `rejection` is lossless.

The run's tree holds the recorded examples' outputs in decoding order (a warm-up adds nothing; each repeat starts
empty); rows record how many it held, and a resumed run rebuilds it from the rows in the folder. Unlike the
reference, the row being decoded enters the run's tree when finished (its own tree grows with its output).
"""

from __future__ import annotations

from typing import Any

import torch

from specbench.common.options import OptionError, integer, real
from specbench.decoding.drafts import DraftSource, Drafting, fixed_proposals
from specbench.decoding.method import Binding
from specbench.decoding.policy import state_values
from specbench.decoding.parts import DRAFTERS, Drafter, Needs, Shape
from specbench.decoding.proposal import TOP_K, Proposal, chain
from specbench.decoding.state import Counted
from specbench.decoding.suffix import Draft, SuffixIndex


class SuffixDraft(DraftSource):
    """Each row's speculation from its own tree and the run's (SuffixIndex), as a chain or a tree of one-hot drafts."""

    def __init__(self, part: "Suffix", rows: int, trees: bool) -> None:
        self.m, self.trees = part, trees  # trees: the paper's speculation tree (shape tree), else the path
        self.own = [SuffixIndex(part.max_depth) for _ in range(rows)]  # prompt + output of each row
        self.seen = [0] * rows  # tokens of buf[b] already in row b's own tree

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        m = self.m
        drafts: list[Draft | None] = []  # None: the row may draft nothing
        for b, (L, cap) in enumerate(zip(d.L, d.w_max)):
            own = self.own[b]
            if self.seen[b] < L:
                own.extend(buf[b, self.seen[b] : L].tolist())
                self.seen[b] = L
            if cap <= 0:
                drafts.append(None)
                continue
            context = own.data[max(0, len(own.data) - m.max_depth) :]
            best = own.speculate(context, cap, m.max_spec_factor, m.max_spec_offset,
                                 m.min_token_prob, self.trees)
            if m.global_cache:
                other = m.run_index.speculate(context, cap, m.max_spec_factor, m.max_spec_offset,
                                              m.min_token_prob, self.trees)
                best = best if best.score >= other.score else other
            drafts.append(best)
        if not self.trees:
            return fixed_proposals([dr.tokens if dr is not None else [] for dr in drafts], d)
        return [self.tree_proposal(dr, d) for dr in drafts]

    def select(self, rows: list[int]) -> None:
        """Each live row keeps its own tree (indexed by its new place in the batch)."""
        self.own, self.seen = [self.own[b] for b in rows], [self.seen[b] for b in rows]

    @staticmethod
    def tree_proposal(draft: Draft | None, d: Drafting) -> Proposal:
        """The speculation tree without the descendants of an EOS node (nothing follows an EOS)."""
        if draft is None:
            return chain([], why="length")
        keep: list[int] = []
        new_id: dict[int, int] = {}
        for j, (x, a) in enumerate(zip(draft.tokens, draft.parents)):
            if a >= 0 and (a not in new_id or draft.tokens[a] in d.eos_ids):
                continue
            new_id[j] = len(keep)
            keep.append(j)
        if not keep:
            return chain([], why="source")
        tokens = [draft.tokens[j] for j in keep]
        parents = [new_id[draft.parents[j]] if draft.parents[j] >= 0 else -1 for j in keep]
        return Proposal(tokens, parents, None, "window", TOP_K, 0)


@DRAFTERS.register("suffix")
class Suffix(Drafter):
    """SuffixDecoding: chains (or trees) of one-hot drafts from the row's and the run's suffix trees, at most the
    policy's window (gamma) of nodes."""

    # the path of most frequent continuations, or the paper's speculation tree, grown from the suffix index: only the
    # target's mask is checked
    needs = Needs(proposes=("chain", "tree"), pair_draft=False, tree_role="")

    def __init__(self, max_depth: int = 64, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                 min_token_prob: float = 0.1, global_cache: bool = True) -> None:
        self.max_depth = integer(max_depth, "method.max_depth", low=2)
        self.max_spec_factor = real(max_spec_factor, "method.max_spec_factor", low=0)
        self.max_spec_offset = real(max_spec_offset, "method.max_spec_offset")
        self.min_token_prob = real(min_token_prob, "method.min_token_prob", low=0, high=1)
        if not isinstance(global_cache, bool):
            raise OptionError(f"method.global_cache must be true or false, got {global_cache!r}")
        self.global_cache = global_cache
        self.run_index = SuffixIndex(self.max_depth)  # the outputs recorded so far, one sequence each

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        return SuffixDraft(self, len(next(iter(states.values())).fed), shape.trees)

    def state(self) -> dict[str, float]:
        return {"run_outputs": len(self.run_index.starts)}

    def observe_output(self, token_ids: list[int]) -> None:
        """A recorded example's new tokens enter the run's tree."""
        if self.global_cache:
            self.run_index.new_sequence(token_ids)

    @property
    def carried(self) -> dict[str, Any] | None:
        """How many outputs the run's tree holds (the runner hands their tokens back on resume)."""
        return {"outputs": len(self.run_index.starts)} if self.global_cache else None

    @carried.setter
    def carried(self, state: dict[str, Any]) -> None:
        """{"outputs": k}: keep the first k outputs; {"outputs": [[ids], ..]}: the run's tree over exactly those."""
        [outputs] = state_values("suffix", state, ("outputs",))
        if isinstance(outputs, int):
            if outputs > len(self.run_index.starts):
                raise ValueError(f"method 'suffix': the run's tree holds {len(self.run_index.starts)} outputs; a state "
                                 f"of {outputs} needs their tokens (the rows')")
            self.run_index.truncate(outputs)
            return
        self.run_index = SuffixIndex(self.max_depth)
        for ids in outputs:
            self.observe_output(ids)
