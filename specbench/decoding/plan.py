"""What a method's four parts can do together, derived once when it is built (`make_plan`): the proposal kind, the
rows it decodes, the path it runs on, the verifier layers it reads, whether it is lossless. Every refusal of a
composition or of a run's settings is written here, from the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.common.options import OptionError
from specbench.decoding.acceptance import make_rule
from specbench.decoding.binding import Binding
from specbench.decoding.parts import Needs, Shape
from specbench.decoding.policy import Policy, fixed_window
from specbench.decoding.rule import tree_rules
from specbench.decoding.sampling import SamplingParams

RELAXABLE = ("sample_match", "rejection")  # the base rules js_relaxed(base) takes
SHAPE_WORDS = {"chain": "chains (shape chain)", "tree": "its own trees (shape tree)",
               "grown": "trees grown by a shape (static_tree, dynamic_tree)"}


@dataclass(frozen=True)
class Plan:
    """What a composition does; the engine takes its verify, states and channels from it."""

    kind: str  # what a verify takes: "none" (nothing drafted), "chain" or "tree"
    verifier: str  # the pair role that verifies (or generates alone): "target", draft_only's "draft"
    roles: tuple[str, ...]  # the pair roles whose models the method runs
    rule: str  # the rule's config string (js_relaxed(base) under a policy that relaxes it)
    lossless: bool  # outputs distributed as the target's autoregressive ones
    stats: bool  # the engine computes H(q_i) and d_JS(p_i, q_i) every iteration (the policy reads them)
    fixed_window: bool  # the policy drafts its whole window whatever the tokens
    cross_tokenizer: bool  # may run a pair whose draft has another tokenizer
    one_row: str  # why it decodes one row at a time ("": batches)
    eager: str  # why the compiled decode path cannot run it ("": it can)
    greedy_only: str  # why it runs at temperature 0 only ("": any)
    carries: bool  # the policy carries state across examples (persist): one row at a time
    tree_roles: tuple[str, ...]  # the models that must take a tree attention mask
    looks: bool  # the drafter's proposals carry look-only nodes, whose argmax goes back to it (one row)
    layers: tuple[int, ...] = ()  # the verifier's hidden_states the drafter reads (known after bind)

    @property
    def trees(self) -> bool:
        """Is a tree of nodes verified per call?"""
        return self.kind == "tree"

    def refuse(self, name: str, batch_size: int = 1, compile: bool = False, params: SamplingParams | None = None
               ) -> None:
        """Fail with an OptionError naming the key when the run's settings are out of this plan's reach (the runner
        calls it before any model loads)."""
        why = ""
        if batch_size > 1 and self.carries:
            why = (f": method.persist=true carries state from one example to the next, which needs batch_size=1 (got "
                   f"batch_size={batch_size}); set method.persist=false or batch_size=1")
        elif batch_size > 1 and self.one_row:
            why = f" {self.one_row}; got batch_size={batch_size}: set batch_size=1"
        elif compile and self.eager:
            why = f": {self.eager}: set engine.compile=false"
        elif params is not None and not params.greedy and self.greedy_only:
            why = f" runs at decode.temperature=0 only (got {params.temperature:g}): {self.greedy_only}"
        if why:
            raise OptionError(f"method {name!r}{why}")


def make_plan(names: dict[str, str], policy: Policy, needs: Needs, shape: Shape, external: bool = False) -> Plan:
    """The plan of a policy, a drafter's needs, a shape and the rule names["rule"]; an OptionError naming the key
    where the parts do not go together. `external`: another library's loop decodes (its needs given)."""
    relaxed = policy.relaxation() is not None
    if relaxed and names["rule"] not in RELAXABLE:
        raise OptionError(f"method.parts.rule must be one of {', '.join(RELAXABLE)} (the base rule of js_relaxed), "
                          f"got {names['rule']!r}")
    if external and names["rule"] != "rejection":
        raise OptionError(f"method.parts.rule: {names['policy']}'s loop accepts drafts by its own rejection "
                          f"sampling; got {names['rule']!r}")
    if shape.kind not in needs.proposes and shape.name not in needs.proposes:
        what = " or ".join(SHAPE_WORDS.get(k, f"a {k} (method.parts.shape={k})") for k in needs.proposes)
        raise OptionError(f"the {names['drafter']} drafter proposes {what}; got method.parts.shape={shape.name}")
    kind = "none" if not needs.drafts else "tree" if shape.trees else "chain"
    spec = f"js_relaxed({names['rule']})" if relaxed else names["rule"]
    rule = make_rule(spec)
    if kind == "tree" and not rule.walks_trees:
        raise OptionError(f"method.parts.rule must be one of {', '.join(tree_rules())} for a tree "
                          f"({rule.chains_only}), got {names['rule']!r}")
    eager = ("decodes with another library's loop, which the compiled path cannot run" if external else
             "its look-ahead window runs on the eager path only" if needs.looks else
             "reads the verifier's hidden states, which the compiled decode path does not return"
             if needs.reads_states else "")
    return Plan(kind=kind, verifier=needs.verifier,
                roles=(needs.verifier, "draft") if needs.pair_draft else (needs.verifier,), rule=spec,
                lossless=external or (needs.verifier == "target" and rule.lossless), stats=policy.reads_stats,
                fixed_window=fixed_window(policy), cross_tokenizer=needs.cross_tokenizer,
                one_row=needs.one_row, eager=eager,
                greedy_only=needs.greedy_only, carries=policy.carried is not None,
                tree_roles=tuple(r for r in ("target", needs.tree_role) if r) if kind == "tree" else (),
                looks=needs.looks and kind == "tree")


def check_tree_models(name: str, binding: Binding, roles: tuple[str, ...]) -> None:
    """At bind: the models that verify (target) or grow (draft) a tree must take a tree attention mask."""
    from specbench.decoding.tree_state import tree_mask_refusal

    for role in roles:
        model = binding.models.get(role)
        why = tree_mask_refusal(model) if model is not None else None
        if why is not None:
            label = getattr(model, "name_or_path", "") or role
            raise OptionError(f"method {name!r} verifies trees with tree attention over the {role} model {label!r}, "
                              f"but {why}; use a chain method (vanilla, eagle3) with this pair")
