"""A method's drafter (what proposes the nodes, and what it needs: `Needs`) and shape (a chain, or a tree of nodes
per verify); its policy is in specbench.decoding.policy, its rule in specbench.decoding.rule, and what the four
can do together in specbench.decoding.plan. Drafters and shapes register here (DRAFTERS, SHAPES) from their files
under methods/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbench.common.registry import Registry
from specbench.decoding.binding import Binding
from specbench.decoding.drafts import DraftSource, ModelDraft
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
        """Is a tree of nodes verified per call (eager path)?"""
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


@dataclass(frozen=True)
class Needs:
    """What a drafter (or an external loop) needs and can do, declared once: the method's plan reads it."""

    proposes: tuple[str, ...] = ("chain", "grown")  # the shape kinds (KINDS) or shape names it can draft
    pair_draft: bool = True  # drafts with the pair's draft model (or one trained from it): it is loaded
    cross_tokenizer: bool = False  # may run a pair whose draft has another tokenizer (re-tokenized drafts)
    reads_states: bool = False  # reads the verifier's hidden states (a head, SD²'s steering): the eager path only
    one_row: str = ""  # why it decodes one row at a time ("": it drafts for a batch)
    tree_role: str = "draft"  # the model that grows a tree with tree attention (checked at bind), "" for none
    greedy_only: str = ""  # why it runs at temperature 0 only ("": any decode settings)
    drafts: bool = True  # False: nothing is drafted, the verifier alone generates (`none`)
    verifier: str = "target"  # the pair role that verifies (or generates alone)
    looks: bool = False  # proposes look-only nodes (Lookahead's window): the target's argmax there comes back to it


class Drafter:
    """What proposes the drafts: what it needs (`needs`), what it loads when the method binds, the verifier layers
    it reads, and the DraftSource of one generation. The default, `draft_model`, is methods/draft_model.py."""

    needs = Needs()

    def bind(self, binding: Binding, shape: Shape) -> Binding:
        """The binding the method runs on (a drafter that loads its own model puts it in the draft role); an
        OptionError when the bound models cannot serve this drafter and shape (a Medusa tree deeper than its heads)."""
        return binding

    @property
    def layers(self) -> tuple[int, ...]:
        """The verifier's hidden_states indices this drafter reads (known after bind)."""
        return ()

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource | None:
        """The proposer of one generation, given the models' states by pair role, the shape (its grower: None for a
        chain or the drafter's own tree) and whether the policy drafts its whole window whatever the tokens."""
        raise NotImplementedError

    def budget(self, nodes: int) -> int:
        """The most nodes one verify takes, given the shape's budget (re-tokenized drafts: unbounded)."""
        return nodes

    def state(self) -> dict[str, float]:
        """What the drafter logs beside the policy's state."""
        return {}

    @property
    def carried(self) -> dict[str, Any] | None:
        """The state it carries from one example to the next (suffix's run-wide tree), None for none."""
        return None

    @carried.setter
    def carried(self, state: dict[str, Any]) -> None:
        raise ValueError(f"this drafter carries no state across examples; got {state!r} to restore")

    def observe_output(self, token_ids: list[int]) -> None:
        """A recorded example's new tokens, in the order its row is written and before its carried state is taken
        (suffix decoding's run-wide tree). A carried state {"outputs": k} names the first k observed outputs: on
        resume the runner hands their token ids back, {"outputs": [[ids], ...]}."""


@DRAFTERS.register("none")
class NoDraft(Drafter):
    """No drafts: the verifier alone, one token per forward (`ar`; `draft_only`, whose verifier is the draft)."""

    def __init__(self, verifier: str = "target") -> None:
        from specbench.common.options import choice

        self.needs = Needs(proposes=KINDS, pair_draft=False, drafts=False,
                           verifier=choice(verifier, "method.verifier", choices=("target", "draft")))

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource | None:
        return None


def model_source(state: Counted, shape: Shape, fixed_window: bool) -> DraftSource:
    """A draft model's proposer: a chain drawn token by token, or a tree grown by the shape's grower (its state a
    TreeState: the engine gives one to each model of a method whose parts propose trees)."""
    grower = shape.grower()
    return ModelDraft(model_state(state), fixed_window) if grower is None else TreeDraft(tree_state(state), grower)
