"""The one speculative decoding loop every native method runs through (docs/design.md, "The engine"), for B >= 1
rows at once; `hf_assisted`, whose loop is transformers', has its own decoder beside it (specbench.decoding.decoders).

State: a token buffer buf [B, max P_b + max_new_tokens + 1] whose row b holds its committed tokens in
buf[b, :L_b] (the prompt first, no padding: a token's buffer index is its position), and one KV cache per
model. One iteration, one named step each, every row with its own L_b, window, policy and generator:
  1. draft: the method's proposer (specbench.decoding.drafts) returns each row's Proposal
     (specbench.decoding.proposal): n_b nodes x_j with parents a(j) and draft distributions q_j (a chain: a(j) =
     j - 1, x_j drawn from q_j = q(. | buf[b, :L_b+j]); a deterministic proposal: q_j one-hot), at most
     min(window, tokens left - 1, context left - 1) of them, the row's policy asked after each token;
  2. verify: one target forward over the row's uncached tokens and its nodes gives p at the root and at every
     node (the first iteration's forward is also the prompt prefill, as in transformers' assisted generation).
     A chain is fed causally from the buffer; a tree (one row) with tree attention: node j attends to the prefix
     and its own ancestors at position L_b - 1 + depth(j) (specbench.decoding.tree_state). Which of the two a
     method's proposals are is known from its parts: the verify (specbench.decoding.verifiers) is chosen once;
  3. accept: the method's rule, called once for the batch, gives each row's accepted root path (n nodes) and
     the next token; the path and the token go to buf[b, L_b:L_b+n+1]; L_b <- L_b + n + 1;
  4. roll back: both caches keep the row's prefix buf[b, :L_b] plus its accepted path (a chain: a crop; a tree:
     the other nodes' keys and values removed);
  5. update: the row's policy is updated with its iteration record;
  6. stop: the block's tokens are checked one by one as an autoregressive decoder would check them
     (specbench.decoding.stopping: EOS, stop string, length, context); tokens after the first that ends it are dropped.
`ar` and `draft_only` are the same loop with empty proposals: one forward, one token per iteration, so
every method's tokens are produced and counted by the same code. Model calls and seconds are
counted per pair role: draft_only's calls are draft calls.

Batches (B > 1). The KV cache is one rectangular tensor per model whose columns all rows share; a row's
tokens occupy some of the columns and the others are holes, masked out by a 2-D attention mask [B, columns],
while position ids give every token its own row position (its buffer index), so a row attends to exactly its
own tokens at their own positions, as alone. A forward feeds each row its uncached tokens right-aligned in a
block of the widest row's width (shorter rows padded on the left of the block with masked holes): prompts of
different lengths are left-padded this way, and the last columns hold every row's newest tokens, whose logits
are kept. Roll-back masks a row's rejected columns (they become holes) and crops the columns no row uses any
more from the end; with one row every roll-back is such a crop and no mask is built, which is the B = 1 loop
as it was. A row whose generation stopped leaves the batch at once: the caches, masks and buffer keep the
other rows (`Cache.batch_select_indices`), so a finished row costs nothing more; the batch is not refilled.
Drafting when rows want different lengths: the batch drafts to the longest window still open; a row that has
stopped drafting (window, policy, EOS or length) feeds a masked hole in the remaining draft forwards. Its
record's `draft_steps` (the batch's draft forwards that iteration) next to its own `drafted` shows that cost.
Trees are verified one row at a time (batch_size 1, eager path); a batch or the compiled path refuses them.
Every row owns its method instance (Method.fork: policy state, thresholds) and its random generator,
so under greedy decoding each row's schedule and tokens are the ones it gets at B = 1 (up to the float
rounding of batched kernels). Time is shared: each iteration's wall time and each forward's seconds are split
equally among the rows in it, so a row's decode_s is its share and the shares of a batch sum to its wall
time; latency_s is the wall time from the batch's start to the row's stop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specbench.common.options import OptionError
from specbench.decoding.compiled import StaticState
from specbench.decoding.drafts import DraftSource, Drafting
from specbench.decoding.margins import chosen_values, committed, committed_columns, to_host, top2_values
from specbench.decoding.method import Method
from specbench.decoding.records import Generation, IterationRecord, concat_generations  # noqa: F401 - re-exported
from specbench.decoding.proposal import Proposal, Verdict, chain
from specbench.decoding.sampling import Sampler, entropy_bits, js_distance
from specbench.decoding import verifiers
from specbench.decoding.head_drafts import DraftHead
from specbench.decoding.state import Clock, Counted, ModelState, causal_lm, model_state, sync, write
from specbench.decoding.stopping import StopCriteria
from specbench.decoding.tree_state import TreeState


@dataclass
class Row:
    """One example's generation inside a batch: its method instance, generator, limits and progress."""

    index: int  # its prompt's place in the batch
    method: Method
    generator: torch.Generator | None
    P: int  # prompt tokens
    ctx: int  # the context limit of this row
    L: int  # committed tokens in buf (prompt included)
    out: list[int] = field(default_factory=list)  # buf[b, P:L] as a list, for the stop checks
    records: list[IterationRecord] = field(default_factory=list)
    stop_reason: str = ""
    decode_s: float = 0.0  # share of the wall time
    latency_s: float = 0.0
    seconds: dict = field(default_factory=dict)  # role -> forward seconds (share)
    calls: dict = field(default_factory=dict)  # role -> forward calls taken part in
    states: torch.Tensor | None = None  # the verifier's states at the positions the last verify committed, for the drafter
    looked: list[int] | None = None  # the target's argmax at the last proposal's look-only nodes, for the drafter
    margins: list[float] = field(default_factory=list)  # per token of out: the target's top-2 margin there
    off_top1: list[int] = field(default_factory=list)  # offsets in out of tokens not the target's top-1 there


@dataclass
class Iteration:
    """What one iteration decided for the batch's B rows, for the records (Engine.record)."""

    props: list[Proposal]  # [B]
    verdicts: list[Verdict]  # [B]
    blocks: list[list[int]]  # [B][n_b + 1] the committed tokens
    drafts_fed: list[int]  # [B] tokens each row's draft forwards fed
    draft_s: float
    verify_s: float
    p_all: torch.Tensor | None  # [B, keep, V] when H(q) and d_JS are computed
    keep: int
    margin: list[list[float]]  # [B][keep] the target's top-2 margins
    top: list[list[float]]  # [B][keep] its top-1 logits
    chosen: list[list[float]]  # [B][n_b + 1] the committed tokens' logits
    cols: list[list[int]]  # [B][n_b + 1] the columns that chose them
    trace: bool


def split_time(rows: list[Row], wall: float, forwards: dict[str, float], verifier: str) -> None:
    """Split an iteration's wall seconds (the batch's) in each row's record: the verifier's forwards, the other
    roles' (the drafter's) and the rest, host work outside every forward (sampling, acceptance, bookkeeping), which
    a cost profile of forwards does not hold (specbench.runs.projection keeps it as measured)."""
    verify = forwards.get(verifier, 0.0)
    draft = sum(s for role, s in forwards.items() if role != verifier)
    for r in rows:
        rec = r.records[-1]
        rec.verify_forward_s, rec.draft_forward_s, rec.host_s = verify, draft, wall - verify - draft


class Engine:
    """Runs one bound method (Method.bind) on the models of its binding, on one example or a batch of them."""

    def __init__(self, method: Method, stop_strings: tuple[str, ...] = (), compile: bool = False) -> None:
        b = method.bound
        self.compile = compile  # the compiled decode path (specbench.decoding.compiled), B = 1
        if compile:
            method.check_compile()
        self.method = method
        self.sampler = Sampler(b.params, b.vocab_size)
        self.stop = StopCriteria(frozenset(b.eos_ids), b.tokenizer, tuple(stop_strings))
        self.context_length = b.context_length
        self.device = causal_lm(method.verifier_model).device

    def generate(self, prompt_ids: list[int], max_new_tokens: int, generator: torch.Generator | None = None,
                 trace: bool = False) -> Generation:
        """Decode up to max_new_tokens new tokens after prompt_ids [P] with the engine's method."""
        return self.generate_batch([prompt_ids], max_new_tokens, [generator], trace)[0]

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       generators: list[torch.Generator | None] | None = None, trace: bool = False) -> list[Generation]:
        """Decode up to max_new_tokens new tokens after each prompt [B][P_b] together; one Generation per row."""
        method, B = self.method, len(prompts)
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if B == 0:
            return []
        method.check_batch(B)
        rows = self.new_rows(prompts, max_new_tokens, generators or [None] * B)
        stats = trace or method.needs_stats
        layers = tuple(method.hidden_layers)  # verifier states the drafter reads (a head, sd2); usually none
        need = max(r.P for r in rows) + max_new_tokens + 1  # buffer columns, the most a cache may hold
        states = {role: self.new_state(model, B, need, role, method.parts.trees)  # by pair role
                  for role, model in method.bound.models.items()}
        target = model_state(states[method.verifier])  # the model that verifies: draft_only's is the draft
        verify = verifiers.for_parts(method.parts.trees)  # how proposals are fed and kept: chains or trees
        source = method.draft_source(states)  # what proposes the drafts (None: no drafting)
        drafter = states.get("draft") if source is not None and method.verifier != "draft" else None
        buf = torch.zeros((B, need), dtype=torch.long, device=self.device)
        for b, p in enumerate(prompts):
            buf[b, : len(p)] = torch.tensor(p, dtype=torch.long)
        for r in rows:
            r.method.reset()
        done: list[Row] = []
        first_block_s = 0.0
        sync(self.device)
        t_start = t_prev = time.perf_counter()  # t_prev: the end of the previous iteration
        clock = Clock(self.device, events=self.compile)  # phase marks: CUDA events on the compiled path
        while rows:
            t_iter = clock.mark()
            forward_before = {role: s.seconds for role, s in states.items()}  # settled at the previous iteration's end
            drafts_fed = list(drafter.row_tokens) if drafter is not None else [0] * len(rows)
            # 1. draft: row b proposes at most min(window, tokens left - 1, context left - 1) nodes
            props = self.propose(source, buf, rows, max_new_tokens)
            t1 = clock.mark()
            if drafter is not None:  # the tokens each row's draft forwards fed this iteration
                drafts_fed = [a - b for a, b in zip(drafter.row_tokens, drafts_fed)]
            # 2. verify: row b's p at the root and at each of its n_b nodes, the last n_b + 1 kept columns
            fed = list(target.fed) if layers else []  # the target's cached tokens of each row before the verify
            logits = verify.feed(target, buf, [r.L for r in rows], props, layers)  # [B, keep, V_model]
            logits, props = self.look_back(logits, rows, props)  # look-only nodes off: [B, keep', V_model]
            p_all = self.sampler.probs(logits)  # [B, keep, V]
            vals = top2_values(logits, self.sampler.vocab_size)  # [B, keep, 2] on the device; host copy after commit
            keep = p_all.shape[1]
            t2 = clock.mark()
            # 3. accept: one call of the rule for the batch; row b's accepted path and the next token
            verdicts = method.rule.accept(props, p_all, [r.generator for r in rows],
                                          [r.method.relaxation() for r in rows])
            if layers:  # the drafter's next request carries them
                assert target.hidden is not None  # the verify kept the states of `layers`
                for r, states_b in zip(rows, self.committed_states(target.hidden, rows, props, verdicts, fed)):
                    r.states = states_b
            # 4. commit the path and the next token; the caches keep each row's prefix plus its accepted path
            blocks = self.commit(buf, rows, props, verdicts, verify, target, source)
            cols = [committed_columns(keep, prop, v) for prop, v in zip(props, verdicts)]
            margin, top, chosen = to_host(vals, chosen_values(logits, cols, blocks), cols)  # one copy: [B][keep] x2, [B][n_b + 1]
            # 5. record the iteration and update each row's policy; 6. stop where an autoregressive decoder would
            iteration = Iteration(props, verdicts, blocks, drafts_fed, clock.seconds(t_iter, t1), clock.seconds(t1, t2),
                                  p_all if stats else None, keep, margin, top, chosen, cols, trace)
            for b, r in enumerate(rows):
                self.record(r, b, iteration, max_new_tokens)
            sync(self.device)
            now = time.perf_counter()
            self.share_time(rows, states, forward_before, now - t_prev)
            first_block_s = first_block_s or now - t_start
            t_prev = now
            rows, buf = self.leave(rows, buf, states, source, done, now - t_start)
        return [self.result(r, first_block_s, B) for r in sorted(done, key=lambda r: r.index)]

    def record(self, r: Row, b: int, it: Iteration, max_new_tokens: int) -> None:
        """Steps 5 and 6 for row b: its block committed to r.out with its margins, the iteration's record (the
        statistics H(q), d_JS when asked, the tree when tracing), its policy updated, then the stop an autoregressive
        decoder would make: the block's tokens after the first that ends the generation are dropped."""
        prop, v, block = it.props[b], it.verdicts[b], it.blocks[b]
        n = v.accepted
        m, off = committed(it.margin[b], it.top[b], it.cols[b], it.chosen[b])
        r.margins += m
        r.off_top1 += [len(r.out) + i for i in off]
        r.out += block
        r.L += n + 1
        rec = IterationRecord(drafted=len(prop), accepted=n, stop=prop.why, draft_s=it.draft_s, verify_s=it.verify_s,
                              accepted_relaxed=v.relaxed, draft_steps=prop.steps, draft_tokens=it.drafts_fed[b])
        if it.p_all is not None and len(prop):
            rec.entropy, rec.js = self.statistics(prop, it.p_all[b, it.keep - len(prop) - 1 :], v)
        if not prop.is_chain:
            rec.depth = max(prop.depths())
        if it.trace and len(prop):  # a chain is the tree whose node j has parent j - 1
            rec.tree = {"tokens": prop.tokens, "parents": prop.parents, "path": v.path}
        r.method.update(rec)
        rec.state = r.method.state()
        r.records.append(rec)
        r.stop_reason, k = self.stop.first_stop(r.out, len(r.out) - n - 1, max_new_tokens, r.ctx - r.P)
        del r.out[k:], r.margins[k:]  # the block's tokens after the stop
        r.off_top1 = [i for i in r.off_top1 if i < k]

    def share_time(self, rows: list[Row], states: dict[str, Counted], forward_before: dict[str, float], wall: float
                   ) -> None:
        """After an iteration of `wall` seconds: each state's forward seconds settled and split in each row's record
        (split_time), and each row's decode_s its share of the wall time (the shares of all iterations sum to the
        batch's wall time)."""
        for s in states.values():
            s.settle()
        split_time(rows, wall, {role: s.seconds - forward_before[role] for role, s in states.items()},
                   self.method.verifier)
        for r in rows:
            r.decode_s += wall / len(rows)

    def propose(self, source: DraftSource | None, buf: torch.Tensor, rows: list[Row], max_new_tokens: int
                ) -> list[Proposal]:
        """Step 1: each row's proposal from the source, at most w_max_b = min(budget, tokens left - 1, context
        left - 1) nodes (budget: the policy's window for a chain, the shape's nodes for a tree); empty proposals
        without a source. The request carries each row's verifier states from its last verify (a drafter that reads
        them: a head, SD²'s steering)."""
        if source is None:
            return [chain([]) for _ in rows]
        w_max = [min(r.method.budget(), r.P + max_new_tokens - r.L - 1, r.ctx - r.L - 1) for r in rows]
        return source.propose(buf, Drafting([r.L for r in rows], w_max, [r.method for r in rows],
                                            [r.generator for r in rows], self.sampler, self.stop.eos_ids,
                                            [r.states for r in rows], [r.looked for r in rows]))

    def look_back(self, logits: torch.Tensor, rows: list[Row], props: list[Proposal]
                  ) -> tuple[torch.Tensor, list[Proposal]]:
        """A proposal with look-only nodes (one row: a tree) gives the target's argmax there to its row, for the drafter's
        next request, and leaves the rule its candidates: logits [B, keep, V] without those last columns, and the
        proposals without those nodes."""
        for r in rows:
            r.looked = None
        look = props[0].look if len(props) == 1 else 0
        if not look:
            return logits, props
        rows[0].looked = logits[0, -look:, : self.sampler.vocab_size].argmax(-1).tolist()
        return logits[:, :-look], [props[0].candidates()]

    @staticmethod
    def committed_states(hidden: torch.Tensor, rows: list[Row], props: list[Proposal], verdicts: list[Verdict],
                         fed: list[int]) -> list[torch.Tensor]:
        """Each row's verifier states [len(layers), m, H] at the m positions this iteration committed whose states the
        verify computed: the uncached committed tokens buf[b, fed_b:L_b] then the accepted path's nodes; the last is
        the position whose p gave the next token. hidden [len(layers), B, W, H]: the block fed, row b's last n_b
        columns its nodes (right-aligned; a tree's in proposal order)."""
        W, out = hidden.shape[2], []
        for b, (r, prop, v) in enumerate(zip(rows, props, verdicts)):
            n = len(prop)
            cols = list(range(W - n - (r.L - fed[b]), W - n)) + [W - n + j for j in v.path]
            out.append(hidden[:, b, cols])
        return out

    @staticmethod
    def commit(buf: torch.Tensor, rows: list[Row], props: list[Proposal], verdicts: list[Verdict],
               verify: verifiers.ChainVerify | verifiers.TreeVerify, target: ModelState, source: DraftSource | None
               ) -> list[list[int]]:
        """Step 4: row b's accepted path and next token (its block [n_b + 1], returned) go to buf[b, L_b:L_b+n+1] in
        one write; the target's cache keeps buf[b, :L_b] plus the path (`verify.keep`), the source's likewise."""
        L = [r.L for r in rows]
        blocks = [[prop.tokens[j] for j in v.path] + [v.token] for prop, v in zip(props, verdicts)]
        write(buf, [(b, L[b] + i) for b, block in enumerate(blocks) for i in range(len(block))],
              [t for block in blocks for t in block])
        verify.keep(target, L, verdicts)
        if source is not None:
            source.rollback(L, [v.path for v in verdicts])
        return blocks

    def new_state(self, model: torch.nn.Module, B: int, need: int, role: str, trees: bool) -> Counted:
        """The state of one model over B rows: a static cache and compiled forwards when compiling (B = 1, room for
        `need` tokens); a head in the draft role makes its own (HeadState); a model that verifies or grows trees a
        TreeState (one row); else a dynamic cache over B rows."""
        if self.compile:
            if not isinstance(model, PreTrainedModel):
                raise OptionError(f"engine.compile=true compiles transformers models; the {role} model is a "
                                  f"{type(model).__name__}: set engine.compile=false")
            return StaticState(model, B, need, role)
        if isinstance(model, DraftHead):  # a head in the draft role keeps its own kind of state
            return model.new_state(B)
        lm = causal_lm(model)
        return TreeState(lm) if trees else ModelState(lm, B)

    def new_rows(self, prompts: list[list[int]], max_new_tokens: int, generators: list[torch.Generator | None]
                 ) -> list[Row]:
        """One Row per prompt [B][P_b]: its method instance (the engine's own at B = 1, else a fork), generator,
        context limit and committed length; a prompt that does not fit its context fails here."""
        rows = []
        for i, (p, g) in enumerate(zip(prompts, generators)):
            row = Row(i, self.method if len(prompts) == 1 else self.method.fork(), g, len(p),
                      self.context_length or (len(p) + max_new_tokens + 1), len(p))
            if row.P >= row.ctx:
                raise ValueError(f"prompt {i} of {row.P} tokens does not fit the model context of {row.ctx} tokens")
            rows.append(row)
        return rows

    @staticmethod
    def leave(rows: list[Row], buf: torch.Tensor, states: dict[str, Counted], source: DraftSource | None,
              done: list[Row], elapsed: float) -> tuple[list[Row], torch.Tensor]:
        """Finished rows leave the batch: their latency, forward-time shares and calls are kept and they go to
        `done`; the caches, masks, the source's per-row state and the buffer keep the live rows. Returns the live
        rows and their buffer."""
        live = [b for b, r in enumerate(rows) if not r.stop_reason]
        if len(live) == len(rows):
            return rows, buf
        for b, r in enumerate(rows):
            if r.stop_reason:
                r.latency_s = elapsed
                for role, s in states.items():
                    r.seconds[role], r.calls[role] = s.shares[b], s.row_calls[b]
                done.append(r)
        if live:
            for s in states.values():
                s.select(live)
            if source is not None:
                source.select(live)
        return [rows[b] for b in live], buf[live]

    def result(self, r: Row, first_block_s: float, B: int) -> Generation:
        """The Generation of a finished row."""
        return Generation(
            token_ids=r.out,
            stop_reason=r.stop_reason,
            records=r.records,
            decode_s=r.decode_s,
            first_block_s=first_block_s,
            target_model_s=r.seconds.get("target", 0.0),
            draft_model_s=r.seconds.get("draft", 0.0),
            target_calls=r.calls.get("target", 0),
            draft_calls=r.calls.get("draft", 0),
            text=self.stop.text(r.out, r.stop_reason),
            latency_s=r.latency_s,
            batch_rows=B,
            margins=r.margins,
            off_top1=r.off_top1,
        )

    @staticmethod
    def statistics(prop: Proposal, p: torch.Tensor, v: Verdict) -> tuple[list[float], list[float]]:
        """H(q_j) and d_JS(p_a(j), q_j) of the n drafted nodes (p [n+1, V]: root first; a chain's a(j) = j - 1);
        a relaxed rule has just computed the distances."""
        q = prop.q_rows(p.shape[-1], p.device)  # [n, V]
        at_parents = p[: len(prop)] if prop.is_chain else p[[a + 1 for a in prop.parents]]  # [n, V]
        js = v.js if v.js is not None else js_distance(at_parents, q)
        return entropy_bits(q).tolist(), js.tolist()
