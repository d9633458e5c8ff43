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
from specbench.decoding.binding import Binding
from specbench.decoding.method import LOOPS
from specbench.decoding.policy import check_gamma, state_values
from specbench.decoding.records import IterationRecord
from specbench.decoding.parts import Needs
from specbench.decoding.stopping import StopCriteria

log = logging.getLogger(__name__)

ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
SCHEDULES = ("constant", "heuristic", "heuristic_transient")


def leading_matches(a: list[int], b: list[int]) -> int:
    """Number of leading positions where a and b agree."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class Recorder(StoppingCriteria):
    """Rebuilds transformers' iterations from outside, never modifying the models: forward hooks time and count the
    calls; this stopping criterion, checked once after every iteration, closes each one. The target's verify is fed
    [uncached committed tokens, x_1..x_w], so w = cached + fed - committed, the candidates its last w ids; accepted
    n = leading matches of the candidates with the committed tokens the stopping check gets (a correction never equals
    the rejected draft: argmax at T=0; at T>0 a draw from max(p - q, 0), which is 0 at a rejected draft)."""

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
        """Hook the target and the draft (None: prompt lookup, or early exit's calls of the target); the handles."""
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
        """End of one iteration: record it; True once the block holds a stop (the engine's StopCriteria)."""
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


@LOOPS.register("hf_assisted")
class HFAssisted:
    """transformers' assisted generation run as is on the bound pair, observed through hooks (AdaSD's "AssistedGen").

    Settings: the draft generation_config's three assistant keys, transformers' defaults num_assistant_tokens=20
    (option `gamma`), num_assistant_tokens_schedule="constant" ("heuristic", "heuristic_transient"),
    assistant_confidence_threshold=0.4 (0 disables the confidence stop and its ROC update, which needs
    scikit-learn, a dependency here). transformers reads them from the config at every call and, with "heuristic",
    writes the final num_assistant_tokens back (5.24 fits the threshold on a per-call copy: despite its docs it does
    not carry over). `persist: false` (default) starts every example from the configured values; `true` carries
    what transformers left into the next example, as one long-lived assistant would (rows save it, `carried`, so a
    resumed run continues). Either way the shared draft's config is restored after each call.
    Decoding: do_sample=False at temperature 0, else the bound temperature, top_k (0 = off), top_p (1.0 = off);
    repetition_penalty=1 and no_repeat_ngram_size=0 are pinned so a checkpoint's generation_config adds no processor
    the engine lacks. The engine's StopCriteria, handed to generate, checks each block token by token, ends the call
    at the first stop and drops the tokens after it; the context cap is the bound context. Logits beyond the
    tokenizer's range (embedding padding) are suppressed (`suppress_padding: true`), as the engine's sampler cuts them.
    Seeding: transformers draws from torch's global RNG, reseeded per call inside torch.random.fork_rng (the caller's
    state restored) from one draw of the engine's generator: reproducible per example seed, but not the native
    methods' sampled tokens. At T>0 transformers verifies by speculative sampling (Leviathan et al.): lossless.
    Records (Recorder): drafted (candidate_length), accepted, stop (eos; policy = fewer than both the window and the
    length cap, i.e. the confidence stop, which on the window's last token reads as "window"; window; length),
    draft_s (iteration start to the verify call, transformers' overhead included), verify_s, state gamma
    (num_assistant_tokens after the iteration); no entropy / JS. The first iteration starts at the first model call,
    so first_block_s spans what the engine's does, without generate()'s set-up; decode_s spans the whole call.
    Draft sources: the pair's draft (default); `prompt_lookup_num_tokens` (+ `max_matching_ngram_size`, default 2):
    prompt lookup; `assistant_early_exit`: the target's first layers (its generation_config then holds the assistant
    settings; its calls with fewer layers count as draft calls); a `cross_tokenizer: true` pair passes both
    tokenizers: universal assisted generation (greedy: re-tokenized candidates; sampled: Universal Speculative
    Decoding). Refused: models of different vocab sizes on a pair not marked cross_tokenizer.
    """

    def __init__(self, gamma: int = 20, num_assistant_tokens_schedule: str = "constant",
                 assistant_confidence_threshold: float = 0.4, persist: bool = False,
                 suppress_padding: bool = True, prompt_lookup_num_tokens: int | None = None,
                 max_matching_ngram_size: int | None = None, assistant_early_exit: int | None = None) -> None:
        if prompt_lookup_num_tokens is not None and assistant_early_exit is not None:
            raise OptionError("method.prompt_lookup_num_tokens and method.assistant_early_exit choose two different "
                              "draft sources; set at most one of them (the other null)")
        if max_matching_ngram_size is not None and prompt_lookup_num_tokens is None:
            raise OptionError("method.max_matching_ngram_size applies to prompt lookup only; set "
                              "method.prompt_lookup_num_tokens too (or method.max_matching_ngram_size=null)")
        self.lookup = {} if prompt_lookup_num_tokens is None else {
            "prompt_lookup_num_tokens": check_gamma(prompt_lookup_num_tokens, "prompt_lookup_num_tokens"),
            "max_matching_ngram_size": check_gamma(max_matching_ngram_size or 2, "max_matching_ngram_size")}
        self.early_exit = None if assistant_early_exit is None else check_gamma(assistant_early_exit,
                                                                                "assistant_early_exit")
        # the pair's draft model is loaded unless prompt lookup or an early exit drafts; a draft of another
        # tokenizer runs transformers' universal assisted generation; one sequence at a time, eagerly
        self.needs = Needs(pair_draft=not self.lookup and self.early_exit is None, cross_tokenizer=True,
                           one_row="runs transformers' assisted generation, which supports batch size 1 only "
                           "(method=vanilla or heuristic run batched in specbench's engine)")
        choice(num_assistant_tokens_schedule, "method.num_assistant_tokens_schedule", choices=SCHEDULES)
        self.settings: dict[str, Any] = {"num_assistant_tokens": check_gamma(gamma),
                         "num_assistant_tokens_schedule": num_assistant_tokens_schedule,
                         "assistant_confidence_threshold": real(assistant_confidence_threshold,
                                                                "method.assistant_confidence_threshold", low=0, high=1)}
        self.persist = bool(persist)
        self.suppress_padding = bool(suppress_padding)
        self.left: dict[str, Any] | None = None  # what transformers left in the draft's config
        if assistant_confidence_threshold and not is_sklearn_available():
            log.warning("scikit-learn is not installed: transformers will not update the confidence threshold")

    @property
    def carried(self) -> dict[str, Any] | None:
        return dict(self.left or self.settings) if self.persist else None

    @carried.setter
    def carried(self, state: dict[str, Any]) -> None:
        self.left = dict(zip(ASSISTANT_KEYS, state_values("hf_assisted", state, ASSISTANT_KEYS)))

    def generate(self, bound: Binding, prompt_ids: list[int], max_new_tokens: int, stop: StopCriteria,
                 generator: torch.Generator | None, trace: bool) -> Generation:
        """One transformers assisted generation on the bound pair, returned as the engine's Generation."""
        target, draft = transformers_model(bound.models["target"]), self.assistant(bound)
        if not isinstance(target, GenerationMixin):
            raise OptionError(f"method 'hf_assisted': the target {type(target).__name__} has no generate()")
        cross = bound.pair is not None and self.needs.pair_draft and bound.pair.draft_tokenizer is not None
        if draft is not None and draft is not target and not cross:
            check_vocab_sizes(target, draft)
        P = len(prompt_ids)
        ctx = bound.context_length or (P + max_new_tokens + 1)
        if P >= ctx:
            raise ValueError(f"prompt of {P} tokens does not fit the model context of {ctx} tokens")
        max_new = min(max_new_tokens, ctx - P)  # the engine stops at the context too
        settings = self.left if self.persist and self.left is not None else self.settings
        gamma = self.lookup.get("prompt_lookup_num_tokens", settings["num_assistant_tokens"])
        rec = Recorder(stop, P, max_new_tokens, ctx - P, int(gamma),
                       "constant" if self.lookup else settings["num_assistant_tokens_schedule"])
        x = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
        kwargs = self.generate_kwargs(bound, target, max_new) | self.source_kwargs(bound, draft, cross)
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
            self.left = {k: getattr(gc, k) for k in ASSISTANT_KEYS}
            for k, v in saved.items():
                setattr(gc, k, v)
            for h in hooks:
                h.remove()
        return self.finish(out[0, P:].tolist(), rec, decode_s)

    def assistant(self, bound: Binding) -> PreTrainedModel | None:
        """The bound model that drafts: the pair's draft, the target (early exit) or none (prompt lookup)."""
        if self.lookup:
            return None
        model = bound.models["target"] if self.early_exit is not None else bound.models.get("draft")
        return transformers_model(model) if model is not None else None

    def source_kwargs(self, bound: Binding, draft: PreTrainedModel | None, cross: bool) -> dict[str, Any]:
        """generate()'s arguments that choose the draft source (both tokenizers for universal assisted generation)."""
        if self.lookup:
            return dict(self.lookup)
        if self.early_exit is not None:
            return {"assistant_early_exit": self.early_exit}
        kw: dict[str, Any] = {"assistant_model": draft}
        if cross:
            pair = bound.pair
            assert pair is not None  # cross: the bound pair's draft has its own tokenizer
            kw |= {"tokenizer": bound.tokenizer, "assistant_tokenizer": pair.draft_tokenizer}
        return kw

    def generate_kwargs(self, bound: Binding, target: PreTrainedModel, max_new: int) -> dict[str, Any]:
        """generate() keyword arguments for the bound decode settings, EOS ids and vocabulary range."""
        sp, vocab = bound.params, bound.vocab_size
        eos = sorted(bound.eos_ids)
        # pad = an EOS id: the drafter's inner generate() infers a mask from the pad id (utils.py,
        # _prepare_attention_mask_for_generation), masking any token equal to it, unless the pad id is an EOS id
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
                          extra={"assistant_settings_after": dict(self.left or {})})



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
