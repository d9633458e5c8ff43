"""Draft sources: what proposes a row's draft tokens x_1..x_w and their distributions q_1..q_w in step 1.

A method combines a draft source with its policy (window, keep_drafting) and its acceptance rule
(Method.draft_source picks the source). Every q_i is over the target's vocabulary [V]:
- `ModelDraft`: a draft model, x_i ~ q_i = q(. | buf[:L+i-1]) (argmax at temperature 0), one forward per token
  for the whole batch; the draft of the pair, or one a method builds (layer_skip: the target's first layers);
- a source with a deterministic proposal (prompt lookup, re-tokenized drafts of another vocabulary) sets
  q_i = one-hot(x_i) (`propose_fixed`). The `rejection` rule then accepts x_i with probability
  min(1, p_i(x_i) / 1) = p_i(x_i) and otherwise draws from norm(max(p_i - q_i, 0)) = p_i without x_i, so the
  token is distributed as p_i whatever the proposal was: the method stays lossless.
Each source writes x into buf[b, L_b:L_b+w_b], fills row.qs and row.why (window / eos / policy / length, and
`source` when the source had nothing more to propose), and returns the draft forwards it ran.
"""

from __future__ import annotations

from typing import Any

import torch

# Rows, model states and the engine are specbench.decoding.engine's Row, ModelState and Engine (typed Any here:
# the engine imports this module)


class DraftSource:
    """Proposes each row's drafts for one iteration (subclasses implement propose)."""

    def propose(self, buf: torch.Tensor, rows: list[Any], w_max: list[int]) -> int:
        """Write row b's drafts x_1..x_w (w <= w_max[b]) into buf[b, L_b:], their q_i [V] into row.qs and why
        drafting ended into row.why; return the draft forwards run."""
        raise NotImplementedError

    def rollback(self, rows: list[Any], accepted: list[int]) -> None:
        """After the verify: row b keeps its accepted prefix buf[b, :L_b + accepted[b]] (L_b not yet advanced)."""


def take(row: Any, buf_row: torch.Tensor, i: int, q: torch.Tensor, x: int, last: int, eos_ids: frozenset[int]
         ) -> bool:
    """Draft token i (0-based) x with distribution q [V] into the row: its buffer, its qs, and its policy's
    verdict; True if the row may draft another (not EOS, the policy keeps going, i + 1 < last)."""
    buf_row[row.L + i] = x
    row.qs.append(q)
    keep = row.method.keep_drafting(i + 1, q, x)  # asked for EOS too: confidence learns from it
    if x in eos_ids:
        row.why = "eos"
    elif not keep:
        row.why = "policy"
    return x not in eos_ids and keep and i + 1 < last


class ModelDraft(DraftSource):
    """A draft model with its KV cache over the batch's rows (the pair's draft, or a model the method built)."""

    def __init__(self, state: Any, engine: Any) -> None:
        self.state, self.engine = state, engine

    def propose(self, buf: torch.Tensor, rows: list[Any], w_max: list[int]) -> int:
        """x_i drawn from q_i = q(. | buf[b, :L_b+i-1]) for every open row; the batch drafts to its longest window
        and a row that stopped feeds a masked hole (its draft cache keeps its tokens)."""
        draft, eng = self.state, self.engine
        if draft.on_device and rows[0].method.fixed_window and w_max[0] > 0:
            return self.propose_on_device(buf, rows[0], w_max[0])
        open_ = [b for b, m in enumerate(w_max) if m > 0]  # rows still drafting
        i = 0
        while open_:
            drafting = set(open_)
            upto = [r.L + i if b in drafting else draft.fed[b] for b, r in enumerate(rows)]  # the others feed a hole
            q = eng.sampler.probs(draft.forward(buf, upto, 1)[:, 0]).to(eng.device)  # [B, V]
            x = self.pick(q, open_, rows)
            open_ = [b for b in open_ if take(rows[b], buf[b], i, q[b], x[b], w_max[b], eng.stop.eos_ids)]
            i += 1
        return i

    def propose_on_device(self, buf: torch.Tensor, row: Any, w: int) -> int:
        """The one row of a compiled state, its policy a fixed window: x_1..x_w drawn with no host synchronisation
        (x_i is written into buf on the device and fed from there) and read back once; drafts after a drafted
        EOS are dropped as the per-token loop would not have drafted them (their forwards are still counted)."""
        draft, eng = self.state, self.engine
        qs = []
        for i in range(w):
            q = eng.sampler.probs(draft.forward(buf, row.L + i, 1)[:, 0]).to(eng.device)  # [1, V]
            buf[0, row.L + i] = eng.sampler.pick(q, row.generator)[0]
            qs.append(q[0])
        for i, x in enumerate(buf[0, row.L : row.L + w].tolist()):
            if not take(row, buf[0], i, qs[i], x, w, eng.stop.eos_ids):
                break
        return w

    def pick(self, q: torch.Tensor, open_: list[int], rows: list[Any]) -> dict[int, int]:
        """The drafted token of each open row b from q [B, V]: argmax when greedy, else a draw with its generator."""
        if self.engine.sampler.params.greedy:
            top = q.argmax(-1).tolist()
            return {b: top[b] for b in open_}
        return {b: int(self.engine.sampler.pick(q[b : b + 1], rows[b].generator)[0]) for b in open_}

    def rollback(self, rows: list[Any], accepted: list[int]) -> None:
        """The draft cache keeps at most the accepted prefix (it never saw the last draft token nor the next one)."""
        self.state.crop([min(f, r.L + n) for f, r, n in zip(self.state.fed, rows, accepted)])


def propose_fixed(proposals: list[list[int]], buf: torch.Tensor, rows: list[Any], w_max: list[int],
                  vocab: int, eos_ids: frozenset[int]) -> None:
    """Draft each row b's deterministic proposal (target ids) with q_i = one-hot(x_i) [vocab], up to w_max[b]
    tokens, its first EOS, or its policy's stop; a proposal shorter than the window ends with why = source."""
    for b, (r, prop) in enumerate(zip(rows, proposals)):
        if w_max[b] <= 0:
            continue
        if len(prop) < w_max[b]:
            r.why = "source"
        last = min(w_max[b], len(prop))
        for i, x in enumerate(prop[:last]):
            q = torch.zeros(vocab, device=buf.device)
            q[x] = 1.0
            if not take(r, buf[b], i, q, x, last, eos_ids):
                break

