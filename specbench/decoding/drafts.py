"""Proposers: what drafts a row's tokens in step 1, returned as values (specbench.decoding.proposal.Proposal).

A method's drafter part (specbench.decoding.parts) builds a `DraftSource` per generation. All it reads comes in a
`Drafting`; it returns one Proposal per row and never touches the engine or a row. Every q is over the target's
vocabulary [V]:
- `ModelDraft`: a draft model, x_i ~ q_i = q(. | buf[:L+i-1]) (argmax at temperature 0), one forward per token
  for the whole batch; the draft of the pair, or one a method builds (layer_skip: the target's first layers);
- a proposer with a deterministic proposal (prompt lookup, re-tokenized drafts of another vocabulary) has
  q = None, one-hot(x_i) (`fixed_proposals`). The `rejection` rule then accepts x_i with probability
  min(1, p_i(x_i) / 1) = p_i(x_i) and otherwise draws from norm(max(p_i - q_i, 0)) = p_i without x_i, so the
  token is distributed as p_i whatever the proposal was: the method stays lossless.
A proposer may use buf[b, L_b:] as scratch (a draft model feeds its drafts from there); the engine writes the
proposal it verifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specbench.decoding.proposal import Proposal, chain
from specbench.decoding.policy import Policy, fixed_window
from specbench.decoding.sampling import Sampler
from specbench.decoding.state import ModelState, to_device, write


@dataclass
class Drafting:
    """One iteration's drafting request for B rows: what a proposer may read (nothing of the engine)."""

    L: list[int]  # [B] committed tokens of each row (prompt included)
    w_max: list[int]  # [B] the most tokens row b may draft (0: none)
    policies: Sequence[Policy]  # [B] each row's policy, asked after every drafted token
    generators: Sequence[torch.Generator | None]  # [B]
    sampler: Sampler  # the decode settings' processed distributions and draws
    eos_ids: frozenset[int]  # tokens that end a generation: drafting stops after one
    # [B] row b's verifier states [len(layers), m, H] at the m positions its last verify committed (the last: the
    # position whose p gave the newest token), for a drafter that reads them (Plan.layers); None before the
    # row's first verify or when no layers are asked for
    states: Sequence[torch.Tensor | None] = ()
    # [B] the target's argmax at row b's look-only nodes of its last proposal (Lookahead's window), None without them
    looked: Sequence[list[int] | None] = ()
    # are the drafts' distributions q read (sampling, H(q) and d_JS, or a policy's keep_drafting)? False at
    # temperature 0 otherwise: a draft model's drafts are then argmax z, with no softmax, and proposed with q = None
    keep_q: bool = True


class DraftSource:
    """Proposes each row's drafts for one iteration (subclasses implement propose)."""

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        """Row b's proposal of at most d.w_max[b] nodes after buf[b, :L_b] [B][n_b]."""
        raise NotImplementedError

    def rollback(self, lengths: list[int], paths: list[list[int]]) -> None:
        """After the verify: row b keeps buf[b, :lengths[b]] plus its proposal's accepted path (lengths = L_b)."""

    def select(self, rows: list[int]) -> None:
        """Finished rows left the batch: keep the per-row state of `rows` (indices into the batch), in that order."""


def on(device: torch.device, t: torch.Tensor) -> torch.Tensor:
    """t on `device`, with no dispatch when it is there already (the draft and the target share a device except in
    split pairs)."""
    return t if t.device == device else t.to(device)


class Chain:
    """A chain under construction for one row: tokens, their q, and the policy's verdict after each."""

    def __init__(self, policy: Policy, last: int, eos_ids: frozenset[int], vocab: int) -> None:
        self.policy, self.last, self.eos_ids, self.vocab = policy, last, eos_ids, vocab
        self.fixed = fixed_window(policy)  # its keep_drafting is always True: it needs no q
        self.tokens: list[int] = []
        self.qs: list[torch.Tensor] = []
        self.why = "window" if last > 0 else "length"

    def take(self, x: int, q: torch.Tensor | None) -> bool:
        """Append draft x with distribution q [V] (None: one-hot); True if the row may draft another."""
        self.tokens.append(x)
        if q is not None:
            self.qs.append(q)
        # a policy that reads the tokens is asked for EOS too: confidence learns from it
        keep = self.fixed or self.policy.keep_drafting(len(self.tokens), self.one_hot(x) if q is None else q, x)
        if x in self.eos_ids:
            self.why = "eos"
        elif not keep:
            self.why = "policy"
        return x not in self.eos_ids and keep and len(self.tokens) < self.last

    def one_hot(self, x: int) -> torch.Tensor:
        """What a policy sees of a deterministic draft: q = one-hot(x) [V]."""
        q = torch.zeros(self.vocab)
        q[x] = 1.0
        return q

    def proposal(self, steps: int) -> Proposal:
        """The chain as a Proposal (q [w, V] stacked, or None for a deterministic one)."""
        q = torch.stack(self.qs) if self.qs else None
        return chain(self.tokens, q, self.why, steps)


class ModelDraft(DraftSource):
    """A draft model with its KV cache over the batch's rows (the pair's draft, or a model the method built)."""

    def __init__(self, state: ModelState, fixed_window: bool = False) -> None:
        self.state = state
        self.fixed_window = fixed_window  # the policy drafts its whole window whatever the tokens

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        """x_i drawn from q_i = q(. | buf[b, :L_b+i-1]) for every open row; the batch drafts to its longest window
        and a row that stopped feeds a masked hole (its draft cache keeps its tokens)."""
        draft = self.state
        if draft.on_device and self.fixed_window and d.w_max[0] > 0:
            return [self.propose_on_device(buf, d)]
        chains = [Chain(p, m, d.eos_ids, d.sampler.vocab_size) for p, m in zip(d.policies, d.w_max)]
        open_ = [b for b, m in enumerate(d.w_max) if m > 0]  # rows still drafting
        at = None if draft.mask is None else to_device([b * buf.shape[1] + L for b, L in enumerate(d.L)], torch.long,
                                                       buf.device)  # [B] flat buffer index of buf[b, L_b] (B > 1)
        fed = None  # one row: the draft its next forward is fed (not written to buf: the verify writes the chain)
        i = 0
        while open_:
            drafting = set(open_)
            upto = [L + i if b in drafting else draft.fed[b] for b, L in enumerate(d.L)]  # the others feed a hole
            z = draft.forward(buf, upto, 1, ids=fed)  # [B, 1, V_model]
            q = on(buf.device, d.sampler.probs(z[:, 0])) if d.keep_q else None  # [B, V]
            # [B, 1]; row b's next draft forward reads it at buf[b, L_b + i]
            x_t = d.sampler.pick(q, d.generators, open_)[:, None] if q is not None else on(buf.device, d.sampler.top(z))
            if draft.mask is None:
                fed = x_t
            elif len(open_) == len(d.L):
                assert at is not None  # several rows
                buf.view(-1).index_copy_(0, at + i, x_t[:, 0])
            x = [row[0] for row in x_t.tolist()]
            if len(open_) < len(d.L):
                write(buf, [(b, d.L[b] + i) for b in open_], [x[b] for b in open_])
            open_ = [b for b in open_ if chains[b].take(x[b], None if q is None else q[b])]
            i += 1
        return [c.proposal(i) for c in chains]

    def propose_on_device(self, buf: torch.Tensor, d: Drafting) -> Proposal:
        """The one row of a compiled state, its policy a fixed window: x_1..x_w drawn with no host synchronisation
        (x_i is written into buf on the device and fed from there) and read back once; drafts after a drafted
        EOS are dropped as the per-token loop would not have drafted them (their forwards are still counted)."""
        draft, L, w = self.state, d.L[0], d.w_max[0]
        qs = []
        for i in range(w):
            q = on(buf.device, d.sampler.probs(draft.forward(buf, L + i, 1)[:, 0]))  # [1, V]
            buf[0, L + i] = d.sampler.pick(q, d.generators[:1])[0]
            qs.append(q[0])
        c = Chain(d.policies[0], w, d.eos_ids, d.sampler.vocab_size)
        for i, x in enumerate(buf[0, L : L + w].tolist()):
            if not c.take(x, qs[i]):
                break
        return c.proposal(w)

    def rollback(self, lengths: list[int], paths: list[list[int]]) -> None:
        """The draft cache keeps at most the accepted chain (it never saw the last draft token nor the next one)."""
        self.state.crop([min(f, L + len(p)) for f, L, p in zip(self.state.fed, lengths, paths)])


def fixed_proposals(tokens: list[list[int]], d: Drafting, steps: int = 0) -> list[Proposal]:
    """Each row b's deterministic proposal (target ids, q = one-hot) up to d.w_max[b] tokens, its first EOS or its
    policy's stop; a proposal shorter than the window ends with why = source."""
    out = []
    for b, prop in enumerate(tokens):
        c = Chain(d.policies[b], min(d.w_max[b], len(prop)), d.eos_ids, d.sampler.vocab_size)
        if d.w_max[b] > 0:
            if len(prop) < d.w_max[b]:
                c.why = "source"
            for x in prop[: c.last]:
                if not c.take(x, None):
                    break
        out.append(c.proposal(steps))
    return out
