"""A method: the frozen value of its four parts, a policy (specbench.decoding.policy), a drafter and a shape
(specbench.decoding.parts) and a rule (specbench.decoding.rule), with the plan they make (specbench.decoding.plan).
specbench.decoding.compose builds it from conf/method; `Method.bind` gives it the pair it runs on (a `Binding`:
models by role, tokenizer, vocabulary range, EOS ids, context, decode settings), everything a method knows of it.

A method whose loop is another library's (`hf_assisted`: transformers' assisted generation) holds that `Loop`
instead of drafting through the engine (specbench.decoding.decoders runs it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from specbench.common.options import OptionError
from specbench.common.registry import Registry
from specbench.decoding.binding import Binding
from specbench.decoding.drafts import DraftSource
from specbench.decoding.parts import Drafter, Needs, Shape
from specbench.decoding.plan import Plan, check_tree_models
from specbench.decoding.policy import Policy
from specbench.decoding.records import Generation
from specbench.decoding.state import Counted
from specbench.decoding.stopping import StopCriteria


class Loop(Protocol):
    """Another library's decode loop, run in place of the engine (methods/hf_assisted.py)."""

    needs: Needs  # what it loads and refuses, as a drafter declares it

    @property
    def carried(self) -> dict[str, Any] | None:
        """What it carries from one example to the next (Policy.carried)."""
        ...

    @carried.setter
    def carried(self, state: dict[str, Any]) -> None: ...

    def generate(self, bound: Binding, prompt_ids: list[int], max_new_tokens: int, stop: StopCriteria,
                 generator: torch.Generator | None, trace: bool) -> Generation:
        """Decode prompt_ids [P] on the bound pair, stopping by `stop` (the engine's StopCriteria)."""
        ...


LOOPS: Registry[type[Loop]] = Registry("loop", plugins="specbench.methods")


@dataclass(frozen=True)
class Method:
    """A method's parts, named by its config (`vanilla`, `vanilla+drafter=suffix`), and their plan."""

    name: str
    policy: Policy
    drafter: Drafter
    shape: Shape
    plan: Plan
    loop: Loop | None = None  # another library's loop decodes instead of the engine
    binding: Binding | None = None  # set by bind()

    def bind(self, binding: Binding) -> Method:
        """This method bound to `binding` (once, before decoding) as its drafter gives it back (a trained drafter
        or a head in the draft role), with the verifier layers the drafter reads; the models that verify or grow a
        tree must take a tree mask."""
        if self.plan.kind != "none" and self.loop is None:
            try:
                binding = self.drafter.bind(binding, self.shape)
            except OptionError as err:
                raise OptionError(f"{err} (method {self.name!r})") from None
        check_tree_models(self.name, binding, self.plan.tree_roles)
        return replace(self, binding=binding, plan=replace(self.plan, layers=tuple(self.drafter.layers)))

    @property
    def bound(self) -> Binding:
        """The binding; a clear error before bind()."""
        if self.binding is None:
            raise ValueError(f"method {self.name!r} is not bound to a pair: bind it (method = method.bind(binding)) "
                             "before decoding (specbench.runs.binding.make_engine does)")
        return self.binding

    def draft_source(self, states: dict[str, Counted]) -> DraftSource | None:
        """The proposer of one generation, given its models' states by role (None without drafting)."""
        if self.plan.kind == "none":
            return None
        return self.drafter.source(states, self.bound, self.shape, self.plan.fixed_window)

    def budget(self, policy: Policy) -> int:
        """The most nodes a row's next verify takes: a chain's window, a tree's node budget (the shape's),
        unbounded for a drafter whose node count is not the window (re-tokenized drafts)."""
        return self.drafter.budget(self.shape.budget(policy.window()))

    def logged_state(self, policy: Policy) -> dict[str, float]:
        """What an iteration logs: the policy's state (thresholds, γ) or a tree shape's (nodes, depth), and the
        drafter's."""
        return {**(self.shape.state() or policy.state()), **self.drafter.state()}

    @property
    def carrier(self) -> Loop | Policy | Drafter:
        """The part whose state is carried from one example to the next: the loop, else the policy when it carries
        one (persist), else the drafter (suffix's run-wide tree)."""
        if self.loop is not None:
            return self.loop
        return self.policy if self.policy.carried is not None else self.drafter

    def carried_state(self) -> dict[str, Any] | None:
        """The carrier's state (Policy.carried); the runner saves it with each row and restores it on resume and
        after the warm-up."""
        return self.carrier.carried

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from a state carried_state() returned."""
        if self.carried_state() is None:
            raise ValueError(f"method {self.name!r} carries no state across examples; got {state!r} to restore")
        self.carrier.carried = state

    def observe_output(self, token_ids: list[int]) -> None:
        """After each recorded example (Drafter.observe_output)."""
        self.drafter.observe_output(token_ids)
