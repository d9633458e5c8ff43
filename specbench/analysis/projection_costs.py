"""The projection's costs against the run's own (`python -m specbench.report DIR --profile PROFILE`), so a
projection's distance from the measured speedup can be read off where it comes from: a profile whose forwards cost
otherwise than the run's (another machine, another load, a verify that returns hidden states)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbench.analysis.baselines import baseline_or_refusal
from specbench.analysis.selection import Group
from specbench.analysis.tables import Table
from specbench.runs.projection import ProfileError, at_own_forwards, price

COLUMNS = ["iterations", "verify ms (run)", "verify ms (profile)", "verify run / profile - 1", "draft ms (run)",
           "draft ms (profile)", "draft run / profile - 1", "host ms (run)", "projected at the run's own forwards"]


@dataclass
class Projection:
    """A cost profile (specbench.decoding.profiles.read) the overview projects every run's iterations onto, and the
    profile pair the user named (--profile-pair; None: the run's own pair, by its shapes or name)."""

    profile: dict
    pair: str | None = None

    @property
    def column(self) -> str:
        """The overview column of the projection: 'at <the profile's name>'."""
        return f"at {self.profile['name']}"


def costs_table(group: Group, projection: Projection) -> Table:
    """One row per run of the group with recorded iterations: the mean ms of an iteration's verify and draft forwards,
    measured (rows older than the host split: the phases') and at the profile (runs.projection.price), their relative
    differences, the run's host work outside the forwards, which the projection keeps as measured, and the projection
    at the run's own in-loop forward costs (runs.projection.at_own_forwards: the formula's error apart)."""
    runs = group.runs
    where = runs["pair"] + " · " + runs["dataset"] + " · batch_size=" + runs["batch_size"].astype(str)
    index = pd.MultiIndex.from_arrays([where, runs["label"]])
    columns = pd.MultiIndex.from_product([[""], COLUMNS])
    v = pd.DataFrame(np.nan, index=index, columns=columns)
    cells = pd.DataFrame("", index=index, columns=columns)
    for at, (_, r) in zip(index, runs.iterrows()):
        base, _ = baseline_or_refusal(r, runs, "ar")
        try:
            got = price(r, projection.profile, projection.pair) if r["call_stats"] is not None else None
        except ProfileError:
            got = None  # the overview reports the refusal
        if not isinstance(got, dict):
            continue
        draft_profile = np.nan if got["draft_profile"] is None else got["draft_profile"]
        nums = {"iterations": got["iterations"], "verify ms (run)": 1e3 * got["verify_run"],
                "verify ms (profile)": 1e3 * got["verify_profile"], "draft ms (run)": 1e3 * got["draft_run"],
                "draft ms (profile)": 1e3 * draft_profile,
                "host ms (run)": np.nan if got["host_run"] is None else 1e3 * got["host_run"]}
        own = at_own_forwards(r["call_stats"], None if base is None else base["call_stats"]) if r["drafted_total"] else None
        nums["projected at the run's own forwards"] = np.nan if own is None else own
        nums["verify run / profile - 1"] = got["verify_run"] / got["verify_profile"] - 1
        nums["draft run / profile - 1"] = (got["draft_run"] / draft_profile - 1) if draft_profile else np.nan
        for c in COLUMNS:
            x = nums[c]
            v.loc[at, ("", c)] = x
            cells.loc[at, ("", c)] = ("" if np.isnan(x) else f"{int(x)}" if c == "iterations" else
                                   f"{x:.2f}" if c == "projected at the run's own forwards" else
                                   f"{x:+.1%}" if c.endswith("- 1") else f"{x:.2f}")
    title = (f"Projection's costs against the run's: an iteration's verify and draft forwards, mean ms measured in "
             f"the run and at the cost profile {projection.profile['name']!r} for the same calls, and the run's host "
             "work outside them (kept as measured in the projection)")
    return Table("projection_costs", title, v, cells, index_names=("pair · dataset · batch_size", "run"))
