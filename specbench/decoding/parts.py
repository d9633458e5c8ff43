"""A method's parts: a drafter (what proposes the nodes), a shape (a chain, or a tree of nodes per verify), a policy
(the Method subclass: the window, when to stop drafting, what it learns) and a rule (specbench.decoding.rule).

conf/method/<name>.yaml names them: `parts: {drafter: ..., shape: ..., policy: ...}` beside the options, which stay
flat keys (`method.gamma`, `method.head`, `method.depth`); each part takes the options its constructor names
(specbench.runs.runner.build_method splits them). A config without `parts` is its policy's name with the pair's
draft model drafting chains. What a method refuses follows from its parts, written once here: a shape or drafter
that proposes trees verifies one row on the eager path; a drafter that reads the verifier's states runs eagerly;
a drafter of one row's state (a head, re-tokenized drafts) decodes one row.

Drafter parts and shapes register here (DRAFTERS, SHAPES) from their files under methods/, as policies register in
specbench.decoding.method.METHODS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbench.common.registry import Registry
from specbench.decoding.binding import Binding
from specbench.decoding.drafts import DraftSource, ModelDraft
from specbench.decoding.sampling import SamplingParams
from specbench.decoding.tree_drafts import Grower, TreeDraft
from specbench.decoding.tree_state import tree_state
from specbench.decoding.state import Counted, model_state

DRAFTERS: Registry[type["Drafter"]] = Registry("drafter", plugins="specbench.methods")
SHAPES: Registry[type["Shape"]] = Registry("shape", plugins="specbench.methods")


KINDS = ("chain", "tree", "grown")  # what a shape is: a chain; the drafter's own tree; a tree a grower picks


class Shape:
    """How a verify's nodes hang together: `chain` (the policy's window of tokens, each the child of the one
    before), `tree` (the drafter's own tree: suffix's speculation tree, Lookahead's n-grams and window), or a tree a
    grower picks the children of (methods/spec_tree.py, methods/dyn_tree.py: kind `grown`)."""

    name = "chain"
    kind = "chain"  # one of KINDS

    @property
    def trees(self) -> bool:
        """Is a tree of nodes verified per call (one row, eager path)?"""
        return self.kind != "chain"

    def grower(self) -> Grower | None:
        """What grows a tree (None: a chain)."""
        return None

    def budget(self, window: int) -> int:
        """The most nodes one verify takes, given the policy's window (a chain: the window)."""
        return window

    def state(self) -> dict[str, float]:
        """What the shape logs per iteration instead of the policy's state (a tree: nodes and depth); {} keeps it."""
        return {}


SHAPES.register("chain")(Shape)


@SHAPES.register("tree")
class OwnTree(Shape):
    """The tree the drafter builds itself (no grower): its nodes per verify are the drafter's budget."""

    name = "tree"
    kind = "tree"


class Drafter:
    """What proposes the drafts: the models it needs, what it loads when the method binds, the verifier states it
    reads, and the DraftSource of one generation. The default, `draft_model`, is methods/draft_model.py."""

    name = "base"
    proposes: tuple[str, ...] = ("chain", "grown")  # the shape kinds (KINDS) it can draft
    pair_draft = True  # drafts with the pair's draft model (or one trained from it): the pair's draft is loaded
    cross_tokenizer = False  # may run a pair whose draft has another tokenizer (re-tokenized drafts)
    reads_states = False  # reads the verifier's hidden states (a head, SD²'s steering): the eager path only
    one_row = ""  # why it decodes one row at a time ("" : it drafts for a batch)
    tree_role = "draft"  # the model that grows a tree with tree attention (checked at bind), "" for none

    def bind(self, binding: Binding) -> Binding:
        """The binding the method runs on (a drafter that loads its own model puts it in the draft role)."""
        return binding

    @property
    def layers(self) -> tuple[int, ...]:
        """The verifier's hidden_states indices this drafter reads (known after bind)."""
        return ()

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        """The proposer of one generation, given the models' states by pair role, the shape (its grower: None for a
        chain or the drafter's own tree) and whether the policy drafts its whole window whatever the tokens (its window, and a row's cap, come
        with each request: Drafting.policies, Drafting.w_max)."""
        raise NotImplementedError

    def budget(self, nodes: int) -> int:
        """The most nodes one verify takes, given the shape's budget (re-tokenized drafts: unbounded)."""
        return nodes

    def check_bound(self, binding: Binding, shape: Shape) -> str:
        """Why the bound models cannot serve this drafter and shape ("" : they can; a Medusa tree deeper than its
        heads)."""
        return ""

    def check_shape(self, shape: Shape) -> str:
        """Why this drafter cannot propose `shape` ("" : it can): the shape's kind must be one it proposes."""
        if shape.kind in self.proposes:
            return ""
        what = {"chain": "chains (shape chain)", "tree": "its own trees (shape tree)",
                "grown": "trees grown by a shape (static_tree, dynamic_tree)"}
        return (f"the {self.name} drafter proposes {' or '.join(what[k] for k in self.proposes)}; got "
                f"method.parts.shape={shape.name}")

    def check_decode(self, params: SamplingParams) -> None:
        """Fail with an OptionError naming the key when the decode settings are out of this drafter's reach."""

    def state(self) -> dict[str, float]:
        """What the drafter logs beside the policy's state."""
        return {}

    def carried_state(self) -> dict[str, Any] | None:
        """The state it carries from one example to the next (suffix's run-wide tree), None for none."""
        return None

    def restore_state(self, state: dict[str, Any]) -> None:
        raise ValueError(f"drafter {self.name!r} carries no state across examples; got {state!r} to restore")

    def observe_output(self, token_ids: list[int]) -> None:
        """A recorded example's new tokens (see Method.observe_output)."""


def model_source(state: Counted, shape: Shape, fixed_window: bool) -> DraftSource:
    """A draft model's proposer: a chain drawn token by token, or a tree grown by the shape's grower (its state a
    TreeState: the engine gives one to each model of a method whose parts propose trees)."""
    grower = shape.grower()
    return ModelDraft(model_state(state), fixed_window) if grower is None else TreeDraft(tree_state(state), grower)


@dataclass(frozen=True)
class Parts:
    """A method's drafter and shape (its policy is the Method, its rule Method.rule)."""

    drafter: Drafter
    shape: Shape

    @property
    def trees(self) -> bool:
        """Are trees verified (the shape's kind)?"""
        return self.shape.trees

    def one_row(self) -> str:
        """Why the method decodes one row at a time, "" when it decodes batches (the drafter's reason first)."""
        if self.drafter.one_row or not self.trees:
            return self.drafter.one_row
        return "verifies a tree of drafts one row at a time (tree attention over one row's cache)"

    def eager_only(self) -> str:
        """Why the compiled decode path cannot run the method, "" when it can."""
        if self.trees:
            return ("the compiled decode path verifies chains only (static widths, no tree attention mask): set "
                    "engine.compile=false")
        if self.drafter.reads_states:
            return ("reads the verifier's hidden states, which the compiled decode path does not return: set "
                    "engine.compile=false")
        return ""


def refuse_tree_models(name: str, binding: Binding, roles: tuple[str, ...]) -> None:
    """Before decoding: the models that verify (target) or grow (draft) a tree must take a tree attention mask."""
    from specbench.common.options import OptionError
    from specbench.decoding.tree_state import tree_mask_refusal

    for role in roles:
        model = binding.models.get(role)
        why = tree_mask_refusal(model) if model is not None else None
        if why is not None:
            label = getattr(model, "name_or_path", "") or role
            raise OptionError(f"method {name!r} verifies trees with tree attention over the {role} model {label!r}, "
                              f"but {why}; use a chain method (vanilla, eagle3) with this pair")
