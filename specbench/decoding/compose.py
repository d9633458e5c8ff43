"""A method built from its config: the parts conf/method/<name>.yaml names and the options each part takes.

    parts: {policy: vanilla, drafter: eagle3, shape: dynamic_tree}   # each a registered name
    depth: 5        # the dynamic_tree shape's option
    head: ...       # the eagle3 drafter's
    rule: rejection # the policy's (Method's)

A missing part is the default: the policy is the config's `name` (a registered policy, specbench.decoding.method.
METHODS), the drafter `draft_model` (the pair's draft), the shape `chain`. A config given without `parts` (a test's
dict, `build_method({"name": "spec_tree"})`) takes the parts, and the plain option values, of conf/method/<name>.yaml
(values that interpolate other keys are left to the parts' defaults). Each option goes to the part whose
constructor names it (shape, then drafter, then policy); one that none takes fails listing every valid key.
"""

from __future__ import annotations

import functools
from typing import Any

import yaml

from specbench.common.files import CONF_DIR
from specbench.common.options import OptionError, check_options, init_options, unknown_options
from specbench.decoding.method import METHODS, Method
from specbench.decoding.parts import DRAFTERS, SHAPES, Parts

PART_KEYS = ("policy", "drafter", "shape")


@functools.lru_cache(maxsize=None)
def preset(name: str) -> dict[str, Any]:
    """conf/method/<name>.yaml as written ({} for a name without one)."""
    path = CONF_DIR / "method" / f"{name}.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def method_names() -> list[str]:
    """Every method a run can name: the configs in conf/method/ and the registered policies."""
    return sorted({p.stem for p in (CONF_DIR / "method").glob("*.yaml")} | set(METHODS.names()))


def without_draft() -> list[str]:
    """The methods that run on a pair without a draft model (`pair.draft=null`): those whose roles leave it out."""
    out = []
    for name in method_names():
        try:
            method = build({"name": name})
        except OptionError:  # a registered policy that needs options of its own
            continue
        if "draft" not in method.roles:
            out.append(name)
    return out


def check_draft(pair: dict[str, Any], method: Method) -> None:
    """Before loading: a pair without a draft model (`pair.draft` null) runs only the methods that need none."""
    if pair.get("draft") or "draft" not in method.roles:
        return
    raise OptionError(f"pair {pair.get('name')!r} has no draft model (pair.draft is null), and method {method.name!r} "
                      f"drafts with it; methods that run there: {', '.join(without_draft())}")


def with_preset(cfg: dict[str, Any]) -> dict[str, Any]:
    """cfg completed from its preset when it names no parts: the preset's parts and plain option values."""
    if "parts" in cfg:
        return cfg
    base = preset(cfg["name"])
    plain = {k: v for k, v in base.items() if not (isinstance(v, str) and "${" in v)}
    return {**plain, **cfg}


def part_names(cfg: dict[str, Any]) -> dict[str, str]:
    """The names of cfg's policy, drafter and shape (defaults filled in); an unknown part key fails."""
    given = cfg.get("parts") or {}
    if not isinstance(given, dict) or set(given) - set(PART_KEYS):
        raise OptionError(f"method.parts must map some of {', '.join(PART_KEYS)} to registered names, got {given!r}")
    return {"policy": given.get("policy") or cfg["name"], "drafter": given.get("drafter") or "draft_model",
            "shape": given.get("shape") or "chain"}


def part_classes(cfg: dict[str, Any]) -> dict[str, type]:
    """The classes of cfg's parts by key (an unknown name fails listing the registered ones)."""
    names = part_names(with_preset(cfg))
    return {"policy": METHODS.get(names["policy"]), "drafter": DRAFTERS.get(names["drafter"]),
            "shape": SHAPES.get(names["shape"])}


def option_names(cfg: dict[str, Any]) -> set[str]:
    """Every key `method.<key>` may set for cfg: name, parts and its parts' options."""
    return {"name", "parts"} | {k for cls in part_classes(cfg).values() for k in init_options(cls)}


def build(cfg: dict[str, Any]) -> Method:
    """The method cfg describes: each part built with its options (checked against its constructor's type hints,
    the error naming `method.<key>` and the method)."""
    cfg = with_preset(cfg)
    name, classes = cfg["name"], part_classes(cfg)
    options = {k: v for k, v in cfg.items() if k not in ("name", "parts")}
    owned: dict[str, dict[str, Any]] = {key: {} for key in PART_KEYS}
    for k, v in options.items():
        owner = next((key for key in ("shape", "drafter", "policy") if k in init_options(classes[key])), None)
        if owner is None:
            raise unknown_options(f"method {name!r}", [k], option_names(cfg) - {"name", "parts"})
        owned[owner][k] = v
    what = f"method {name!r}"
    try:
        shape = classes["shape"](**check_options(classes["shape"], owned["shape"], "method", what))
        drafter = classes["drafter"](**check_options(classes["drafter"], owned["drafter"], "method", what))
    except OptionError as err:
        raise OptionError(f"{err} ({what})" if what not in str(err) else str(err)) from None
    policy = check_options(classes["policy"], owned["policy"], "method", what)
    return classes["policy"](parts=Parts(drafter, shape), name=name, **policy)
