"""A method built from its config: the parts conf/method/<name>.yaml names and the options each part takes.

    parts: {policy: vanilla, drafter: eagle3, shape: dynamic_tree, rule: rejection}   # each a registered name
    depth: 5        # the dynamic_tree shape's option
    head: ...       # the eagle3 drafter's

A missing part is the preset's (conf/method/<name>.yaml), else the default: the policy is the config's `name` (a
registered policy, specbench.decoding.policy.POLICIES), the drafter `draft_model` (the pair's draft), the shape `chain`,
the rule `rejection`. A config given without `parts` (a test's dict, `build_method({"name": "spec_tree"})`) also takes
the plain option values of its preset (values that interpolate other keys are left to the parts' defaults). Each
option goes to the part whose constructor names it (shape, then drafter, then policy); one that none takes fails
naming the parts and each part's valid options.

A method whose parts differ from its preset's (`method=vanilla method.parts.drafter=suffix`) is named by them:
`method_label` gives `vanilla+drafter=suffix`, the name its rows, folder and report rows carry.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import yaml

from specbench.common.files import CONF_DIR
from specbench.common.options import OptionError, check_options, init_options
from specbench.decoding.method import LOOPS, Method
from specbench.decoding.parts import DRAFTERS, SHAPES, Drafter, Shape
from specbench.decoding.plan import make_plan
from specbench.decoding.policy import POLICIES, Policy

PART_KEYS = ("policy", "drafter", "shape", "rule")
NOT_OPTIONS = ("name", "parts", "loop")  # the keys of a method's config that are not options of a part


@functools.lru_cache(maxsize=None)
def preset(name: str) -> dict[str, Any]:
    """conf/method/<name>.yaml as written ({} for a name without one)."""
    path = CONF_DIR / "method" / f"{name}.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def method_names() -> list[str]:
    """Every method a run can name: the configs in conf/method/ and the registered policies."""
    return sorted({p.stem for p in (CONF_DIR / "method").glob("*.yaml")} | set(POLICIES.names()))


def without_draft() -> list[str]:
    """The methods that run on a pair without a draft model (`pair.draft=null`): those whose roles leave it out."""
    out = []
    for name in method_names():
        try:
            method = build({"name": name})
        except OptionError:  # a registered policy that needs options of its own
            continue
        if "draft" not in method.plan.roles:
            out.append(name)
    return out


def check_draft(pair: dict[str, Any], method: Method) -> None:
    """Before loading: a pair without a draft model (`pair.draft` null) runs only the methods that need none."""
    if pair.get("draft") or "draft" not in method.plan.roles:
        return
    raise OptionError(f"pair {pair.get('name')!r} has no draft model (pair.draft is null), and method {method.name!r} "
                      f"drafts with it; methods that run there: {', '.join(without_draft())}")


def with_parts(cfg: dict[str, Any]) -> dict[str, Any]:
    """cfg with its preset's parts where it names none."""
    given = cfg.get("parts")
    if given is not None and not isinstance(given, Mapping):
        raise OptionError(f"method.parts must map some of {', '.join(PART_KEYS)} to registered names, got {given!r}")
    return {**cfg, "parts": {**(preset(cfg["name"]).get("parts") or {}), **(given or {})}}


def with_preset(cfg: dict[str, Any]) -> dict[str, Any]:
    """cfg with its preset's parts where it names none, and the preset's plain option values (not interpolations)
    that one of its parts takes where it sets none (a composed config has them all already, but for those a part
    change makes inapplicable, which it keeps: build names them)."""
    cfg = with_parts(cfg)
    taken = {k for opts in part_options(cfg).values() for k in opts}
    plain = {k: v for k, v in preset(cfg["name"]).items()
             if k in taken and not (isinstance(v, str) and "${" in v)}
    return {**plain, **cfg}


def part_names(cfg: dict[str, Any]) -> dict[str, str]:
    """The names of cfg's policy, drafter, shape and rule (the preset's or the defaults where cfg names none)."""
    given = with_parts(cfg)["parts"]
    unknown = sorted(set(given) - set(PART_KEYS))
    if unknown:
        raise OptionError(f"method.parts.{unknown[0]}: a method's parts are {', '.join(PART_KEYS)}; got {given!r}")
    for key, value in given.items():
        if value is not None and not (isinstance(value, str) and value):
            raise OptionError(f"method.parts.{key} must be a registered name (a string), got {value!r}")
    return {"policy": given.get("policy") or cfg["name"], "drafter": given.get("drafter") or "draft_model",
            "shape": given.get("shape") or "chain", "rule": given.get("rule") or "rejection"}


def method_label(cfg: dict[str, Any]) -> str:
    """The method's name: its config's `name`, plus each part that differs from that preset's
    (`vanilla+drafter=suffix`, `gammatune+drafter=suffix+rule=block`)."""
    mine, base = part_names(cfg), part_names({"name": cfg["name"]})
    return "".join([cfg["name"], *(f"+{k}={mine[k]}" for k in PART_KEYS if mine[k] != base[k])])


def loop_name(cfg: dict[str, Any]) -> str | None:
    """The loop that decodes cfg's method instead of the engine (`loop: hf_assisted` in its preset), or None."""
    return cfg.get("loop") or preset(cfg["name"]).get("loop")


def part_classes(cfg: dict[str, Any]) -> dict[str, type]:
    """The classes of cfg's policy, drafter and shape by key, or of its loop (an unknown name fails listing the
    registered ones)."""
    loop = loop_name(cfg)
    if loop:
        return {"loop": LOOPS.get(loop)}
    names = part_names(cfg)
    return {"policy": POLICIES.get(names["policy"]), "drafter": DRAFTERS.get(names["drafter"]),
            "shape": SHAPES.get(names["shape"])}


def part_options(cfg: dict[str, Any]) -> dict[str, list[str]]:
    """Each part's options by part key ('policy vanilla' -> [gamma, persist, ...])."""
    names = {**part_names(cfg), "loop": loop_name(cfg)}
    return {f"{key} {names[key]}": sorted(set(init_options(cls)) - set(NOT_OPTIONS))
            for key, cls in part_classes(cfg).items()}


def option_names(cfg: dict[str, Any]) -> set[str]:
    """Every key `method.<key>` may set for cfg: name, parts and its parts' options."""
    return {"name", "parts"} | {k for opts in part_options(cfg).values() for k in opts}


def unknown_option(cfg: dict[str, Any], keys: list[str], given: str = "") -> OptionError:
    """The error for option keys none of cfg's parts takes: the method, each part and the part's valid options."""
    hint = [f"the {k} is a part: method.parts.{k}" for k in keys if k in PART_KEYS]
    hint += [f"{k} is an option of the preset {cfg['name']!r}: drop it with ~method.{k}" for k in keys
             if k in preset(cfg["name"]) and k not in PART_KEYS]
    valid = "; ".join(f"{part}: {', '.join(opts) or 'none'}" for part, opts in part_options(cfg).items())
    return OptionError(f"method {method_label(cfg)!r} got unknown options {sorted(keys)}{given}"
                       f"{' (' + '; '.join(hint) + ')' if hint else ''}; each part's valid options: {valid}")


def build(cfg: dict[str, Any]) -> Method:
    """The method cfg describes: each part built with its options (checked against its constructor's type hints,
    the error naming `method.<key>` and the method), and the plan of the four."""
    cfg = with_preset(cfg)
    names, classes, label = part_names(cfg), part_classes(cfg), method_label(cfg)
    owned: dict[str, dict[str, Any]] = {key: {} for key in classes}
    for k, v in cfg.items():
        if k in NOT_OPTIONS:
            continue
        owner = next((key for key in ("loop", "shape", "drafter", "policy")
                      if key in classes and k in init_options(classes[key]) and k not in NOT_OPTIONS), None)
        if owner is None:
            raise unknown_option(cfg, [k])
        owned[owner][k] = v
    what = f"method {label!r}"
    try:
        parts = {key: cls(**check_options(cls, owned[key], "method", what)) for key, cls in classes.items()}
        if "loop" in parts:  # another library's loop: the engine's parts stay idle
            policy, drafter, shape = POLICIES.get("ar")(), DRAFTERS.get("none")(), SHAPES.get("chain")()
            plan = make_plan(names, policy, parts["loop"].needs, shape, external=True)
            return Method(label, policy, drafter, shape, plan, parts["loop"])
        return compose(parts["policy"], parts["drafter"], parts["shape"], names["rule"], label, names["drafter"])
    except OptionError as err:
        raise OptionError(f"{err} ({what})" if what not in str(err) else str(err)) from None


def compose(policy: Policy, drafter: Drafter, shape: Shape, rule: str = "rejection", name: str = "composed",
            drafter_name: str = "") -> Method:
    """The method of parts built by hand (tests, notebooks), its plan derived as for a config's."""
    names = {"policy": name, "drafter": drafter_name or type(drafter).__name__, "shape": shape.name, "rule": rule}
    return Method(name, policy, drafter, shape, make_plan(names, policy, drafter.needs, shape))
