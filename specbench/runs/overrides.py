"""Command-line overrides checked before Hydra composes them: a mistyped method or dataset option key
(`method.gama=3`) would otherwise get Hydra's advice to add `+` or, added, fail only once the job runs, and a mistyped
top-level key (`limt=5`), added, would run ignoring it; both fail here listing the valid keys, for each choice the
command runs. Any other problem with the overrides is left to Hydra, which reports it itself.

A method is composed on the command line from its preset and parts (`method=vanilla method.parts.drafter=suffix
method.max_depth=8`): a valid `method.<key>` override is passed on as `++method.<key>=...` (`replacing`), so a key
the preset lacks needs no `+` and a key it has takes one without Hydra refusing either.
"""

from __future__ import annotations

import difflib
import logging
import re
from pathlib import Path
from typing import Any, Iterable

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specbench.common.configs import compose_config, plain
from specbench.common.files import CONF_DIR
from specbench.common.options import OptionError, init_options, unknown_options
from specbench.common.registry import UnknownNameError
from specbench.data.dataset import NAME_KEYS, SELECTION_KEYS, evaluator_class
from specbench.runs.identity import ABSENT, at_path

log = logging.getLogger(__name__)

GROUPS = ("method", "dataset")  # the config groups whose keys are the options of a registered class
# Hydra's flags that compose another primary config or search other config folders: top-level keys not checked
CONFIG_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir")
SELECTED = re.compile(r"oc\.select:\s*([A-Za-z_]\w*)")  # ${oc.select:slurm.partition,null}: a key a config reads if set


def valid_keys(group: str, node: dict[str, Any]) -> set[str]:
    """The keys `<group>.<key>` may set: the node's own keys and the constructor options of the class(es) it builds."""
    if group == "method":
        from specbench.decoding.compose import option_names

        return set(node) | option_names(node)
    return set(node) | set(init_options(evaluator_class(node)))


def with_parts(node: dict[str, Any], lines: dict[str, list[str]]) -> dict[str, Any]:
    """A method node with the command line's `method.parts.<part>=<name>` overrides applied to its parts."""
    parts = dict(node.get("parts") or {})
    for line, key in lines.items():
        if key[:2] == ["method", "parts"] and len(key) == 3:
            parts[key[2]] = line.split("=", 1)[1]
    return {**node, "parts": parts}


def replacing(line: str, everywhere: bool) -> str:
    """A `method.<key>=...` line as Hydra takes it: as typed where every method the command runs has the key and it
    has no `+` (a sweep's own values for the key stay overridable); else `++method.<key>=...`, added where a config
    lacks the key and replaced where it has it."""
    return line if everywhere and not line.startswith("+") else "++" + line.lstrip("+")


def group_choices(group: str, overrides: list[Override], cfg: Any) -> list[str]:
    """The choices of `group` the command runs: the command line's (a sweep gives several), else an experiment's
    sweep parameter, else the composed default."""
    for o in overrides:
        if o.key_or_group == group and not o.is_delete():
            return values(o)
    param = OmegaConf.select(cfg, f"hydra.sweeper.params.{group}")
    if param is not None:
        return values(OverridesParser.create().parse_overrides([f"{group}={param}"])[0])
    return [cfg.hydra.runtime.choices[group]]


def values(o: Override) -> list[str]:
    """The values of one parsed override: several for a choice sweep (a,b), one otherwise."""
    return list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(o.value())]


def check_option_overrides(args: list[str], config_dir: Path = CONF_DIR) -> list[str]:
    """Fail, listing the valid keys, for an unknown top-level key (check_top_level_keys) or a method or dataset option
    key (`method.gama=3`, `+dataset.nn=5`) that the chosen method or dataset does not accept; return the arguments
    with each checked `method.<key>` override written as Hydra takes it (`replacing`)."""
    lines = [a for a in args if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(lines)
    except HydraException:
        return args  # Hydra reports the syntax error
    if not any(a.split("=")[0] in CONFIG_FLAGS for a in args):
        check_top_level_keys(lines, parsed, config_dir)
    keyed = {line: o.key_or_group.split(".") for line, o in zip(lines, parsed)
             if o.key_or_group.split(".")[0] in GROUPS and "." in o.key_or_group and not o.is_delete()}
    if not keyed:
        return args
    rest = [line for line, o in zip(lines, parsed) if line not in keyed and not o.is_sweep_override()]
    everywhere = {line: True for line in keyed}  # a method line's key is in every method the command runs
    try:
        cfg = compose_config(rest, config_dir, hydra=True)
        for group in GROUPS:
            given = [(line, key[1]) for line, key in keyed.items() if key[0] == group]
            for name in group_choices(group, parsed, cfg) if given else []:
                same = name == cfg.hydra.runtime.choices[group]
                node = cfg[group] if same else compose_config([*rest, f"{group}={name}"], config_dir, hydra=True)[group]
                plain_node = plain(node, resolve=False)
                check_node(group, with_parts(plain_node, keyed) if group == "method" else plain_node, given)
                for line, _ in given:
                    everywhere[line] = everywhere[line] and at_path(plain_node, keyed[line][1:]) is not ABSENT
    except (HydraException, OmegaConfBaseException, UnknownNameError) as err:  # Hydra or the run reports these
        log.debug("option keys not checked: %s", err)
        return args
    return [replacing(a, everywhere[a]) if keyed.get(a, [""])[0] == "method" else a for a in args]


def check_node(group: str, node: dict[str, Any], given: list[tuple[str, str]]) -> None:
    """Fail naming the overrides in `given` ((line, key) pairs) whose key `node` does not accept (a dataset's
    selection keys are refused later, with their own message)."""
    valid = valid_keys(group, node)
    skip = set(SELECTION_KEYS) if group == "dataset" else set()
    bad = [(line, key) for line, key in given if key not in valid | skip]
    if bad:
        shown = f" ({', '.join(line for line, _ in bad)})"
        if group == "method":
            from specbench.decoding.compose import unknown_option

            raise unknown_option(node, sorted({k for _, k in bad}), shown)
        raise unknown_options(f"{group} {node['name']!r}", sorted({k for _, k in bad}),
                              valid - set(NAME_KEYS) - {"parts"}, shown)


def is_group(loader: Any, key: str) -> bool:
    """Is `key` (pair, hydra/launcher) a config group of the loader's search path?"""
    parent, _, name = key.rpartition("/")
    return name in loader.list_groups(parent)


def selected_keys(config_dir: Path) -> set[str]:
    """The top-level keys the config files read only when set (`${oc.select:slurm.partition,null}`)."""
    return {m for f in Path(config_dir).rglob("*.yaml") for m in SELECTED.findall(f.read_text())}


def choice_values(loader: Any, o: Override) -> list[str]:
    """The choices of one group override: a sweep's values (a glob: every option of the group), else its one."""
    try:
        return values(o)
    except (HydraException, TypeError, ValueError):
        return loader.get_group_options(o.key_or_group)


def composed_keys(loader: Any, groups: list[Override]) -> set[str]:
    """The top-level keys of the config composed with the group overrides, once per value of a swept group."""
    from hydra import compose

    fixed = [f"{o.get_key_element()}={o.value()}" for o in groups if not o.is_sweep_override()]
    runs = [fixed] + [[*fixed, f"{o.get_key_element()}={v}"] for o in groups if o.is_sweep_override()
                      for v in choice_values(loader, o)]
    return {str(k) for overrides in runs for k in compose("config", overrides=overrides)}


def check_top_level_keys(lines: list[str], parsed: list[Override], config_dir: Path = CONF_DIR) -> None:
    """Fail, listing the valid top-level keys, for an override (+, ++, a sweep's) of a top-level key no config has."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    primary = OmegaConf.load(Path(config_dir) / "config.yaml")
    quick = set(primary) - {"defaults"}
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        top_groups = set(loader.list_groups(""))
        keyed: list[tuple[str, Override]] = []
        groups: list[tuple[str, Override]] = []
        for line, o in zip(lines, parsed):
            key = o.key_or_group
            if key.split("/")[0].split(".")[0] == "hydra" or o.is_delete():
                continue  # Hydra's own keys and groups; a deleted key Hydra reports itself
            (groups if is_group(loader, key) else keyed).append((line, o))
        unknown = [(line, o.key_or_group.split(".")[0]) for line, o in keyed
                   if o.key_or_group.split(".")[0] not in quick | top_groups]
        if not unknown:
            return
        try:
            keys = composed_keys(loader, [o for _, o in groups])
        except (HydraException, OmegaConfBaseException) as err:  # a bad group choice: Hydra reports it
            log.debug("top-level keys not checked: %s", err)
            return
    valid = (keys | selected_keys(config_dir) | quick) - top_groups - {"hydra"}
    bad = [(line, key) for line, key in unknown if key not in valid | top_groups]
    if bad:
        raise unknown_top_level(bad, valid, top_groups - {"hydra"})


def unknown_top_level(bad: list[tuple[str, str]], valid: Iterable[str], groups: Iterable[str]) -> OptionError:
    """The error for (line, top-level key) pairs: a close match for each, the valid keys and the config groups."""
    names = sorted({key for _, key in bad})
    groups = [*sorted(groups), "hydra/launcher"]
    known = {name.rpartition("/")[2]: name for name in [*groups, *sorted(valid)]}  # launcher -> hydra/launcher
    close = {k: [known[m] for m in difflib.get_close_matches(k, list(known), n=1)] for k in names}
    hints = [m[0] if len(names) == 1 else f"{m[0]} for {k}" for k, m in close.items() if m]
    return OptionError(
        f"unknown top-level key{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))} "
        f"({', '.join(line for line, _ in bad)}): no config reads {'them' if len(names) > 1 else 'it'}"
        f"{'; did you mean ' + ', '.join(hints) + '?' if hints else '.'} Valid top-level keys: "
        f"{', '.join(sorted(valid))}; config groups (group=name): {', '.join(groups)}; and hydra.* "
        f"(python run.py --help lists them all)")
