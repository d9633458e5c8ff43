"""`hf_assisted`: transformers' own `generate(assistant_model=...)` (the AdaSD paper's "AssistedGen"), and its prompt
lookup, early exit and universal assisted generation (the references of `pld`, `layer_skip` and `uag`)."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel, StoppingCriteria, StoppingCriteriaList
from transformers.utils import is_sklearn_available

from specbench.decoding.engine import sync
from specbench.decoding.records import Generation
from specbench.common.options import OptionError, choice, real
from specbench.decoding.method import (METHODS, IterationRecord, Method, check_gamma, check_option, option_error,
                                       state_values)
from specbench.decoding.stopping import StopCriteria

log = logging.getLogger(__name__)

ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
SCHEDULES = ("constant", "heuristic", "heuristic_transient")


def leading_matches(a: list[int], b: list[int]) -> int:
    """Number of leading positions where a and b agree."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class Recorder(StoppingCriteria):
    """Rebuilds transformers' iterations from outside: forward hooks time and count the model calls, and
    this stopping criterion, which the assisted loop checks once after every iteration, closes each one.

    The target's one verify call per iteration is fed [uncached committed tokens, x_1..x_w], so
    w = cached + fed - committed and the candidates are the last w fed ids. The sequence handed to the
    stopping check then holds the committed tokens; accepted n = leading matches of the candidates with
    them (a correction never equals the rejected draft: argmax at T=0; at T>0 it is drawn from
    max(p - q, 0), which is 0 at a rejected draft). The models are only observed, never modified.
    """

    def __init__(self, stop: StopCriteria, prompt_len: int, max_new_tokens: int, room: int, gamma: int, schedule: str
                 ) -> None:
        self.stop_criteria, self.P, self.L = stop, prompt_len, prompt_len
        self.max_new_tokens, self.room = max_new_tokens, room  # the stop limits: new tokens, context - P
        self.max_len = prompt_len + min(max_new_tokens, room)  # transformers' max_length
        self.gamma, self.schedule = gamma, schedule  # mirror of num_assistant_tokens, for stop labels
        self.records: list[IterationRecord] = []
        self.seconds = {"target": 0.0, "draft": 0.0}
        self.calls = {"target": 0, "draft": 0}
        self.cand: list[int] = []
        self.out: list[int] = []  # the new tokens committed so far
        self.stop: tuple[str, int] | None = None  # (reason, new tokens kept) once the generation has ended
        self.t_start = self.t_iter = self.t_verify = self.t_verified = self.first_block_s = 0.0
        self.t_first: float | None = None  # the first model call, where the engine's clock for first_block_s starts
        self._t0 = 0.0
        self._which = "target"  # the role of the target's call under way (early exit drafts with the target)
        self.layers = 0  # the target's decoder layers

    def attach(self, target: PreTrainedModel, draft: PreTrainedModel | None) -> list[Any]:
        """Register the hooks on the target and the draft model (None: prompt lookup, or early exit, whose drafts
        are the target's own calls with fewer layers); returns their handles."""
        self.layers = target.config.get_text_config().num_hidden_layers
        hooks = [target.register_forward_pre_hook(self._target_pre, with_kwargs=True),
                 target.register_forward_hook(lambda m, *_: self._post(self._which, m.device))]
        if draft is not None:
            hooks += [draft.register_forward_pre_hook(lambda *_: self._pre()),
                      draft.register_forward_hook(lambda m, *_: self._post("draft", m.device))]
        return hooks

    def start(self) -> None:
        """Mark the start of the generate call."""
        self.t_start = time.perf_counter()

    def _pre(self) -> None:
        self._t0 = time.perf_counter()
        if self.t_first is None:  # generate()'s set-up is over: the first iteration starts here, as the engine's
            self.t_first = self.t_iter = self._t0

    def _post(self, which: str, device: torch.device) -> None:
        sync(device)
        t = time.perf_counter()
        self.seconds[which] += t - self._t0
        self.calls[which] += 1
        if which == "target":
            self.t_verified = t

    def _target_pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        # transformers' early exit drafts with the target itself while its config has fewer layers
        self._which = "draft" if module.config.get_text_config().num_hidden_layers < self.layers else "target"
        if self._which == "draft":
            self._pre()
            return
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        cache = kwargs.get("cache")  # transformers >= 5.24 names the forward's cache `cache` (was past_key_values)
        if cache is None:  # cached = 0 would give w = fed - L <= 0 after the prefill: no candidates, silently
            raise RuntimeError("hf_assisted: transformers' assisted loop called the target without a `cache` "
                               "keyword argument; this transformers version is not supported (need >= 5.24)")
        cached = cache.get_seq_length()
        w = cached + ids.shape[1] - self.L  # fed tokens past the committed prefix = candidates
        self.cand = ids[0, ids.shape[1] - w:].tolist() if w > 0 else []
        self._pre()
        self.t_verify = self._t0

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        """End of one iteration: record it; True once the block holds a stop (specbench.decoding.stopping, as the engine)."""
        eos, cand = self.stop_criteria.eos_ids, self.cand
        new = input_ids[0, self.L:].tolist()  # committed this iteration (cut after EOS by transformers)
        w = len(cand)
        if w == 0:
            why = "length"
        elif cand[-1] in eos:
            why = "eos"
        elif w < min(self.gamma, self.max_len - self.L - 1):  # transformers' cap: max_length - cur_len - 1
            why = "policy"  # the confidence stop (a stop on the window's last token reads as "window")
        else:
            why = "window"
        if self.schedule != "constant":  # transformers' heuristic, with its n_matches = len(valid) - 1
            self.gamma = self.gamma + 2 if len(new) - 1 == w else max(1, self.gamma - 1)
        self.records.append(IterationRecord(
            drafted=w, accepted=leading_matches(cand, new), stop=why, draft_s=self.t_verify - self.t_iter,
            verify_s=self.t_verified - self.t_verify, state={"gamma": self.gamma}))
        self.L += len(new)
        self.out += new
        if self.stop is None:
            reason, k = self.stop_criteria.first_stop(self.out, len(self.out) - len(new), self.max_new_tokens,
                                                      self.room)
            self.stop = (reason, k) if reason else None
        if len(self.records) == 1:
            assert self.t_first is not None  # set by the iteration's first model call (_pre)
            self.first_block_s = time.perf_counter() - self.t_first
        self.t_iter = time.perf_counter()
        # transformers annotates the result as torch.BoolTensor, a legacy type no tensor op returns
        return torch.full((input_ids.shape[0],), self.stop is not None, dtype=torch.bool,  # type: ignore[return-value]
                          device=input_ids.device)


@METHODS.register("hf_assisted")
class HFAssisted(Method):
    """transformers' assisted generation run as is, observed through hooks (AdaSD's "AssistedGen").

    Settings: the three assistant keys of the draft's generation_config, with transformers' defaults
    num_assistant_tokens=20 (option `gamma`), num_assistant_tokens_schedule="constant" ("heuristic",
    "heuristic_transient"), assistant_confidence_threshold=0.4 (0 disables the confidence stop and its
    ROC update; the update runs only when scikit-learn is installed, a dependency here).
    Persistence: transformers reads these from `draft.generation_config` at every call and, with the
    "heuristic" schedule, writes the final num_assistant_tokens back to it (5.24 fits the confidence
    threshold on a per-call copy, so the threshold itself does not carry over despite its docs).
    `persist: false` (default) starts every example from the configured values;
    `true` carries whatever transformers left in the config into the next example, as one long-lived
    assistant model would (each row saves it, carried_state, so a resumed run continues from it). Either
    way the shared draft's config is restored after each call.
    Everything about the pair comes from the binding (Method.bind): the two models, the decode settings,
    the EOS ids, the vocabulary range and the context.
    Decoding: greedy (do_sample=False) at temperature 0, else do_sample with the bound temperature,
    top_k (0 = off) and top_p (1.0 = off); repetition_penalty=1 and no_repeat_ngram_size=0 are pinned
    so a checkpoint's generation_config cannot add processors the engine does not apply. After every
    iteration the engine's StopCriteria (specbench.decoding.stopping), handed to generate_external, checks
    the block token by token, ends the call at the first stop and drops the tokens after it; the context
    cap is the bound context. Logit rows beyond the tokenizer's range (embedding
    padding) are suppressed (`suppress_tokens`, `suppress_padding: true`) so neither model can pick a
    padding id, as the engine's sampler cuts them.
    Seeding: transformers draws from torch's global RNG; each call reseeds it, inside
    torch.random.fork_rng (the caller's global state is restored), from one draw of the engine's
    generator. Runs are reproducible per example seed, but the random stream differs from the engine's,
    so sampled tokens are not those of native methods. At T>0 transformers verifies with speculative
    sampling (Leviathan et al.), so rows carry lossless: true.
    Records (see Recorder): drafted (transformers' candidate_length), accepted, stop (eos; policy = fewer
    than both the window and the length cap, i.e. the confidence stop; window; length), draft_s (iteration
    start to the verify call, transformers' drafting overhead included), verify_s (the target forward),
    state gamma (num_assistant_tokens after the iteration); a confidence stop on the window's last token
    reads as "window", and no per-position entropy / JS is recorded. pad_token_id is set to an EOS id
    (see generate_kwargs). The first iteration starts at the first model call, so first_block_s (to the
    first committed block) spans what the engine's does, without generate()'s set-up; decode_s spans the
    whole generate() call.
    Draft sources (transformers' candidate generators): the pair's draft model (default);
    `prompt_lookup_num_tokens` (+ `max_matching_ngram_size`, default 2): prompt lookup, no draft model;
    `assistant_early_exit`: the target's first layers draft (its generation_config then holds the assistant
    settings); on a pair with `cross_tokenizer: true` both tokenizers are passed, so transformers runs universal
    assisted generation (greedy: re-tokenized candidates; sampled: Universal Speculative Decoding). In the
    early-exit case the target's own calls with fewer layers are counted as draft calls.
    Refused: different vocab sizes of the two models on a pair not marked cross_tokenizer (transformers then
    needs both tokenizers).
    """

    name = "hf_assisted"
    external = True

    cross_tokenizer = True  # a draft of another tokenizer: transformers' universal assisted generation

    def __init__(self, gamma: int = 20, num_assistant_tokens_schedule: str = "constant",
                 assistant_confidence_threshold: float = 0.4, persist: bool = False,
                 suppress_padding: bool = True, prompt_lookup_num_tokens: int | None = None,
                 max_matching_ngram_size: int | None = None, assistant_early_exit: int | None = None,
                 **options) -> None:
        super().__init__(**options)
        if self.rule_spec != "rejection":
            raise option_error(self.name, f"method.parts.rule: transformers' assisted generation accepts drafts by its "
                                          f"own rejection sampling; got {self.rule_spec!r}")
        if prompt_lookup_num_tokens is not None and assistant_early_exit is not None:
            raise option_error(self.name, "method.prompt_lookup_num_tokens and method.assistant_early_exit choose two "
                                          "different draft sources; set at most one of them (the other null)")
        if max_matching_ngram_size is not None and prompt_lookup_num_tokens is None:
            raise option_error(self.name, "method.max_matching_ngram_size applies to prompt lookup only; set "
                                          "method.prompt_lookup_num_tokens too (or "
                                          "method.max_matching_ngram_size=null)")
        self.lookup = {} if prompt_lookup_num_tokens is None else {
            "prompt_lookup_num_tokens": check_gamma(self.name, prompt_lookup_num_tokens, "prompt_lookup_num_tokens"),
            "max_matching_ngram_size": check_gamma(self.name, max_matching_ngram_size or 2, "max_matching_ngram_size")}
        self.early_exit = None if assistant_early_exit is None else check_gamma(self.name, assistant_early_exit,
                                                                                "assistant_early_exit")
        self.with_draft_model = not self.lookup and self.early_exit is None  # else: no draft model
        check_option(self.name, choice, num_assistant_tokens_schedule, "num_assistant_tokens_schedule",
                     choices=SCHEDULES)
        self.settings = {"num_assistant_tokens": check_gamma(self.name, gamma),
                         "num_assistant_tokens_schedule": num_assistant_tokens_schedule,
                         "assistant_confidence_threshold": check_option(self.name, real, assistant_confidence_threshold,
                                                                        "assistant_confidence_threshold", low=0,
                                                                        high=1)}
        self.persist = bool(persist)
        self.suppress_padding = bool(suppress_padding)
        self.carried: dict[str, Any] | None = None  # what transformers left in the draft's config
        if assistant_confidence_threshold and not is_sklearn_available():
            log.warning("scikit-learn is not installed: transformers will not update the confidence threshold")

    @property
    def lossless(self) -> bool:
        return True  # greedy matching at T=0, speculative sampling at T>0

    def carried_state(self) -> dict[str, Any] | None:
        return dict(self.carried or self.settings) if self.persist else None

    @property
    def pair_draft(self) -> bool:
        """transformers' assistant is the pair's draft model (not prompt lookup, not an early exit)."""
        return self.with_draft_model

    def check_batch(self, batch_size: int) -> None:
        """transformers' assisted generation decodes one sequence at a time: batch_size must be 1."""
        from specbench.common.options import OptionError

        if batch_size > 1:
            raise OptionError(f"method 'hf_assisted' runs transformers' assisted generation, which supports batch "
                              f"size 1 only (got batch_size={batch_size}); set batch_size=1, or use method=vanilla "
                              "or heuristic, which run batched in specbench's engine")

    def restore_state(self, state: dict[str, Any]) -> None:
        self.carried = dict(zip(ASSISTANT_KEYS, state_values(self.name, state, ASSISTANT_KEYS)))

    def generate_external(self, prompt_ids: list[int], max_new_tokens: int, stop: StopCriteria,
                          generator: torch.Generator | None, trace: bool) -> Generation:
        """One transformers assisted generation on the bound pair, returned as the engine's Generation."""
        target, draft = transformers_model(self.verifier_model), self.assistant()
        if not isinstance(target, GenerationMixin):
            raise OptionError(f"method 'hf_assisted': the target {type(target).__name__} has no generate()")
        cross = self.bound.pair is not None and self.pair_draft and self.bound.pair.draft_tokenizer is not None
        if draft is not None and draft is not target and not cross:
            check_vocab_sizes(target, draft)
        P = len(prompt_ids)
        ctx = self.bound.context_length or (P + max_new_tokens + 1)
        if P >= ctx:
            raise ValueError(f"prompt of {P} tokens does not fit the model context of {ctx} tokens")
        max_new = min(max_new_tokens, ctx - P)  # the engine stops at the context too
        settings = self.carried if self.persist and self.carried is not None else self.settings
        gamma = self.lookup.get("prompt_lookup_num_tokens", settings["num_assistant_tokens"])
        rec = Recorder(stop, P, max_new_tokens, ctx - P, int(gamma),
                       "constant" if self.lookup else settings["num_assistant_tokens_schedule"])
        x = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
        kwargs = self.generate_kwargs(target, max_new) | self.source_kwargs(draft, cross)
        gc = (draft or target).generation_config  # the assistant's settings (early exit: the target's own)
        saved = {k: getattr(gc, k) for k in ASSISTANT_KEYS}
        hooks = rec.attach(target, None if draft is target else draft)
        try:
            for k, v in settings.items():
                setattr(gc, k, v)
            with torch.random.fork_rng(devices=[target.device] if target.device.type == "cuda" else [],
                                       enabled=generator is not None):
                if generator is not None:
                    torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator, device=generator.device)))
                sync(target.device)
                rec.start()
                out = target.generate(x, attention_mask=torch.ones_like(x),
                                      stopping_criteria=StoppingCriteriaList([rec]), **kwargs)
                sync(target.device)
                decode_s = time.perf_counter() - rec.t_start
        finally:
            self.carried = {k: getattr(gc, k) for k in ASSISTANT_KEYS}
            for k, v in saved.items():
                setattr(gc, k, v)
            for h in hooks:
                h.remove()
        return self.finish(out[0, P:].tolist(), rec, decode_s)

    def assistant(self) -> PreTrainedModel | None:
        """The model that drafts in transformers' loop: the pair's draft, the target itself (early exit) or none
        (prompt lookup)."""
        if self.lookup:
            return None
        model = self.verifier_model if self.early_exit is not None else self.draft_model
        return transformers_model(model) if model is not None else None

    def source_kwargs(self, draft: PreTrainedModel | None, cross: bool) -> dict[str, Any]:
        """generate() keyword arguments that choose transformers' draft source: prompt lookup, early exit, an
        assistant model, and with a draft of another tokenizer both tokenizers (universal assisted generation)."""
        if self.lookup:
            return dict(self.lookup)
        if self.early_exit is not None:
            return {"assistant_early_exit": self.early_exit}
        kw: dict[str, Any] = {"assistant_model": draft}
        if cross:
            pair = self.bound.pair
            assert pair is not None  # cross: the bound pair's draft has its own tokenizer
            kw |= {"tokenizer": self.bound.tokenizer, "assistant_tokenizer": pair.draft_tokenizer}
        return kw

    def generate_kwargs(self, target: PreTrainedModel, max_new: int) -> dict[str, Any]:
        """generate() keyword arguments for the bound decode settings, EOS ids and vocabulary range."""
        sp, vocab = self.bound.params, self.bound.vocab_size
        eos = sorted(self.bound.eos_ids)
        # pad = an EOS id: the drafter's inner generate() gets no attention mask, infers one from the pad id
        # (utils.py, _prepare_attention_mask_for_generation) and would mask any generated token equal to it;
        # transformers skips that inference when the pad id is an EOS id
        kw: dict[str, Any] = {"max_new_tokens": max_new, "eos_token_id": eos or None,
                              "pad_token_id": eos[0] if eos else None,
                              "do_sample": not sp.greedy, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                              "use_cache": True}
        if not sp.greedy:
            kw.update(temperature=sp.temperature, top_k=sp.top_k or 0, top_p=sp.top_p if sp.top_p is not None else 1.0)
        v_model = target.config.get_text_config().vocab_size
        if self.suppress_padding and vocab < v_model:
            kw["suppress_tokens"] = list(range(vocab, v_model))
        return kw

    def finish(self, out: list[int], rec: Recorder, decode_s: float) -> Generation:
        """Stop reason, tokens cut after the stop and text, by the engine's StopCriteria."""
        stop = rec.stop_criteria
        reason, k = rec.stop or stop.first_stop(out, 0, rec.max_new_tokens, rec.room)
        if not reason:
            raise RuntimeError(f"hf_assisted: transformers stopped after {len(out)} tokens with no stop condition")
        out = out[:k]
        return Generation(token_ids=out, stop_reason=reason, records=rec.records, decode_s=decode_s,
                          first_block_s=rec.first_block_s, target_model_s=rec.seconds["target"],
                          draft_model_s=rec.seconds["draft"], target_calls=rec.calls["target"],
                          draft_calls=rec.calls["draft"], text=stop.text(out, reason),
                          extra={"assistant_settings_after": dict(self.carried or {})})


def transformers_model(model: torch.nn.Module) -> PreTrainedModel:
    """A bound model as the transformers model whose generate() runs (the pair's models are)."""
    if not isinstance(model, PreTrainedModel):
        raise OptionError(f"method 'hf_assisted' runs transformers' generate(), which a {type(model).__name__} does "
                          "not have: it needs the pair's transformers models")
    return model


def check_vocab_sizes(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    """Raise unless both models declare the same vocab_size (transformers' condition for this algorithm)."""
    v_t = target.config.get_text_config().vocab_size
    v_d = draft.config.get_text_config().vocab_size
    if v_t != v_d:
        raise OptionError(
            f"hf_assisted: the target has vocab_size {v_t} and the draft {v_d}; transformers' assisted "
            "generation treats different sizes as different tokenizers (universal assisted decoding, another "
            "algorithm) and refuses them without tokenizer/assistant_tokenizer. Use a pair whose models have "
            "equal vocab_size (e.g. pair.target.vocab_size=259 pair.draft.vocab_size=259 for tiny_random)."
        )
