"""The method interface the engine drives: a policy (this class's subclasses) composed with a drafter, a shape and
an acceptance rule (specbench.decoding.parts).

A policy file under `methods/` subclasses `Method` and registers itself in `METHODS` under its config name; a
drafter or shape file registers in specbench.decoding.parts' DRAFTERS or SHAPES; conf/method/<name>.yaml names the
parts a method is made of. Before decoding, `Method.bind` gives it the pair it runs on (a `Binding`: models by role,
tokenizer, vocabulary range, EOS ids, context, decode settings); everything a method knows about the pair comes
from there.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from specbench.decoding.acceptance import Rule, make_rule
from specbench.decoding.rule import tree_rules
from specbench.decoding.records import Generation, IterationRecord  # noqa: F401 - IterationRecord re-exported
from specbench.decoding.drafts import DraftSource
from specbench.decoding.binding import Binding
from specbench.decoding.parts import DRAFTERS, Parts, Shape, refuse_tree_models
from specbench.decoding.sampling import SamplingParams
from specbench.decoding.state import Counted
from specbench.decoding.stopping import StopCriteria
from specbench.common.registry import Registry

METHODS: Registry[type[Method]] = Registry("policy", plugins="specbench.methods")


def state_values(name: str, state: Any, keys: tuple[str, ...]) -> list[Any]:
    """The values of `keys` in a saved carried state, which must hold exactly those keys."""
    if not isinstance(state, dict) or set(state) != set(keys):
        raise ValueError(f"method {name!r}: a carried state holds exactly the keys {', '.join(keys)}; got {state!r}")
    return [state[k] for k in keys]


class Method:
    """Base policy (window, keep_drafting, update: a fixed window of 0 here; subclasses override) with its parts: a
    drafter and a shape (`parts`, specbench.decoding.parts; default: the pair's draft model drafting chains) and an
    acceptance rule (`rule`)."""

    name = "base"
    uses_draft = True  # False: no drafting (ar, draft_only)
    verifier = "target"  # which model of the pair verifies/generates: "target" or "draft"
    needs_stats = False  # True: the engine computes H(q_i) and d_JS(p_i, q_i) every iteration
    external = False  # True: the method decodes with its own loop (generate_external), beside the engine

    binding: Binding | None = None  # set by bind()

    def __init__(self, rule: str = "rejection", parts: Parts | None = None, name: str | None = None,
                 **options: Any) -> None:
        if options:
            raise ValueError(f"method {self.name!r} got unknown options {sorted(options)}")
        if name is not None:  # the config's name (a preset of parts); else the policy's
            self.name = name
        self.rule_spec = rule
        self.rule: Rule = make_rule(rule)  # rebuilt by bind() for the decode settings
        self.parts = parts if parts is not None else Parts(DRAFTERS.get("draft_model")(), Shape())
        self.check_parts()

    def check_parts(self) -> None:
        """Fail with an OptionError naming the key when the parts do not go together (a relaxed rule on a tree, a
        drafter that cannot propose the shape)."""
        if self.parts.trees and self.uses_draft and not self.rule.walks_trees:
            raise option_error(self.name, f"method.parts.rule must be one of {', '.join(tree_rules())} for a tree "
                                          f"({self.rule.chains_only}), got {self.rule_spec!r}")
        why = self.parts.drafter.check_shape(self.parts.shape)
        if why:
            raise option_error(self.name, why)

    @property
    def pair_draft(self) -> bool:
        """Does the method draft with the pair's draft model (or a drafter trained from it)?"""
        return self.uses_draft and self.parts.drafter.pair_draft

    @property
    def cross_tokenizer(self) -> bool:
        """May the method run a pair whose draft has another tokenizer (re-tokenized drafts)?"""
        return self.uses_draft and self.parts.drafter.cross_tokenizer

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """The verifier's hidden_states indices each verify returns for the drafter (a head, SD²'s steering); empty:
        the verify forward does not compute them (no cost for other methods). Known after bind()."""
        return tuple(self.parts.drafter.layers) if self.uses_draft else ()

    @property
    def roles(self) -> tuple[str, ...]:
        """The pair roles whose models this method runs: the verifier's, and 'draft' when it drafts with the pair's."""
        return (self.verifier, "draft") if self.pair_draft else (self.verifier,)

    def bind(self, binding: Binding) -> None:
        """Run on `binding` from now on (called once before decoding): keep it as the drafter part gives it back (a
        trained drafter or a head in the draft role), build the rule for its decode settings and check that the
        models that verify or grow a tree take a tree mask."""
        if self.uses_draft:
            binding = self.parts.drafter.bind(binding)
            why = self.parts.drafter.check_bound(binding, self.parts.shape)
            if why:
                raise option_error(self.name, why)
        self.binding = binding
        self.rule = make_rule(self.rule_spec, greedy=binding.params.greedy)
        if self.uses_draft and self.parts.trees:
            roles = ("target", self.parts.drafter.tree_role) if self.parts.shape.trees else ("target",)
            refuse_tree_models(self.name, binding, tuple(r for r in roles if r))

    @property
    def bound(self) -> Binding:
        """The binding; a clear error before bind()."""
        if self.binding is None:
            raise ValueError(f"method {self.name!r} is not bound to a pair: call method.bind(binding) before decoding "
                             "(specbench.runs.binding.make_engine does)")
        return self.binding

    @property
    def verifier_model(self) -> torch.nn.Module:
        """The model that verifies (or generates, without drafting)."""
        return self.bound.models[self.verifier]

    @property
    def draft_model(self) -> torch.nn.Module | None:
        """The model in the draft role: the pair's draft unless bind() put another in its place (a trained drafter,
        a head, an early-exit view); None without drafting."""
        return self.bound.models.get("draft") if self.uses_draft else None

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

    def draft_source(self, states: dict[str, Counted]) -> DraftSource | None:
        """The proposer of one generation's drafts, given its models' states by role (specbench.decoding.state): the
        drafter part's, for the shape's grower (None without drafting)."""
        if not self.uses_draft:
            return None
        return self.parts.drafter.source(states, self.bound, self.parts.shape, self.fixed_window)

    def reset(self) -> None:
        """Start of a generation call (per example)."""

    def window(self) -> int:
        """The policy's speculation length for the next iteration: the most tokens a chain drafts."""
        return 0

    def budget(self) -> int:
        """The most nodes the next verify takes: a chain's window, a tree's node budget (the shape's), unbounded for
        a drafter whose node count is not the window (re-tokenized drafts)."""
        return self.parts.drafter.budget(self.parts.shape.budget(self.window()))

    def keep_drafting(self, i: int, q_i: torch.Tensor, token: int) -> bool:
        """After drafting token i (1-based) with draft dist q_i [V]: draft another?"""
        return True

    def update(self, record: IterationRecord) -> None:
        """Update the policy state with the iteration just finished."""

    def relaxation(self) -> float:
        """The threshold a relaxed rule accepts mismatches by (AdaSD's T_V); exact rules ignore it."""
        return 0.0

    def state(self) -> dict[str, float]:
        """What an iteration logs: the policy's state (policy_state: thresholds, gamma), or a tree shape's (nodes,
        depth), and the drafter's."""
        shape = self.parts.shape.state()
        return {**(shape or self.policy_state()), **self.parts.drafter.state()}

    def policy_state(self) -> dict[str, float]:
        """Policy state to log (thresholds, gamma)."""
        return {}

    def carried_state(self) -> dict[str, Any] | None:
        """The state this method carries from one example to the next, as JSON values (exact: floats
        round-trip through JSON), or None when every example starts afresh (the default).

        The runner saves it with each row, restores the last row's on resume and restores it after
        the warm-up, so a resumed or warmed-up run continues exactly as an uninterrupted one.
        """
        return self.parts.drafter.carried_state()

    def observe_output(self, token_ids: list[int]) -> None:
        """After each recorded example, in the order its row is written and before its carried_state() is taken: its
        new tokens (a method that learns from the run's outputs: suffix decoding's run-wide tree). A warm-up's
        examples are not recorded, so not observed. A carried state {"outputs": k} names the first k observed
        outputs: on resume the runner hands their token ids back, {"outputs": [[ids], ...]}."""
        self.parts.drafter.observe_output(token_ids)

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from a state that carried_state() returned (the drafter's, unless the policy carries one)."""
        if self.parts.drafter.carried_state() is None:
            raise ValueError(f"method {self.name!r} carries no state across examples; got {state!r} to restore")
        self.parts.drafter.restore_state(state)

    def check_batch(self, batch_size: int) -> None:
        """Fail with an OptionError naming the key when this method cannot decode `batch_size` rows together
        (called by the runner before any model loads)."""
        from specbench.common.options import OptionError

        if batch_size > 1 and self.carried_state() is not None and self.parts.drafter.carried_state() is None:
            raise OptionError(f"method {self.name!r}: method.persist=true carries state from one example to the "
                              f"next, which needs batch_size=1 (got batch_size={batch_size}); set "
                              "method.persist=false or batch_size=1")
        why = self.parts.one_row() if self.uses_draft else ""
        if batch_size > 1 and why:
            raise OptionError(f"method {self.name!r} {why}; got batch_size={batch_size}: set batch_size=1")

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
        why = self.parts.eager_only() if self.uses_draft else ""
        if why:
            raise OptionError(f"method {self.name!r}: {why}")

    def check_decode(self, params: SamplingParams) -> None:
        """Fail with an OptionError naming the key when this method cannot run the decode settings (called by the
        runner before any model loads)."""
        if self.uses_draft:
            self.parts.drafter.check_decode(params)

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
