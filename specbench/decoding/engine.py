"""The one speculative decoding loop every method runs through (design.md section 3). Batch size 1.

State: a token buffer buf [1, P + max_new_tokens + 1] whose first L entries are committed, and one
KV cache per model that covers buf[:cache_len]. One iteration, one named step each:
  1. draft: x_1..x_w with x_i drawn from q_i = q(. | buf[:L+i-1]), asking the method's policy after each token;
  2. verify: one target forward over buf[target_len : L+w] gives p_1..p_{w+1} (the first iteration's
     forward is also the prompt prefill, as in transformers' assisted generation);
  3. accept: the method's rule gives n accepted drafts and the next token buf[L+n]; L <- L + n + 1
     (a relaxed rule also says how many of the n only its relaxation accepted);
  4. roll back: both caches are cropped to the accepted prefix buf[:L+n];
  5. update: the method's policy is updated with the iteration record;
  6. stop: the block's tokens are checked one by one as an autoregressive decoder would check them
     (specbench.decoding.stopping: EOS, stop string, length, context); tokens after the first that ends it are dropped.
`ar` and `draft_only` are the same loop with w = 0: one forward, one token per iteration, so
every method's tokens are produced and counted by the same code. Model calls and seconds are
counted per pair role: draft_only's calls are draft calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from specbench.decoding.acceptance import JSRelaxed, Rule
from specbench.decoding.method import IterationRecord, Method
from specbench.decoding.sampling import Sampler, entropy_bits, js_distance
from specbench.decoding.stopping import StopCriteria


def sync(device: torch.device) -> None:
    """Wait for queued kernels so wall-clock timers measure finished work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ModelState:
    """A model plus its KV cache, which holds the first `length` tokens of the buffer."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = model.device
        self.cache = DynamicCache(config=model.config)
        self.length = 0
        self.seconds = 0.0  # summed wall time of forward calls
        self.calls = 0
        self.hidden: torch.Tensor | None = None  # [len(layers), keep, H] of the last forward given layers

    @torch.inference_mode()
    def forward(self, buf: torch.Tensor, upto: int, keep: int, layers: tuple[int, ...] = ()) -> torch.Tensor:
        """Feed buf[:, length:upto]; return logits [keep, V_model] of the last `keep` positions.

        With `layers` (hidden_states indices: k = output of decoder layer k), the same forward also
        keeps those hidden states of the last `keep` positions in self.hidden [len(layers), keep, H].
        """
        t0 = time.perf_counter()
        ids = buf[:, self.length : upto].to(self.device)  # no-op unless the models sit on different devices
        extra = {"output_hidden_states": True} if layers else {}
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep, **extra)
        if layers:
            self.hidden = torch.stack([out.hidden_states[k][0, -keep:] for k in layers])
        sync(self.device)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.length = upto
        return out.logits[0, -keep:]

    def crop(self, length: int) -> None:
        """Roll the cache back to its first `length` tokens.

        transformers 5.x `Cache.crop(k)` takes k <= 0 = minus the number of tokens to remove
        (a positive k raises); tests/test_engine.py pins this against a fresh forward.
        """
        if length < self.length:
            self.cache.crop(length - self.length)
            self.length = length


@dataclass
class Generation:
    """The outcome of one generation call."""

    token_ids: list[int]
    stop_reason: str  # eos / stop_string / length / context
    records: list[IterationRecord]
    decode_s: float
    first_block_s: float  # wall time from the first model call to the first committed block (1st iteration)
    target_model_s: float  # summed forward time of the pair's target model
    draft_model_s: float  # summed forward time of the model in the draft role (draft_only's generator included)
    target_calls: int  # forward calls of the target model
    draft_calls: int  # forward calls of the draft-role model
    text: str = ""
    latency_s: float = 0.0  # wall seconds from the batch's first model call to this row's stop (B = 1: decode_s)
    batch_rows: int = 1  # rows of the batch this generation was decoded in, when the batch started
    extra: dict = field(default_factory=dict)
    turn_stops: list[str] | None = None  # a multi-turn example's: why each turn ended (concat_generations)

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
        turn_stops=[g.stop_reason for g in gens],
    )


class Engine:
    """Runs one bound method (Method.bind) on the models of its binding, one example at a time."""

    def __init__(self, method: Method, stop_strings: tuple[str, ...] = ()) -> None:
        b = method.bound
        self.method = method
        self.sampler = Sampler(b.params, b.vocab_size)
        self.stop = StopCriteria(frozenset(b.eos_ids), b.tokenizer, tuple(stop_strings))
        self.context_length = b.context_length
        self.device = method.verifier_model.device

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       generators: list[torch.Generator | None] | None = None, trace: bool = False) -> list[Generation]:
        """Decode the prompts [B][P_b] together; one Generation per row (PROVISIONAL: rows one after another)."""
        gens = generators or [None] * len(prompts)
        out = [self.generate(p, max_new_tokens, g, trace) for p, g in zip(prompts, gens)]
        t = 0.0
        for g in out:
            t += g.decode_s
            g.latency_s, g.batch_rows = t, len(prompts)
        return out

    def generate(self, prompt_ids: list[int], max_new_tokens: int, generator: torch.Generator | None = None,
                 trace: bool = False) -> Generation:
        """Decode up to max_new_tokens new tokens after prompt_ids [P] with the engine's method."""
        method = self.method
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if method.external:  # a method that decodes with another library's loop (hf_assisted)
            return method.generate_external(prompt_ids, max_new_tokens, self.stop, generator, trace)
        P = len(prompt_ids)
        ctx = self.context_length or (P + max_new_tokens + 1)
        if P >= ctx:
            raise ValueError(f"prompt of {P} tokens does not fit the model context of {ctx} tokens")
        stats = trace or method.needs_stats
        layers = tuple(method.hidden_layers)  # verifier states the method steers with (sd2); usually none
        states = {role: ModelState(model) for role, model in method.bound.models.items()}  # by pair role
        target = states[method.verifier]  # the model that verifies: draft_only's is the draft
        draft = states["draft"] if method.uses_draft else None
        buf = torch.zeros((1, P + max_new_tokens + 1), dtype=torch.long, device=self.device)
        buf[0, :P] = torch.tensor(prompt_ids, dtype=torch.long)
        L, stop_reason, records, first_block_s = P, "", [], 0.0
        out: list[int] = []  # buf[0, P:L] as a list, for the stop checks
        method.reset()
        sync(self.device)
        t_start = time.perf_counter()
        while not stop_reason:
            # 1. draft at most min(window, tokens left - 1, context left - 1) tokens
            w_max = min(method.window(), P + max_new_tokens - L - 1, ctx - L - 1) if draft else 0
            t0 = time.perf_counter()
            qs, why = self.draft(draft, buf, L, w_max, generator) if draft else ([], "none")
            w = len(qs)
            t1 = time.perf_counter()
            # 2. verify: p_1..p_{w+1} in one target forward
            p = self.sampler.probs(target.forward(buf, L + w, w + 1, layers))  # [w+1, V]
            t2 = time.perf_counter()
            # 3. accept x_1..x_n and the next token buf[L+n]
            q = torch.stack(qs) if qs else p.new_zeros((0, p.shape[-1]))  # [w, V]
            n, relaxed = self.accept(buf, L, q, p, generator)
            if layers:  # states at the last accepted position buf[L+n-1], whose p_{n+1} gave buf[L+n]
                method.observe_hidden(target.hidden[:, n])  # [len(layers), H]
            out += buf[0, L : L + n + 1].tolist()
            # 4. roll back: the caches keep the accepted prefix buf[:L+n]
            roll_back(target, draft, L + n)
            L += n + 1
            # 5. record the iteration and update the policy
            rec = IterationRecord(drafted=w, accepted=n, stop=why, draft_s=t1 - t0, verify_s=t2 - t1,
                                  accepted_relaxed=relaxed)
            if stats and w:
                rec.entropy, rec.js = self.statistics(q, p, method.rule)
            method.update(rec)
            rec.state = method.state()
            records.append(rec)
            # 6. stop where an autoregressive decoder would: the first of the block's tokens that ends it
            stop_reason, k = self.stop.first_stop(out, len(out) - n - 1, max_new_tokens, ctx - P)
            del out[k:]  # the block's tokens after the stop
            if len(records) == 1:
                sync(self.device)
                first_block_s = time.perf_counter() - t_start
        sync(self.device)
        decode_s = time.perf_counter() - t_start
        t, d = states.get("target"), states.get("draft")
        return Generation(
            token_ids=out,
            stop_reason=stop_reason,
            records=records,
            decode_s=decode_s,
            first_block_s=first_block_s,
            target_model_s=t.seconds if t else 0.0,
            draft_model_s=d.seconds if d else 0.0,
            target_calls=t.calls if t else 0,
            draft_calls=d.calls if d else 0,
            text=self.stop.text(out, stop_reason),
        )

    def draft(self, draft: ModelState, buf: torch.Tensor, L: int, w_max: int, generator: torch.Generator | None
              ) -> tuple[list[torch.Tensor], str]:
        """Step 1: x_i drawn from q_i = q(. | buf[:L+i-1]) into buf[L+i-1], for i = 1..w_max until an EOS or the
        method's stop; returns q_1..q_w (each [V]) and why drafting ended (window / eos / policy / length)."""
        if w_max <= 0:
            return [], "length"
        qs: list[torch.Tensor] = []
        for i in range(w_max):
            q_i = self.sampler.probs(draft.forward(buf, L + i, 1))[0].to(self.device)  # [V]
            x_i = int(self.sampler.pick(q_i[None], generator)[0])
            buf[0, L + i] = x_i
            qs.append(q_i)
            keep = self.method.keep_drafting(i + 1, q_i, x_i)  # asked for EOS too: confidence learns from it
            if x_i in self.stop.eos_ids:
                return qs, "eos"
            if not keep:
                return qs, "policy"
        return qs, "window"

    def accept(self, buf: torch.Tensor, L: int, q: torch.Tensor, p: torch.Tensor,
               generator: torch.Generator | None) -> tuple[int, int]:
        """Step 3: n = the longest prefix of the drafts x = buf[L:L+w] the rule accepts (q [w, V], p [w+1, V]),
        and how many of them only a relaxation accepted; the rule's next token (correction, or bonus when
        n = w) goes to buf[L+n]."""
        ok, fallback = self.method.rule(buf[0, L : L + q.shape[0]], q, p, generator)
        n, relaxed = self.method.rule.count(ok)
        buf[0, L + n] = fallback[n]
        return n, relaxed

    @staticmethod
    def statistics(q: torch.Tensor, p: torch.Tensor, rule: Rule) -> tuple[list[float], list[float]]:
        """H(q_i) and d_JS(p_i, q_i) of the w drafted positions (q [w, V], p [w+1, V]); a JS-relaxed rule has
        just computed the distances."""
        js = rule.js if isinstance(rule, JSRelaxed) else js_distance(p[: q.shape[0]], q)
        return entropy_bits(q).tolist(), js.tolist()


def roll_back(target: ModelState, draft: ModelState | None, length: int) -> None:
    """Step 4: both caches keep at most the accepted prefix buf[:length] (the draft's may be shorter)."""
    target.crop(length)
    if draft:
        draft.crop(min(draft.length, length))
