"""The method interface the engine drives: which models it uses, a draft policy and an acceptance rule.

A method file under `methods/` subclasses `Method` and registers itself in `METHODS` under its
config name (`conf/method/<name>.yaml` has `name: <name>`). Before decoding, `Method.bind` gives it
the pair it runs on (a `Binding`: models by role, tokenizer, vocabulary range, EOS ids, context,
decode settings); everything a method knows about the pair comes from there.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch

from specbench.decoding.acceptance import Rule, make_rule
from specbench.decoding.records import Generation, IterationRecord  # noqa: F401 - IterationRecord re-exported
from specbench.decoding.drafts import DraftSource, ModelDraft
from specbench.decoding.sampling import SamplingParams
from specbench.decoding.stopping import StopCriteria
from specbench.common.registry import Registry

METHODS: Registry[type[Method]] = Registry("method", plugins="specbench.methods")


@dataclass(frozen=True)
class Binding:
    """The pair as a method runs on it, fixed before decoding and handed over once by `Method.bind`."""

    models: dict[str, Any]  # pair role ('target', 'draft') -> the model playing it, for the roles the method runs
    tokenizer: Any  # the pair's tokenizer (None for test models without one)
    vocab_size: int  # the shared tokenizer range; logits beyond it (embedding padding) are ignored
    eos_ids: frozenset[int]  # ids that end a generation
    params: SamplingParams  # decode settings: temperature (0 = greedy), top-k, top-p
    context_length: int | None = None  # the smallest model context, None if no model declares one
    pair: Any = None  # the loaded specbench.models.pairs.Pair, for a method that loads a drafter trained for it


def state_values(name: str, state: Any, keys: tuple[str, ...]) -> list[Any]:
    """The values of `keys` in a saved carried state, which must hold exactly those keys."""
    if not isinstance(state, dict) or set(state) != set(keys):
        raise ValueError(f"method {name!r}: a carried state holds exactly the keys {', '.join(keys)}; got {state!r}")
    return [state[k] for k in keys]


class Method:
    """Base method: draft policy (window, keep_drafting, update) plus an acceptance rule.

    Defaults describe plain speculative decoding with a fixed window; subclasses override.
    """

    name = "base"
    uses_draft = True  # False: no drafting (ar, draft_only)
    verifier = "target"  # which model of the pair verifies/generates: "target" or "draft"
    needs_stats = False  # True: the engine computes H(q_i) and d_JS(p_i, q_i) every iteration
    external = False  # True: the method decodes with its own loop (generate_external), beside the engine
    pair_draft = True  # False: the method drafts without the pair's draft model (pld, layer_skip)
    cross_tokenizer = False  # True: the method may run a pair whose draft has another tokenizer (uag)
    # hidden_states indices of the verifier that the engine hands to observe_hidden after every verify
    # (sd2's steering); empty: the verify forward does not compute them (no cost for other methods)
    hidden_layers: tuple[int, ...] = ()

    binding: Binding | None = None  # set by bind()

    def __init__(self, rule: str = "rejection", **options: Any) -> None:
        if options:
            raise ValueError(f"method {self.name!r} got unknown options {sorted(options)}")
        self.rule_spec = rule
        self.rule: Rule = make_rule(rule)  # rebuilt by bind() for the decode settings

    @property
    def roles(self) -> tuple[str, ...]:
        """The pair roles whose models this method runs: the verifier's, and 'draft' when it drafts with the pair's."""
        return (self.verifier, "draft") if self.uses_draft and self.pair_draft else (self.verifier,)

    def bind(self, binding: Binding) -> None:
        """Run on `binding` from now on (called once before decoding): keep it and build the rule for its decode
        settings. A method that needs more of the pair (a tokenizer, its own drafter) overrides this."""
        self.binding = binding
        self.rule = make_rule(self.rule_spec, greedy=binding.params.greedy)

    @property
    def bound(self) -> Binding:
        """The binding; a clear error before bind()."""
        if self.binding is None:
            raise ValueError(f"method {self.name!r} is not bound to a pair: call method.bind(binding) before decoding "
                             "(specbench.runs.runner.make_engine does)")
        return self.binding

    @property
    def verifier_model(self) -> Any:
        """The model that verifies (or generates, without drafting)."""
        return self.bound.models[self.verifier]

    @property
    def drafter(self) -> Any:
        """The model that drafts: the pair's draft unless bind() put another in its place; None without drafting."""
        return self.bound.models["draft"] if self.uses_draft else None

    @property
    def lossless(self) -> bool:
        """Are the outputs distributed as the target's autoregressive ones (`ar`)? The verifier must be the
        target and the rule must keep its distribution (draft_only verifies with the draft: False)."""
        return self.verifier == "target" and self.rule.lossless

    def fork(self) -> "Method":
        """An instance for one row of a batch: the same binding, models and rule (the engine calls the rule of its own
        method for the whole batch), its own policy state (reset() gives it its start values; a method that carries
        state across examples cannot be forked)."""
        return copy.copy(self)

    def draft_source(self, states: dict[str, Any]) -> DraftSource | None:
        """The proposer of this method's drafts, given its models' states by role (specbench.decoding.state): the
        model in the draft role (None without drafting); pld, uag and the tree drafters override."""
        return ModelDraft(states["draft"], self.fixed_window) if self.uses_draft else None

    def before_draft(self, rows: list["Method"]) -> None:
        """Before each drafting phase, on the engine's method, with the instances of the rows still decoding
        (one per row; at B = 1 the method itself): a hook for drafters that read per-row state (sd2)."""

    def reset(self) -> None:
        """Start of a generation call (per example)."""

    def window(self) -> int:
        """Maximum number of tokens to draft in the next iteration."""
        return 0

    def keep_drafting(self, i: int, q_i: torch.Tensor, token: int) -> bool:
        """After drafting token i (1-based) with draft dist q_i [V]: draft another?"""
        return True

    def update(self, record: IterationRecord) -> None:
        """Update the policy state with the iteration just finished."""

    def relaxation(self) -> float:
        """The threshold a relaxed rule accepts mismatches by (AdaSD's T_V); exact rules ignore it."""
        return 0.0

    def state(self) -> dict[str, float]:
        """Policy state to log (thresholds, gamma)."""
        return {}

    def carried_state(self) -> dict[str, Any] | None:
        """The state this method carries from one example to the next, as JSON values (exact: floats
        round-trip through JSON), or None when every example starts afresh (the default).

        The runner saves it with each row, restores the last row's on resume and restores it after
        the warm-up, so a resumed or warmed-up run continues exactly as an uninterrupted one.
        """
        return None

    def observe_output(self, token_ids: list[int]) -> None:
        """After each recorded example, in the order its row is written and before its carried_state() is taken: its
        new tokens (a method that learns from the run's outputs: suffix decoding's run-wide tree). A warm-up's
        examples are not recorded, so not observed. A carried state {"outputs": k} names the first k observed
        outputs: on resume the runner hands their token ids back, {"outputs": [[ids], ...]}."""

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from a state that carried_state() returned."""
        raise ValueError(f"method {self.name!r} carries no state across examples; got {state!r} to restore")

    def check_batch(self, batch_size: int) -> None:
        """Fail with an OptionError naming the key when this method cannot decode `batch_size` rows together
        (called by the runner before any model loads)."""
        from specbench.common.options import OptionError

        if batch_size > 1 and self.carried_state() is not None:
            raise OptionError(f"method {self.name!r}: method.persist=true carries state from one example to the "
                              f"next, which needs batch_size=1 (got batch_size={batch_size}); set "
                              "method.persist=false or batch_size=1")

    @property
    def fixed_window(self) -> bool:
        """Does the policy draft its whole window whatever the tokens (keep_drafting not overridden)? Then a
        compiled draft loop needs no host synchronisation before the window ends."""
        return type(self).keep_drafting is Method.keep_drafting

    def check_compile(self) -> None:
        """Fail with an OptionError naming engine.compile when this method cannot run the compiled decode path
        (specbench.decoding.compiled; called by the runner before any model loads)."""
        from specbench.common.options import OptionError

        if self.external:
            raise OptionError(f"method {self.name!r} decodes with another library's loop, which the compiled path "
                              "cannot run: set engine.compile=false")

    def check_decode(self, params: SamplingParams) -> None:
        """Fail with an OptionError naming the key when this method cannot run the decode settings (called by the
        runner before any model loads)."""

    def observe_hidden(self, states: torch.Tensor) -> None:
        """After a verify: the verifier's states [len(hidden_layers), m, H] at the m positions it committed, in order
        (the uncached committed tokens, then the accepted path); the last gave the next token's distribution."""

    def generate_external(self, prompt_ids: list[int], max_new_tokens: int, stop: StopCriteria,
                          generator: torch.Generator | None, trace: bool) -> Generation:
        """For `external` methods: decode prompt_ids [P] with another loop, stopping by `stop` (the engine's
        specbench.decoding.stopping.StopCriteria), and return a specbench.decoding.engine.Generation."""
        raise NotImplementedError(f"method {self.name!r} is not external")


def check_option(name: str, check: Callable[..., Any], value: Any, key: str, **limits: Any) -> Any:
    """`value` of option `key` of method `name` through `check` (options.real, integer, ...), the error naming both."""
    from specbench.common.options import OptionError

    try:
        return check(value, f"method.{key}", **limits)
    except OptionError as err:
        raise OptionError(f"{err} (method {name!r})") from None


def option_error(name: str, message: str) -> Exception:
    """The error of method `name`'s options that `message` describes (naming each key as method.<key>)."""
    from specbench.common.options import OptionError

    return OptionError(f"{message} (method {name!r})")


def check_gamma(name: str, gamma: int, key: str = "gamma") -> int:
    """Validate a speculation length γ >= 1 held by the option `key` of method `name` (true is not 1)."""
    from specbench.common.options import OptionError, integer

    try:
        return integer(gamma, f"method.{key}", low=1)
    except OptionError as err:
        raise OptionError(f"{err} (method {name!r})") from None
