"""The one speculative decoding loop every native method runs through (docs/design.md, "The engine"), for B >= 1
rows at once; `hf_assisted`, whose loop is transformers', has its own decoder (specbench.decoding.decoders).

State: a token buffer buf [B, max P_b + max_new_tokens + 1], row b's committed tokens in buf[b, :L_b] (prompt
first, no padding: a token's buffer index is its position), and one KV cache per model. One iteration, each row
with its own L_b, window, policy and generator:
  1. draft: the proposer (specbench.decoding.drafts) returns each row's Proposal: n_b nodes x_j with parents a(j)
     and draft distributions q_j (a chain: a(j) = j - 1, x_j ~ q_j = q(. | buf[b, :L_b+j]); deterministic: q_j
     one-hot), at most min(window, tokens left - 1, context left - 1), the policy asked after each token;
  2. verify: one target forward over the row's uncached tokens and its nodes gives p at the root and at every node
     (the first is also the prompt prefill, as in transformers' assisted generation). A chain is fed causally; a
     tree with tree attention, node j attending to the row's prefix and its ancestors at position
     L_b - 1 + depth(j) (specbench.decoding.tree_state). The plan says which: the verify is chosen once;
  3. accept: the rule, called once for the batch, gives each row's accepted root path (n nodes) and next token,
     written to buf[b, L_b:L_b+n+1]; L_b <- L_b + n + 1;
  4. roll back: both caches keep buf[b, :L_b] plus the accepted path (a chain: a crop; a tree: the others removed);
  5. update: the row's policy gets its iteration record;
  6. stop: the block's tokens are checked one by one as an autoregressive decoder would (specbench.decoding.stopping:
     EOS, stop string, length, context); tokens after the first that ends it are dropped.
`ar` and `draft_only` are this loop with empty proposals, one token per forward, so every method's tokens are
produced and counted by the same code; calls and seconds are counted per pair role (draft_only's: draft calls).

Batches (B > 1). A model's KV cache is one rectangular tensor whose columns the rows share: a row's tokens occupy
some, the others are holes masked by a 2-D attention mask [B, columns], and position ids give each token its buffer
index, so a row attends to exactly its own tokens at their own positions, as alone. A forward feeds each row's
uncached tokens right-aligned in a block of the widest row's width (holes on the left, which left-pads prompts of
different lengths); the last columns hold every row's newest tokens, whose logits are kept. Roll-back masks a row's
rejected columns and crops from the end the columns no row uses; with one row it is always a crop and no mask is
built. A finished row leaves at once (`Cache.batch_select_indices` on caches, masks and buffer); the batch is not
refilled. The batch drafts to the longest window still open; a row that stopped drafting (window, policy, EOS or
length) feeds a masked hole in the remaining draft forwards, a cost its record's `draft_steps` (the batch's draft
forwards) beside `drafted` shows. Trees likewise: each row's nodes right-aligned under a 4-D mask of its own, its
rejected nodes left as holes (the compiled path: one row). Each row owns its policy (a copy: state, thresholds)
and generator, so under greedy decoding its schedule and tokens are those it gets at B = 1 (up to the float
rounding of batched kernels). Observers keep what an iteration measured in the row's Log (record, margins, time).
Each iteration's wall time and each forward's seconds are split equally among its rows: a row's decode_s is its
share, a batch's shares sum to its wall time; latency_s runs from the batch's start to the row's stop.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specbench.common.options import OptionError
from specbench.decoding.compiled import StaticState
from specbench.decoding.drafts import DraftSource, Drafting
from specbench.decoding.margins import block_margins, committed_columns, host_tops, top2
from specbench.decoding.acceptance import Greedy, make_rule
from specbench.decoding.method import Method
from specbench.decoding.policy import Policy, fixed_window
from specbench.decoding.records import Generation, IterationRecord
from specbench.decoding.proposal import Proposal, Verdict, chain
from specbench.decoding.sampling import Sampler, entropy_bits, js_distance
from specbench.decoding import verifiers
from specbench.decoding.head_drafts import DraftHead
from specbench.decoding.state import Clock, Counted, ModelState, causal_lm, model_state, sync
from specbench.decoding.stopping import StopCriteria
from specbench.decoding.tree_drafts import MAX_NODES
from specbench.decoding.tree_state import TreeState


@dataclass
class Log:
    """What the observers of a row's iterations keep: its records, time shares, calls and the target's margins."""

    records: list[IterationRecord] = field(default_factory=list)
    decode_s: float = 0.0  # share of the wall time
    latency_s: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)  # role -> forward seconds (share)
    calls: dict[str, int] = field(default_factory=dict)  # role -> forward calls taken part in
    margins: list[float] = field(default_factory=list)  # per token of out: the target's top-2 margin there
    off_top1: list[int] = field(default_factory=list)  # offsets in out of tokens not the target's top-1 there


@dataclass
class Row:
    """One example's generation inside a batch: what propose, verify, accept and commit need, and its log."""

    index: int  # its prompt's place in the batch
    policy: Policy
    generator: torch.Generator | None
    P: int  # prompt tokens
    ctx: int  # the context limit of this row
    L: int  # committed tokens in buf (prompt included)
    out: list[int] = field(default_factory=list)  # buf[b, P:L] as a list, for the stop checks
    stop_reason: str = ""
    states: torch.Tensor | None = None  # verifier states at the positions the last verify committed, for the drafter
    looked: list[int] | None = None  # the target's argmax at the last proposal's look-only nodes, for the drafter
    log: Log = field(default_factory=Log)


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
    margins: list[tuple[list[float], list[int]]]  # [B] the block's top-2 margins [n_b + 1], offsets off the top-1
    trace: bool


def keep_margins(r: Row, it: Iteration, b: int, rec: IterationRecord, kept: int) -> None:
    """Observer: the target's top-2 margins at the first `kept` tokens of row b's block, and those not its top-1."""
    m, off = it.margins[b]
    start = len(r.log.margins)  # one margin per token of r.out before the block
    r.log.margins += m[:kept]
    r.log.off_top1 += [start + i for i in off if i < kept]


def split_time(rows: list[Row], wall: float, forwards: dict[str, float], verifier: str) -> None:
    """Split an iteration's wall seconds (the batch's) in each row's record: verifier forwards, other roles' forwards
    and host work outside every forward, which a cost profile lacks (specbench.runs.projection keeps it as measured)."""
    verify = forwards.get(verifier, 0.0)
    draft = sum(s for role, s in forwards.items() if role != verifier)
    for r in rows:
        rec = r.log.records[-1]
        rec.verify_forward_s, rec.draft_forward_s, rec.host_s = verify, draft, wall - verify - draft


class Engine:
    """Runs one bound method (Method.bind) on the models of its binding, on one example or a batch of them."""

    def __init__(self, method: Method, stop_strings: tuple[str, ...] = (), compile: bool = False) -> None:
        b = method.bound
        self.compile = compile  # the compiled decode path (specbench.decoding.compiled), B = 1, chains and trees
        method.plan.refuse(method.name, compile=compile)
        self.method, self.plan = method, method.plan
        self.rule = make_rule(method.plan.rule, greedy=b.params.greedy)  # called once per iteration for the batch
        self.sampler = Sampler(b.params, b.vocab_size)
        self.stop = StopCriteria(frozenset(b.eos_ids), b.tokenizer, tuple(stop_strings))
        self.context_length = b.context_length
        self.device = causal_lm(b.models[method.plan.verifier]).device

    def generate(self, prompt_ids: list[int], max_new_tokens: int, generator: torch.Generator | None = None,
                 trace: bool = False) -> Generation:
        """Decode up to max_new_tokens new tokens after prompt_ids [P] with the engine's method."""
        return self.generate_batch([prompt_ids], max_new_tokens, [generator], trace)[0]

    @torch.inference_mode()  # no autograd bookkeeping in the loop's host-side tensor ops
    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       generators: list[torch.Generator | None] | None = None, trace: bool = False) -> list[Generation]:
        """Decode up to max_new_tokens new tokens after each prompt [B][P_b] together; one Generation per row."""
        method, plan, B = self.method, self.plan, len(prompts)
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if B == 0:
            return []
        plan.refuse(method.name, B)
        rows = self.new_rows(prompts, max_new_tokens, generators or [None] * B)
        stats = trace or plan.stats
        layers = plan.layers  # verifier states the drafter reads (a head, sd2); usually none
        need = max(r.P for r in rows) + max_new_tokens + 1  # buffer columns, the most a cache may hold
        states = {role: self.new_state(model, B, need, role, plan.trees)  # by pair role
                  for role, model in method.bound.models.items()}
        target = model_state(states[plan.verifier])  # the model that verifies: draft_only's is the draft
        verify = verifiers.for_parts(plan.trees)  # how proposals are fed and kept: chains or trees
        source = method.draft_source(states)  # what proposes the drafts (None: no drafting)
        drafter = states.get("draft") if source is not None and plan.verifier != "draft" else None
        buf = torch.zeros((B, need), dtype=torch.long, device=self.device)
        for b, p in enumerate(prompts):
            buf[b, : len(p)] = torch.tensor(p, dtype=torch.long)
        for r in rows:
            r.policy.reset()
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
            props = self.propose(source, buf, rows, max_new_tokens, stats)
            t1 = clock.mark()
            if drafter is not None:  # the tokens each row's draft forwards fed this iteration
                drafts_fed = [a - b for a, b in zip(drafter.row_tokens, drafts_fed)]
            # 2. verify: row b's p at the root and at each of its n_b nodes, the last n_b + 1 kept columns
            fed = list(target.fed) if layers else []  # the target's cached tokens of each row before the verify
            logits, hidden = verify.feed(target, buf, [r.L for r in rows], props, layers)  # [B, keep, V_model]
            if plan.looks:  # look-only nodes off: [1, keep', V_model]
                logits, props = self.look_back(logits, rows[0], props[0])
            tops = top2(logits, self.sampler.vocab_size)  # [B, keep, 3] on the device; host copy after commit
            # [B, keep, V]; none when only argmax p is read (the greedy rule, no statistics): argmax p = argmax z
            p_all = self.sampler.probs(logits) if stats or type(self.rule) is not Greedy else None
            keep = logits.shape[1]
            t2 = clock.mark()
            # 3. accept: one call of the rule for the batch; row b's accepted path and the next token
            if p_all is None:  # the host copy of the margins' argmax decides
                host = host_tops(tops, logits, self.sampler.vocab_size)
                verdicts = Greedy.accept_top(props, [[int(c[2]) for c in row] for row in host])
            else:
                host = None
                verdicts = self.rule.accept(props, p_all, [r.generator for r in rows],
                                            [r.policy.relaxation() or 0.0 for r in rows])
            if hidden is not None:  # the states of `layers`: the drafter's next request carries them
                for r, states_b in zip(rows, self.committed_states(hidden, rows, props, verdicts, fed)):
                    r.states = states_b
            # 4. commit the path and the next token; the caches keep each row's prefix plus its accepted path
            blocks = self.commit(buf, rows, props, verdicts, verify, target, source)
            cols = [committed_columns(keep, prop, v) for prop, v in zip(props, verdicts)]
            margins = block_margins(host or tops.tolist(), logits, cols, blocks)
            # 5. record the iteration and update each row's policy; 6. stop where an autoregressive decoder would
            iteration = Iteration(props, verdicts, blocks, drafts_fed, clock.seconds(t_iter, t1), clock.seconds(t1, t2),
                                  p_all if stats else None, keep, margins, trace)
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
        """Steps 5 and 6 for row b: commit its block, update its policy, cut the block after the first stop an
        autoregressive decoder would make; the observers keep what was measured of the tokens kept."""
        v, start = it.verdicts[b], len(r.out)
        r.out += it.blocks[b]
        r.L += v.accepted + 1
        rec = self.iteration_record(it, b)
        rec.look_nodes = len(r.looked or [])  # look_back set them this iteration (None: it fed none)
        r.policy.update(rec)
        r.stop_reason, k = self.stop.first_stop(r.out, start, max_new_tokens, r.ctx - r.P)
        del r.out[k:]  # the block's tokens after the stop
        for observe in (self.keep_record, keep_margins):
            observe(r, it, b, rec, k - start)

    def iteration_record(self, it: Iteration, b: int) -> IterationRecord:
        """Row b's IterationRecord, with H(q) and d_JS when asked and the tree when tracing."""
        prop, v = it.props[b], it.verdicts[b]
        rec = IterationRecord(drafted=len(prop), accepted=v.accepted, stop=prop.why, draft_s=it.draft_s,
                              verify_s=it.verify_s, accepted_relaxed=v.relaxed, draft_steps=prop.steps,
                              draft_tokens=it.drafts_fed[b])
        if it.p_all is not None and len(prop):
            rec.entropy, rec.js = self.statistics(prop, it.p_all[b, it.keep - len(prop) - 1 :], v)
        if not prop.is_chain:
            rec.depth = max(prop.depths())
        if it.trace and len(prop):  # a chain is the tree whose node j has parent j - 1
            rec.tree = {"tokens": prop.tokens, "parents": prop.parents, "path": v.path}
        return rec

    def keep_record(self, r: Row, it: Iteration, b: int, rec: IterationRecord, kept: int) -> None:
        """Observer: the record, with the state the policy (or a tree shape) logs after its update."""
        rec.state = self.method.logged_state(r.policy)
        r.log.records.append(rec)

    def share_time(self, rows: list[Row], states: dict[str, Counted], forward_before: dict[str, float], wall: float
                   ) -> None:
        """After an iteration of `wall` seconds: settle the forwards' seconds, split them into each row's record
        (split_time) and add each row's share of the wall time to its decode_s."""
        for s in states.values():
            s.settle()
        split_time(rows, wall, {role: s.seconds - forward_before[role] for role, s in states.items()},
                   self.plan.verifier)
        for r in rows:
            r.log.decode_s += wall / len(rows)

    def propose(self, source: DraftSource | None, buf: torch.Tensor, rows: list[Row], max_new_tokens: int,
                stats: bool) -> list[Proposal]:
        """Step 1: each row's proposal of at most w_max_b = min(budget, tokens left - 1, context left - 1) nodes
        (budget: Method.budget), empty without a source; the request carries the rows' last verifier states and
        whether the drafts' q are read (sampling, `stats`, or a policy that stops on them)."""
        if source is None:
            return [chain([]) for _ in rows]
        w_max = [min(self.method.budget(r.policy), r.P + max_new_tokens - r.L - 1, r.ctx - r.L - 1) for r in rows]
        keep_q = stats or not self.sampler.params.greedy or not all(fixed_window(r.policy) for r in rows)
        return source.propose(buf, Drafting([r.L for r in rows], w_max, [r.policy for r in rows],
                                            [r.generator for r in rows], self.sampler, self.stop.eos_ids,
                                            [r.states for r in rows], [r.looked for r in rows], keep_q))

    def look_back(self, logits: torch.Tensor, row: Row, prop: Proposal) -> tuple[torch.Tensor, list[Proposal]]:
        """The one row's look-only nodes (Plan.looks): the target's argmax there goes to the row for the drafter's
        next request; returns logits [1, keep, V] and the proposal without them, the rule's candidates."""
        if not prop.look:
            row.looked = None
            return logits, [prop]
        row.looked = logits[0, -prop.look :, : self.sampler.vocab_size].argmax(-1).tolist()
        return logits[:, : -prop.look], [prop.candidates()]

    @staticmethod
    def committed_states(hidden: torch.Tensor, rows: list[Row], props: list[Proposal], verdicts: list[Verdict],
                         fed: list[int]) -> list[torch.Tensor]:
        """Each row's verifier states [len(layers), m, H] at the m positions committed now whose states the verify
        computed: the uncached tokens buf[b, fed_b:L_b], then the accepted nodes (the last gave the next token).
        hidden [len(layers), B, W, H]: the block fed, row b's nodes in its last n_b columns (a tree's in node order)."""
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
        """Step 4: each row's block [n_b + 1] (returned) in buf[b, L_b:L_b+n+1] (the verify writes what it did not
        feed from there); the target's cache and the source keep buf[b, :L_b] plus the path."""
        L = [r.L for r in rows]
        blocks = [[prop.tokens[j] for j in v.path] + [v.token] for prop, v in zip(props, verdicts)]
        verify.keep(target, buf, L, verdicts, blocks)  # the block's tokens not in buf yet go there
        if source is not None:
            source.rollback(L, [v.path for v in verdicts])
        return blocks

    def new_state(self, model: torch.nn.Module, B: int, need: int, role: str, trees: bool) -> Counted:
        """One model's state over B rows: a StaticState when compiling (room for `need` tokens), a head's own
        HeadState, a TreeState when trees are fed, else a ModelState."""
        if self.compile:
            if not isinstance(model, PreTrainedModel):
                raise OptionError(f"engine.compile=true compiles transformers models; the {role} model is a "
                                  f"{type(model).__name__}: set engine.compile=false")
            return StaticState(model, B, need + (MAX_NODES if trees else 0), role)  # room for the nodes grown
        if isinstance(model, DraftHead):  # a head in the draft role keeps its own kind of state
            return model.new_state(B)
        lm = causal_lm(model)
        return TreeState(lm, B) if trees else ModelState(lm, B)

    def new_rows(self, prompts: list[list[int]], max_new_tokens: int, generators: list[torch.Generator | None]
                 ) -> list[Row]:
        """One Row per prompt [B][P_b], its policy the method's at B = 1, else a copy; a prompt too long fails."""
        rows = []
        for i, (p, g) in enumerate(zip(prompts, generators)):
            policy = self.method.policy if len(prompts) == 1 else copy.copy(self.method.policy)
            row = Row(i, policy, g, len(p),
                      self.context_length or (len(p) + max_new_tokens + 1), len(p))
            if row.P >= row.ctx:
                raise ValueError(f"prompt {i} of {row.P} tokens does not fit the model context of {row.ctx} tokens")
            rows.append(row)
        return rows

    @staticmethod
    def leave(rows: list[Row], buf: torch.Tensor, states: dict[str, Counted], source: DraftSource | None,
              done: list[Row], elapsed: float) -> tuple[list[Row], torch.Tensor]:
        """Finished rows, their latency, forward shares and calls kept, go to `done`; the states, the source and the
        buffer keep the live rows, returned with their buffer."""
        live = [b for b, r in enumerate(rows) if not r.stop_reason]
        if len(live) == len(rows):
            return rows, buf
        for b, r in enumerate(rows):
            if r.stop_reason:
                r.log.latency_s = elapsed
                for role, s in states.items():
                    r.log.seconds[role], r.log.calls[role] = s.shares[b], s.row_calls[b]
                done.append(r)
        if live:
            for s in states.values():
                s.select(live)
            if source is not None:
                source.select(live)
        return [rows[b] for b in live], buf[live]

    def result(self, r: Row, first_block_s: float, B: int) -> Generation:
        """The Generation of a finished row."""
        log = r.log
        return Generation(token_ids=r.out, stop_reason=r.stop_reason, records=log.records, decode_s=log.decode_s,
                          first_block_s=first_block_s, target_model_s=log.seconds.get("target", 0.0),
                          draft_model_s=log.seconds.get("draft", 0.0), target_calls=log.calls.get("target", 0),
                          draft_calls=log.calls.get("draft", 0), text=self.stop.text(r.out, r.stop_reason),
                          latency_s=log.latency_s, batch_rows=B, margins=log.margins, off_top1=log.off_top1)

    @staticmethod
    def statistics(prop: Proposal, p: torch.Tensor, v: Verdict) -> tuple[list[float], list[float]]:
        """H(q_j) and d_JS(p_a(j), q_j) of the n nodes (p [n+1, V], root first); a relaxed rule gave the distances."""
        q = prop.q_rows(p.shape[-1], p.device)  # [n, V]
        at_parents = p[: len(prop)] if prop.is_chain else p[[a + 1 for a in prop.parents]]  # [n, V]
        js = v.js if v.js is not None else js_distance(at_parents, q)
        return entropy_bits(q).tolist(), js.tolist()
