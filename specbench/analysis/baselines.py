"""Speedups: a method's runs by name and options (`MethodSpec`), and each run's baseline run among a runs table.

A speedup divides a run's tokens_per_s by that of one baseline run with the same *setting* (specbench.analysis.load
.setting_of: pair, dataset, decode settings, seed, batch_size and device), on the example ids both hold (the tables
restrict the runs they compare to those: specbench.analysis.shared). Git hash and package versions are recorded per
run but not compared: a sweep may span commits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd
import yaml

from specbench.analysis import shared
from specbench.analysis.selection import ReportError, select
from specbench.common.configs import differences


@dataclass(frozen=True)
class MethodSpec:
    """A method name plus option values a run must have, written `name` or `name:key=value,key=value`."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, text: str | MethodSpec) -> MethodSpec:
        """'vanilla:gamma=8' -> MethodSpec('vanilla', (('gamma', 8),)); values are parsed as YAML scalars."""
        if isinstance(text, MethodSpec):
            return text
        name, _, rest = str(text).partition(":")
        opts = []
        for item in filter(None, rest.split(",")):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ReportError(f"baseline {text!r}: options must look like key=value (e.g. vanilla:gamma=8)")
            opts.append((key.strip(), yaml.safe_load(value)))
        if not name.strip():
            raise ReportError(f"baseline {text!r}: no method name (e.g. vanilla or vanilla:gamma=8)")
        return cls(name.strip(), tuple(opts))

    def matches(self, run: pd.Series) -> bool:
        """The run is this method with these option values."""
        return run["method"] == self.name and all(run["options"].get(k) == v for k, v in self.options)

    def runs_in(self, runs: pd.DataFrame) -> pd.DataFrame:
        """The runs that `matches` (also when runs is empty)."""
        return select(runs, (self.matches(r) for _, r in runs.iterrows()))

    def __str__(self) -> str:
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in self.options) if self.options else "")


def full_setting(run: pd.Series) -> dict:
    """The run's setting with its batch_size also where it is 1 (for naming differences)."""
    return {"batch_size": int(run["batch_size"]), **json.loads(run["setting"])}


def find_baseline(run: pd.Series, runs: pd.DataFrame, baseline: str | MethodSpec) -> pd.Series | None:
    """The baseline run with run's pair, dataset and setting (of several, the one over the run's examples); None if
    the pair and dataset have no baseline run. ReportError, naming the differing keys, if baseline runs exist but none
    has the same setting, or, with the command that runs the missing examples, if it shares no example id with run."""
    spec = MethodSpec.parse(baseline)
    cands = spec.runs_in(runs[(runs["pair"] == run["pair"]) & (runs["dataset"] == run["dataset"])])
    if cands.empty:
        return None
    same = cands[cands["setting"] == run["setting"]]
    if len(same) > 1:  # runs of one setting over other examples (limit): the one over the run's examples
        mine = select(same, (ids == run["example_ids"] for ids in same["example_ids"]))
        same = mine if len(mine) else same
    if len(same) > 1:
        raise ReportError(f"baseline {spec} is ambiguous for {run['run_dir']}: {', '.join(same['run_dir'])} "
                          "have the same setting; give its options (e.g. --baseline vanilla:gamma=5)")
    if len(same) == 1:
        base = same.iloc[0]
        if not shared.held(base) & shared.held(run):
            raise ReportError(f"refusing to compare {run['run_dir']} with baseline {base['run_dir']}: they share no "
                              f"example id ({len(shared.held(run))} and {len(shared.held(base))} examples); run the "
                              f"baseline over the run's examples: {shared.command(base, like=run)}")
        return base
    mine = full_setting(run)
    diffs, other = min(((differences(mine, full_setting(c)), c["run_dir"]) for _, c in cands.iterrows()),
                       key=lambda d: len(d[0]))  # the closest baseline run
    raise ReportError(f"refusing to compare {run['run_dir']} ({run['method']}) with baseline {spec} at {other}: "
                      f"they differ in {'; '.join(diffs)}. A speedup needs the same pair, dataset, decode "
                      "settings, seed, batch_size and device; run the baseline with those settings or select runs "
                      "with --where.")


def baseline_or_refusal(run: pd.Series, runs: pd.DataFrame, baseline: str | MethodSpec) -> tuple[pd.Series | None, str]:
    """(find_baseline, "") or, where it refuses the baseline run, (None, why)."""
    try:
        return find_baseline(run, runs, baseline), ""
    except ReportError as e:
        return None, str(e)


def speedup_over(run: pd.Series, base: pd.Series | None) -> float:
    """median tokens_per_s of run / that of the baseline run `base` (NaN without one), on the examples both hold
    (each `shared.restricted` to them where it holds others)."""
    if base is None:
        return float("nan")
    ids = shared.held(run) & shared.held(base)
    run, base = shared.restricted(run, ids), shared.restricted(base, ids)
    return run["tokens_per_s_median"] / base["tokens_per_s_median"]
