"""Composing conf/config.yaml outside a Hydra app, config nodes as plain dicts, nested configs as flat key -> value
maps, and the keys where two configs differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from specbench.common.files import CONF_DIR

MISSING = "<missing>"  # the value shown for a key one config lacks


def plain(node: DictConfig, resolve: bool = True) -> dict[str, Any]:
    """A config mapping as plain values (OmegaConf.to_container, interpolations resolved unless not `resolve`)."""
    value = OmegaConf.to_container(node, resolve=resolve)
    assert isinstance(value, dict), f"not a config mapping: {type(node).__name__}"
    return cast(dict[str, Any], value)  # the keys of a config composed from YAML files are strings


def flatten(config: dict, sep: str = ".") -> dict[str, Any]:
    """{'a': {'b': 1}, 'c': [2]} -> {'a.b': 1, 'c': [2]} (pandas.json_normalize; an empty dict adds no key)."""
    return pd.json_normalize(config, sep=sep).to_dict(orient="records")[0] if config else {}


def differing(a: dict, b: dict) -> dict[str, tuple[Any, Any]]:
    """{flattened key: (a's value, b's value)} for every key where two configs differ, sorted; MISSING where absent."""
    fa, fb = flatten(a), flatten(b)
    pairs = {k: (fa.get(k, MISSING), fb.get(k, MISSING)) for k in sorted(set(fa) | set(fb))}
    return {k: (x, y) for k, (x, y) in pairs.items() if x != y}


def differences(a: dict, b: dict) -> list[str]:
    """'key (a-value vs b-value)' for every flattened key where two configs differ."""
    return [f"{k} ({x!r} vs {y!r})" for k, (x, y) in differing(a, b).items()]


def compose_config(overrides: list[str], config_dir: str | Path = CONF_DIR, hydra: bool = False) -> Any:
    """conf/config.yaml composed with Hydra overrides (no sweeps), as run.py composes it; with `hydra` the
    hydra node too (runtime choices, the run folder)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=hydra)
