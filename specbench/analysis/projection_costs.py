"""The projection's costs against the run's own (`python -m specbench.report DIR --profile PROFILE`), so a
projection's distance from the measured speedup can be read off where it comes from: a profile whose forwards cost
otherwise than the run's (another machine, another load, a verify that returns hidden states)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.analysis.baselines import baseline_or_refusal
from specbench.analysis.selection import Group
from specbench.analysis.tables import Table
from specbench.runs import roofline
from specbench.runs.projection import Entry, ProfileError, at_own_forwards, mean_context, price, read

COLUMNS = ["iterations", "verify ms (run)", "verify ms (profile)", "verify run / profile - 1", "draft ms (run)",
           "draft ms (profile)", "draft run / profile - 1", "host ms (run)", "projected at the run's own forwards"]


@dataclass
class Projection:
    """A cost profile (specbench.decoding.profiles.read) the overview projects every run's iterations onto, and the
    profile pair the user named (--profile-pair; None: the run's own pair, by its shapes or name)."""

    profile: dict
    pair: str | None = None
    tables: tuple[Table, ...] = ()  # shown once after the overviews (roofline: the measured profiles' ratios)
    notes: tuple[str, ...] = ()  # said once in the report's notes

    @property
    def column(self) -> str:
        """The overview column of the projection: 'at <the profile's name>'."""
        return f"at {self.profile['name']}"


def profile_machine(profile: dict) -> tuple[str | None, str | None, list[str] | None]:
    """(GPU name, CPU model, CPU flags) of the machine a profile was measured on: its `hardware` record, else (older
    profiles) its entries' device and its header's '- cpu: ' line; None where it names none."""
    gpu = next((e["device"] for e in profile["entries"] if not str(e.get("device", "cpu")).startswith("cpu")), None)
    hw = profile.get("hardware")
    if hw:
        return gpu, hw["cpu"]["model"], hw["cpu"]["flags"]
    line = next((x for x in profile.get("machine") or [] if isinstance(x, str) and x.startswith("- cpu: ")), None)
    return gpu, None if line is None else line.removeprefix("- cpu: ").split(", ")[0], None


def other_machine(r: pd.Series, profile: dict) -> str | None:
    """Words naming both machines where run r ran on another one than the profile: another GPU or none, or on CPUs
    another model or other speed-deciding flags (provenance.CPU_FLAGS); None where the same, or where either does
    not record its machine."""
    gpu, cpu, flags = profile_machine(profile)
    run_gpu, run_cpu = (x if isinstance(x, str) else None for x in (r.get("gpu"), r.get("cpu")))  # NaN: not recorded
    run_flags = r.get("cpu_flags") if isinstance(r.get("cpu_flags"), list) else None
    if gpu is not None or run_gpu is not None:
        if gpu == run_gpu or (run_gpu is None and run_cpu is None):
            return None
        return f"the profile was measured on {gpu or f'CPU {cpu}'}, the run on {run_gpu or f'CPU {run_cpu}'}"
    if cpu is None or run_cpu is None:
        return None
    if cpu != run_cpu:
        return f"the profile was measured on CPU {cpu}, the run on CPU {run_cpu}"
    if flags is not None and run_flags is not None and set(flags) != set(run_flags):
        return (f"the profile's CPU has {' '.join(flags) or 'none'} of the speed-deciding features, the run's "
                f"{' '.join(run_flags) or 'none'}")
    return None


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


def projection(spec: str, runs: pd.DataFrame, pair: str | None) -> Projection:
    """The projection `--profile spec` asks for: a profile.json, or `roofline:GPU`, the runs' pairs on that GPU's
    roofline (specbench.runs.roofline) with the table of the measured profiles' ratios to it."""
    if not spec.startswith("roofline:"):
        return Projection(read(Path(spec)), pair)
    if pair is not None:
        raise ProfileError("--profile-pair names a measured profile's pair; roofline:GPU prices each run's own pair")
    g = roofline.gpu(spec.removeprefix("roofline:"))
    measured = roofline.shipped(g)
    prof = roofline.profile(g, sites(runs), measured)
    notes = tuple(f"roofline:{g.key} prices each forward {why}" for why in prof["said"])
    return Projection(prof, None, (ratio_table(g, measured),) if measured else (), notes)


def sites(runs: pd.DataFrame) -> list[roofline.Site]:
    """A roofline site per pair, dtype, path and batch size of the runs that recorded their shapes, its cache the
    mean prompt plus half the mean new tokens of their generations (128 where rows lack prompt_tokens)."""
    keyed: dict[str, list[pd.Series]] = {}
    for _, r in runs.iterrows():
        if isinstance(r.get("shapes"), dict) and isinstance(r.get("dtype"), str):
            key = json.dumps([r["pair"], r["shapes"], r["dtype"], r["path"], int(r["batch_size"])], sort_keys=True)
            keyed.setdefault(key, []).append(r)
    out = []
    for same in keyed.values():
        kv = mean_context(same)
        r = same[0]
        out.append(roofline.Site(r["pair"], r["shapes"], r["dtype"], r["path"], int(r["batch_size"]),
                                 128 if kv is None else round(kv)))
    return out


RATIO_WIDTHS = (1, 2, 4, 8, 16, 32, 64)


def ratio_table(g: roofline.Gpu, measured: list[Entry]) -> Table:
    """Each measured entry of GPU g shipped here: its target forward's ms per width over the roofline's for the
    same call (its shapes, dtype, batch size and cache), and the draft's one-token forward."""
    index = pd.MultiIndex.from_arrays([[""] * len(measured), [f"{e['pair']} · {e['path']} · B={e['batch_size']} · "
                                                              f"{e['dtype']}" for e in measured]])
    columns = pd.MultiIndex.from_product([[""], [*(f"target {w}" for w in RATIO_WIDTHS), "draft 1"]])
    v = pd.DataFrame(np.nan, index=index, columns=columns)
    cells = pd.DataFrame("", index=index, columns=columns)
    for at, e in zip(index, measured):
        r = roofline.measured_ratios(e, g)
        for col, role, w in [*((f"target {w}", "target", str(w)) for w in RATIO_WIDTHS), ("draft 1", "draft", "1")]:
            if w in r.get(role, {}):
                v.loc[at, ("", col)] = r[role][w]
                cells.loc[at, ("", col)] = f"{r[role][w]:.2f}"
    title = (f"Measured profiles on {g.key} against its roofline ({g.sheet}: {g.bandwidth / 1e12:.3g} TB/s, "
             f"{g.peak['bfloat16'] / 1e12:.4g} TFLOP/s bf16): measured / roofline seconds per forward of w tokens a "
             "row (1 = at the bound)")
    return Table("roofline", title, v, cells, index_names=("", "profile entry"))
