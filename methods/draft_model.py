"""Drafters `draft_model`, the pair's draft model; `trained`, a drafter a `task=distill` run trained from it
(`drafter`: its folder; `draft_or_trained` also takes null, the pair's draft); `drafter_kind`: distilled,
DistillSpec's KL(π_V || π_D) on verifier samples, SD²'s "Distilled" row; or sd2, SD²'s drafter steered by the
verifier's hidden states, sd2.md section 3. Each drafts chains token by token or grows the shape's tree
(specbench.decoding.tree_drafts).

SD²'s steering wraps the drafter's proposer (`Steered`): before each drafting phase the verifier's states of each
row at its last committed position, handed over with the drafting request (Drafting.states, from the last verify
forward itself: no extra target call), give b_l = W_s^(l) W_hml [h; m; l], which biases every drafter MLP for the
whole block (specbench.models.steering). The first block of a generation is drafted before any verify and is not
steered; a row not verified yet gets b = 0 beside rows that are. The rule and the verifier are unchanged, so the
method stays lossless.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from specbench.decoding.drafts import DraftSource, Drafting
from specbench.common.options import OptionError
from specbench.decoding.method import Binding
from specbench.decoding.parts import DRAFTERS, Drafter, Needs, Shape, model_source
from specbench.decoding.proposal import Proposal
from specbench.decoding.state import Counted
from specbench.models.steering import SteeredDrafter

KINDS = ("distilled", "sd2")  # the task=distill task.kind of a trained drafter's folder


class Steered(DraftSource):
    """A proposer whose draft model is steered by each row's verifier states (SD²): wraps the proposer `inner`."""

    def __init__(self, inner: DraftSource, steered: SteeredDrafter) -> None:
        """steered: the specbench.models.steering.SteeredDrafter on the inner proposer's draft model."""
        self.inner, self.steered = inner, steered

    def propose(self, buf: torch.Tensor, d: Drafting) -> list[Proposal]:
        """Steer each row's block from its own states [len(layers), H] at its last committed position (biases
        [B, 1, I_D] per drafter layer; zeros for a row not verified yet; none while no row has been), then draft."""
        last = [s[:, -1] if s is not None else None for s in d.states]
        if all(s is None for s in last):
            self.steered.clear()
        else:
            ref = next(s for s in last if s is not None)
            self.steered.set_block(torch.stack([ref.new_zeros(ref.shape) if s is None else s for s in last]))
        return self.inner.propose(buf, d)

    def rollback(self, lengths: list[int], paths: list[list[int]]) -> None:
        self.inner.rollback(lengths, paths)

    def select(self, rows: list[int]) -> None:
        self.inner.select(rows)


@DRAFTERS.register("draft_model")
class DraftModel(Drafter):
    """The pair's draft model."""

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        return model_source(states["draft"], shape, fixed_window)


@DRAFTERS.register("trained")
class Trained(Drafter):
    """A trained drafter folder of kind `drafter_kind` (`drafter` is required: distilled, sd2)."""

    optional = False  # True: `drafter` null drafts with the pair's draft model

    def __init__(self, drafter: str | None = None, drafter_kind: str = "distilled") -> None:
        if drafter_kind not in KINDS:
            raise OptionError(f"method.drafter_kind must be one of {', '.join(KINDS)}, got {drafter_kind!r}")
        self.folder, self.distill_kind = drafter, drafter_kind  # distill_kind: the task=distill kind of the folder
        self.needs = Needs(reads_states=drafter not in (None, "") and drafter_kind == "sd2")
        self.steered: SteeredDrafter | None = None  # sd2: the SteeredDrafter on the loaded drafter (set by bind)

    def bind(self, binding: Binding, shape: Shape) -> Binding:
        """The binding with the trained drafter in the draft role (the pair's draft stays when the folder is optional
        and not given; a required one not given fails in load_trained, naming method.drafter)."""
        if self.optional and self.folder in (None, ""):
            return binding
        from specbench.models.drafters import load_trained

        if binding.pair is None:
            raise ValueError("a trained drafter is checked against the pair it was trained for: bind the method to a "
                             "loaded pair (Binding.pair)")
        drafter, self.steered = load_trained(self.folder, binding.pair, self.distill_kind)
        return replace(binding, models={**binding.models, "draft": drafter})

    @property
    def layers(self) -> tuple[int, ...]:
        """SD²: the verifier layers the steering was trained with."""
        return tuple(self.steered.steering.layers) if self.steered is not None else ()

    def source(self, states: dict[str, Counted], binding: Binding, shape: Shape,
               fixed_window: bool) -> DraftSource:
        inner = model_source(states["draft"], shape, fixed_window)
        return Steered(inner, self.steered) if self.steered is not None else inner


@DRAFTERS.register("draft_or_trained")
class DraftOrTrained(Trained):
    """The pair's draft model, or a trained drafter folder when `drafter` is set (the tree methods' option)."""

    optional = True
