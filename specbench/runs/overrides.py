"""Command-line overrides checked before Hydra composes them.

A mistyped option key of the method or the dataset would otherwise get Hydra's advice to add `+`
(`method.gama=3`) or, added (`+method.gama=3`), fail only once the job runs. `check_option_overrides`
finds every `method.<key>` / `dataset.<key>` override (with or without `+` / `++`) whose key the chosen
method or dataset does not accept, for each choice the command runs (a sweep's values, an
experiment's sweep parameters, else the composed default), and fails listing the valid keys: the
config node's own keys and the options of the class it builds (its constructor's parameters). Any
other problem with the overrides is left to Hydra, which reports it itself.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specbench.common.configs import compose_config
from specbench.common.files import CONF_DIR
from specbench.common.options import init_options, unknown_options
from specbench.common.registry import UnknownNameError
from specbench.data.dataset import NAME_KEYS, SELECTION_KEYS, evaluator_class
from specbench.decoding.method import METHODS

log = logging.getLogger(__name__)

GROUPS = ("method", "dataset")  # the config groups whose keys are the options of a registered class


def valid_keys(group: str, node: dict[str, Any]) -> set[str]:
    """The keys `<group>.<key>` may set: the node's own keys and the constructor options of the class it builds."""
    cls = METHODS.get(node["name"]) if group == "method" else evaluator_class(node)
    return set(node) | set(init_options(cls))


def group_choices(group: str, overrides: list[Override], cfg: Any) -> list[str]:
    """The choices of `group` the command runs: the command line's (a sweep gives several), else an experiment's
    sweep parameter, else the composed default."""
    for o in overrides:
        if o.key_or_group == group and not o.is_delete():
            return values(o)
    param = OmegaConf.select(cfg, f"hydra.sweeper.params.{group}")
    if param is not None:
        return choices_of(f"{group}={param}")
    return [cfg.hydra.runtime.choices[group]]


def values(o: Override) -> list[str]:
    """The values of one parsed override: several for a choice sweep (a,b), one otherwise."""
    return list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(o.value())]


def choices_of(line: str) -> list[str]:
    """The values of one override line (values of its parse)."""
    return values(OverridesParser.create().parse_overrides([line])[0])


def check_option_overrides(args: list[str], config_dir: Path = CONF_DIR) -> None:
    """Fail, listing the valid keys, for a method or dataset option key (`method.gama=3`, `+dataset.nn=5`) that
    the chosen method or dataset does not accept; every other override is left to Hydra."""
    lines = [a for a in args if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(lines)
    except HydraException:
        return  # Hydra reports the syntax error
    keyed = {line: o.key_or_group.split(".") for line, o in zip(lines, parsed)
             if o.key_or_group.split(".")[0] in GROUPS and "." in o.key_or_group and not o.is_delete()}
    if not keyed:
        return
    rest = [line for line, o in zip(lines, parsed) if line not in keyed and not o.is_sweep_override()]
    try:
        cfg = compose_config(rest, config_dir, hydra=True)
        for group in GROUPS:
            given = [(line, key[1]) for line, key in keyed.items() if key[0] == group]
            for name in group_choices(group, parsed, cfg) if given else []:
                same = name == cfg.hydra.runtime.choices[group]
                node = cfg[group] if same else compose_config([*rest, f"{group}={name}"], config_dir, hydra=True)[group]
                check_node(group, OmegaConf.to_container(node, resolve=False), given)
    except (HydraException, OmegaConfBaseException, UnknownNameError) as err:  # Hydra or the run reports these
        log.debug("option keys not checked: %s", err)


def check_node(group: str, node: dict[str, Any], given: list[tuple[str, str]]) -> None:
    """Fail naming the overrides in `given` ((line, key) pairs) whose key `node` does not accept (a dataset's
    selection keys are refused later, with their own message)."""
    valid = valid_keys(group, node)
    skip = set(SELECTION_KEYS) if group == "dataset" else set()
    bad = [(line, key) for line, key in given if key not in valid | skip]
    if bad:
        shown = f" ({', '.join(line for line, _ in bad)})"
        raise unknown_options(f"{group} {node['name']!r}", sorted({k for _, k in bad}), valid - set(NAME_KEYS), shown)
