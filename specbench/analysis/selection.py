"""Telling runs apart and selecting them: each run's label, the comparable groups of a runs table (runs that share
their setting but for the table axes) and the `--where` expressions that select a run or a group; plus
`ReportError`, the report's refusal of a comparison or table.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Iterable

import pandas as pd
import yaml

from specbench.common.configs import MISSING, flatten
from specbench.runs.identity import RESUMABLE_KEYS

# the table axes: a table spans pairs, datasets, seeds and batch sizes; every other setting key must agree within it
AXES = ("pair.", "dataset.", "decode.seed", "batch_size")
PAIR_SETTINGS = ("pair.target.dtype", "pair.draft.dtype", "pair.dtype")  # pair keys that split groups, not axes
# keys that say how a run ran, not what it measured (the resumable keys): never part of a label
RUNTIME = tuple(".".join(k) for k in sorted(RESUMABLE_KEYS))


class ReportError(ValueError):
    """A comparison or table the report refuses to make (mismatched or ambiguous runs)."""


def select(runs: pd.DataFrame, keep: Iterable[bool]) -> pd.DataFrame:
    """runs[keep] for a per-run list of booleans (also when runs is empty)."""
    return runs[pd.Series(list(keep), index=runs.index, dtype=bool)]


def slug(*parts: str) -> str:
    """Parts joined by '__' with every run of characters outside [A-Za-z0-9_.=+-] made '_' (file names)."""
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", "__".join(parts)).strip("_")


def _is(key: str, prefixes: tuple[str, ...]) -> bool:
    """key is one of prefixes or lies under one (e.g. 'logger.mode' under 'logger')."""
    return any(key == p or key.startswith(p.rstrip(".") + ".") for p in prefixes)


def differing_keys(flats: Iterable[dict], skip: tuple[str, ...] = ()) -> list[str]:
    """The flat keys whose values are not all equal over the configs (a missing key counts as a value), sorted."""
    flats = list(flats)
    keys = {k for f in flats for k in f if not _is(k, skip)}
    return sorted(k for k in keys if len({json.dumps(f.get(k, MISSING), default=str) for f in flats}) > 1)


def labels(runs: pd.DataFrame, skip: tuple[str, ...] = ()) -> list[str]:
    """Method name, plus the config values that tell apart its runs on one pair and dataset (e.g. 'vanilla gamma=8'),
    but runtime-only keys (threads, trace, limit, ...), the device and the `skip` keys (shown elsewhere); runs the
    config does not tell apart (other examples, another device) share a label (`unique_labels` tells them apart)."""
    out = []
    for _, run in runs.iterrows():
        same = runs[(runs["method"] == run["method"]) & (runs["pair"] == run["pair"])
                    & (runs["dataset"] == run["dataset"])]
        keys = differing_keys(same["flat"], RUNTIME + ("device_info.", "pair.", "dataset.", "method.parts.") + skip)
        out.append(" ".join([run["method"], *(f"{k.split('.')[-1]}={run['flat'].get(k)}" for k in keys)]))
    return out


def unique_labels(runs: pd.DataFrame, skip: tuple[str, ...] = ()) -> list[str]:
    """`labels`, each with its run's folder added (relative to the folder the runs sharing it share,
    'ar [all/ar]') where runs of one pair and dataset, with one value of every `skip` key, share one."""
    names = labels(runs, skip)
    shown = [json.dumps([r["pair"], r["dataset"], name, {k: v for k, v in r["flat"].items() if _is(k, skip)}],
                        sort_keys=True, default=str) for (_, r), name in zip(runs.iterrows(), names)]
    out = list(names)
    for key in set(shown):
        at = [i for i, k in enumerate(shown) if k == key]
        if len(at) < 2:
            continue
        dirs = [str(runs["run_dir"].iloc[i]) for i in at]
        rel = [os.path.relpath(d, os.path.commonpath(dirs)) for d in dirs]
        if len(set(rel)) < len(rel):  # one folder twice: number them
            rel = [f"{r} #{n}" for n, r in enumerate(rel, 1)]
        for i, r in zip(at, rel):
            out[i] = f"{names[i]} [{r}]"
    return out


def where_value(value: Any) -> str:
    """A config value written so that `where` reads it back equal (YAML: null, true, 1.0, [1, 2], text)."""
    if isinstance(value, str) and yaml.safe_load(value) == value and "=" not in value:
        return value
    return json.dumps(value)


def where_exprs(flat: dict, keys: list[str]) -> list[str]:
    """The `--where KEY=VALUE` expressions on keys that select a run with these flat config values (keys it lacks
    are left out)."""
    return [f"{k}={where_value(flat[k])}" for k in keys if k in flat]


def where_args(exprs: list[str]) -> str:
    """The expressions as command-line arguments: --where 'a=1' --where b=2 (shell-quoted)."""
    return " ".join(f"--where {shlex.quote(e)}" for e in exprs)


@dataclass
class Group:
    """Runs comparable in one table: the same setting but for the table axes (pair, dataset, seed, batch_size)."""

    runs: pd.DataFrame
    keys: list[str]  # the setting keys whose values tell this group from the others
    where: list[str]  # `--where` expressions that select this group alone
    title: str  # what the group's runs decoded with, e.g. 'greedy' or 't1, max_new_tokens=32'


def _comparable(run: pd.Series) -> dict:
    """The run's setting without the table axes, flat (a pair's dtypes stay: runs in another dtype are another
    group, as their rows would otherwise share one label)."""
    return {k: v for k, v in flatten(json.loads(run["setting"])).items() if not _is(k, AXES) or k in PAIR_SETTINGS}


def _decode_title(runs: pd.DataFrame, keys: list[str]) -> str:
    """'greedy', 't1, max_new_tokens=32': the decode config's name plus the group's other distinguishing values;
    the temperature is left out where the decode name fixes it."""
    names = sorted({str(d) for d in runs["decode"] if d is not None and d == d})
    flat = runs["flat"].iloc[0]
    shown = [k for k in keys if not (k == "decode.temperature" and names)]
    return ", ".join([*names, *(f"{k.split('.')[-1]}={flat.get(k, MISSING)}" for k in shown)]) or "all runs"


def groups(runs: pd.DataFrame) -> list[Group]:
    """Runs split into groups with equal setting but for the table axes, the largest first."""
    comp = [_comparable(r) for _, r in runs.iterrows()]
    keys = differing_keys(comp)
    ids = [json.dumps([c.get(k, MISSING) for k in keys], default=str) for c in comp]
    out = []
    for gid in sorted(set(ids), key=lambda g: (-ids.count(g), g)):
        mine = select(runs, (i == gid for i in ids))
        out.append(Group(mine, keys, where_exprs(comp[ids.index(gid)], keys), _decode_title(mine, keys)))
    return out
