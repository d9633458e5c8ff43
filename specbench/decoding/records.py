"""What a decode produces, named at the lowest floor of the decode core so that every module can name it: one
draft-verify iteration's record (`IterationRecord`, docs/design.md section 3) and one generation call's outcome
(`Generation`), with the concatenation of a multi-turn example's generations."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class IterationRecord:
    """One draft-verify iteration (docs/design.md section 3)."""

    drafted: int  # w: the nodes verified (a chain's drafts; a tree's nodes)
    accepted: int  # n: the accepted path's length, exact and relaxed acceptances together
    stop: str  # why drafting ended: policy / window / eos / length / source (the draft source ran out) / none
    draft_s: float  # wall seconds of the draft phase
    verify_s: float  # wall seconds of the target forward
    draft_steps: int = 0  # draft forwards the row's batch ran this iteration (B = 1: drafted; B > 1: the longest window)
    draft_tokens: int = 0  # the tokens those forwards fed per row (their blocks' widths summed; a tree's nodes)
    verify_forward_s: float = 0.0  # seconds of the verifier's forwards in the iteration (the batch's)
    draft_forward_s: float = 0.0  # seconds of the other roles' (the drafter's) forwards in it
    host_s: float = 0.0  # the iteration's wall seconds outside every forward (sampling, acceptance, bookkeeping)
    look_nodes: int = 0  # look-only nodes the verify also fed per row (Lookahead's window), never accepted
    accepted_relaxed: int = 0  # of the n, accepted only by a relaxation (AdaSD's d_JS <= T_V); 0 for exact rules
    entropy: list[float] | None = None  # H(q_i) per drafted position, bits (when stats are on)
    js: list[float] | None = None  # d_JS(p_i, q_i) per drafted position (when stats are on)
    state: dict[str, float] = field(default_factory=dict)  # policy state after the update
    tree: dict[str, list[int]] | None = None  # a tree's tokens, parents and accepted path (when tracing)
    depth: int | None = None  # the proposal's deepest node (None: a chain, whose depth is `drafted`)


@dataclass
class Generation:
    """The outcome of one generation call."""

    token_ids: list[int]
    stop_reason: str  # eos / stop_string / length / context
    records: list[IterationRecord]
    decode_s: float  # this row's share of the decode wall time (B = 1: the wall time)
    first_block_s: float  # wall time from the first model call to the first committed block (1st iteration)
    target_model_s: float  # summed forward time of the pair's target model (this row's share)
    draft_model_s: float  # summed forward time of the model in the draft role (draft_only's generator included)
    target_calls: int  # forward calls of the target model (that this row took part in)
    draft_calls: int  # forward calls of the draft-role model (that this row took part in)
    text: str = ""
    latency_s: float = 0.0  # wall seconds from the batch's first model call to this row's stop (B = 1: decode_s)
    batch_rows: int = 1  # rows of the batch this generation was decoded in, when the batch started
    extra: dict = field(default_factory=dict)
    turn_stops: list[str] | None = None  # a multi-turn example's: why each turn ended (concat_generations)
    margins: list[float] = field(default_factory=list)  # the target's top-2 logit margin per token (decoding.margins)
    off_top1: list[int] = field(default_factory=list)  # positions whose token is not the target's top-1 there

    @property
    def stop_reasons(self) -> list[str]:
        """Why each turn ended [turns]: one entry for a single-turn generation."""
        return self.turn_stops or [self.stop_reason]


def concat_generations(gens: list[Generation], text: str) -> Generation:
    """One Generation for a multi-turn example: counts and times summed, records concatenated."""
    return Generation(
        token_ids=[t for g in gens for t in g.token_ids],
        stop_reason=gens[-1].stop_reason,
        records=[r for g in gens for r in g.records],
        decode_s=sum(g.decode_s for g in gens),
        first_block_s=gens[0].first_block_s,
        target_model_s=sum(g.target_model_s for g in gens),
        draft_model_s=sum(g.draft_model_s for g in gens),
        target_calls=sum(g.target_calls for g in gens),
        draft_calls=sum(g.draft_calls for g in gens),
        text=text,
        latency_s=sum(g.latency_s for g in gens),
        batch_rows=gens[0].batch_rows,
        turn_stops=[g.stop_reason for g in gens],
        margins=[m for g in gens for m in g.margins],
        off_top1=[sum(len(x.token_ids) for x in gens[:i]) + j for i, g in enumerate(gens) for j in g.off_top1],
    )
