"""The run identity, defined once: what makes two configs one run, and which overrides name its folder.

A run's identity is its resolved config without RESUMABLE_KEYS and without the LEGACY_DEFAULTS at their default value.
Everything that compares runs derives from it: the runner's resume check, the report's setting
(specbench.analysis.load.setting_of), the shard groups of specbench.runs.merge and the run folder's name.

The folder's name (`folder_overrides`, by the `specbench.leaf` resolver) is the command-line overrides, as typed, but
those that cannot name it (`names_folder`) and those at their default value: the value the config files give the key
under the same group selections and the other overrides, compared resolved and strictly (1 is neither 1.0 nor true).
So with `method=sd2` `method.gamma=8` (sd2's own γ) names no folder, while with `method=vanilla` (γ 5) it does. Hence
a command with or without a key at its default, run alone or as a sweep's job, resumes one folder.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from collections.abc import Sequence, Set as AbstractSet
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from specbench.common.configs import plain
from specbench.common.files import CONF_DIR

log = logging.getLogger(__name__)

# Config keys that may change between a run and its resumption without changing any row: `task` is always `bench`
# for a benchmark run (older folders lack it); logger / slurm / paths say where results are sent, jobs run and
# folders lie (a drafter folder reaches the rows through method.drafter, which stays in the identity);
# wait_for_lock, resume_any_version, repeats and remeasure how a run treats a folder and its repeats.
RESUMABLE_KEYS = {("limit",), ("warmup",), ("progress",), ("trace",), ("threads",), ("task",),
                  ("logger",), ("slurm",), ("paths",), ("wait_for_lock",), ("resume_any_version",),
                  ("repeats",), ("remeasure",)}

# Keys that joined the run identity after run folders existed, with the value a config without them ran at: left
# out of an identity at that value, so such a folder and a new one at that value are one run.
LEGACY_DEFAULTS = {("batch_size",): 1, ("engine", "compile"): False}

UNNAMED_GROUPS = ("pair", "method", "dataset", "decode", "experiment")  # the folder's path names the first four

# The training tasks (conf/task/): the task key their folder's path names, and the task keys a resumed run
# may change (specbench.training.synth.check_task_resume compares the others).
TASK_PATH_KEY = {"synth": "prompts", "distill": "kind"}
TASK_RESUMABLE = {"synth": ("n",), "distill": ("save_every",)}


def same_value(a: Any, b: Any) -> bool:
    """Equal as JSON: equal values of one type (1 is neither 1.0 nor true)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


ABSENT = object()  # at_path's value for a key that is not there


def at_path(node: Any, path: Sequence[str]) -> Any:
    """The value at the keys `path` below a nested dict, ABSENT where a key on the way is missing."""
    for k in path:
        if not isinstance(node, dict) or k not in node:
            return ABSENT
        node = node[k]
    return node


def _parent(config: dict, path: tuple[str, ...]) -> Any:
    """The node holding the key at `path` (None where a node on the way is missing or not a mapping)."""
    node = at_path(config, path[:-1])
    return node if isinstance(node, dict) else None


def identity(config: dict, drop: AbstractSet[tuple[str, ...]] = frozenset(),
             keep: AbstractSet[tuple[str, ...]] = frozenset()) -> dict:
    """The run identity: a copy of a resolved config without RESUMABLE_KEYS (but `keep`), `drop`, LEGACY_DEFAULTS."""
    out = json.loads(json.dumps(config, default=str))
    for path, value in LEGACY_DEFAULTS.items():
        node = _parent(out, path)
        if node is not None and path[-1] in node and same_value(node[path[-1]], value):
            del node[path[-1]]
            for depth in range(len(path) - 1, 0, -1):  # engine: {} is a config without engine
                up = _parent(out, path[:depth])
                if up is not None and up.get(path[depth - 1]) == {}:
                    del up[path[depth - 1]]
    for path in (set(RESUMABLE_KEYS) - set(keep)) | set(drop):
        node = _parent(out, path)
        if node is not None:
            node.pop(path[-1], None)
    return out


def with_defaults(config: dict) -> dict:
    """A copy of the config with the LEGACY_DEFAULTS it lacks filled in (how identities' differences are shown)."""
    out = json.loads(json.dumps(config, default=str))
    for path, value in LEGACY_DEFAULTS.items():
        node: Any = out
        for k in path[:-1]:
            node = node.setdefault(k, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.setdefault(path[-1], value)
    return out


def names_folder(key: str, task: str = "bench") -> bool:
    """Whether an override of `key` (a dotted key or a group) can name a `task` run's folder: not a selection of
    UNNAMED_GROUPS, a resumable key or one below it (`threads=1`), nor a method's part (run_method names it); a
    training task's `task.*` keys do, but for `task.name`, TASK_PATH_KEY and TASK_RESUMABLE."""
    parts = tuple(key.split("."))
    if len(parts) == 1 and parts[0] in UNNAMED_GROUPS or parts[:2] == ("method", "parts"):
        return False
    if parts[0] == "task" and task in TASK_PATH_KEY:
        return len(parts) > 1 and parts[1] not in ("name", TASK_PATH_KEY[task], *TASK_RESUMABLE[task])
    return not any(parts[:len(p)] == p for p in RESUMABLE_KEYS)


def folder_overrides(cfg: DictConfig) -> list[str]:
    """The overrides of a composed config (hydra node included) that name its run folder, as typed without a leading
    `+` / `++` (adding a key or replacing it names the same run), sorted."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [str(x) for x in cfg.hydra.overrides.task]
    task = str(OmegaConf.select(cfg, "task.name", default="bench"))
    named = [(line, o) for line, o in zip(lines, OverridesParser.create().parse_overrides(lines))
             if names_folder(o.key_or_group, task)]
    if not named:
        return []
    choices = cfg.hydra.runtime.choices
    groups = {line for line, o in named if o.key_or_group in choices}
    keyed = {line for line, _ in named if line not in groups}
    base = tuple(line for line in lines if line not in keyed)  # the config files' values of the named keys
    source = (config_dir(cfg), str(cfg.hydra.job.config_name or "config"))
    out = []
    for line, o in named:
        try:
            if o.is_delete():
                default = False
            elif line in groups:  # a selection: the option chosen without it
                without = composed(tuple(x for x in base if x != line), *source)[1]
                default = without.get(o.key_or_group) == choices[o.key_or_group]
            else:
                default = key_at_default(cfg, o.key_or_group, composed(base, *source)[0])
        except Exception as e:  # noqa: BLE001 - a config that does not compose names its folder as typed
            log.warning("run folder name: cannot tell whether %s is a default value (%s); it names the folder", line, e)
            default = False
        if not default:
            out.append(line.lstrip("+"))
    return sorted(out)


def key_at_default(cfg: DictConfig, key: str, base: dict) -> bool:
    """Whether `key` holds the value `base` (the config files' config, unresolved) gives it, resolved in `cfg`."""
    node = at_path(base, key.split("."))
    if node is ABSENT:
        return False  # a key the config files lack (+key=...)
    if "${" in json.dumps(node, default=str):  # an interpolation: resolve it as this config would
        alt = copy.deepcopy(cfg)
        with read_write(alt), open_dict(alt):
            OmegaConf.update(alt, key, node, merge=False)
        node = resolved(alt, key)
    return same_value(resolved(cfg, key), node)


def resolved(cfg: DictConfig, key: str) -> Any:
    """The value at a dotted key, interpolations resolved, as plain Python values."""
    value = OmegaConf.select(cfg, key, throw_on_missing=True)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def config_dir(cfg: DictConfig) -> str:
    """The folder the config was composed from (its main config source), else the package's conf/."""
    for source in cfg.hydra.runtime.get("config_sources") or []:
        if source.get("provider") == "main" and source.get("schema") == "file":
            return str(source.path)
    return str(CONF_DIR)


@functools.lru_cache(maxsize=64)
def composed(overrides: tuple[str, ...], directory: str, name: str) -> tuple[dict, dict]:
    """(config without hydra node, unresolved; runtime choices) composed in the running app, else from `directory`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def make() -> tuple[dict, dict]:
        c = compose(name, list(overrides), return_hydra_config=True)
        config = plain(c, resolve=False)
        return {k: v for k, v in config.items() if k != "hydra"}, config["hydra"]["runtime"]["choices"]

    if GlobalHydra.instance().is_initialized():
        return make()
    with initialize_config_dir(config_dir=directory, version_base="1.3"):
        return make()
