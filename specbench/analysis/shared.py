"""Comparing runs on the examples they share: the one rule by which every table pairs examples (the overview, the
tables beside it and the papers' tables).

A run holds the examples of its rows (its summary.json's `selected_ids`: specbench.analysis.load). A number that
compares runs (a speedup over a baseline run; GammaTune's speedup over its baseline's γ grid) is over the example ids
all of them hold (`compared`): where one holds more (one ran limit=20, another all 100) it is `restricted` to those,
and every number a table shows for it in that comparison (its row's tok/s, acceptance, τ, score, predicted speedup
and bootstrap intervals beside the speedup) is recomputed from its rows of those ids; the table's notes say on how
many examples.
Runs that share no example id are refused, with the commands that run the missing examples.

The notes also flag runs a number compares that were measured (`measurement_flags`)
- at different machine loads: their median 1-minute load averages (summary.json's load_average_median) more than
  LOAD_APART apart. An absolute difference, not a ratio: one more busy process takes a core whatever the load was
  (0.1 against 0.3 is no contention; 1.0 against 2.5 is one and a half cores taken);
- on CPUs of other models (config.json's runtime.cpu.model);
and an overview's predicted speedups whose target_1 calibrations (the one-token target call a prediction prices ar's
step at: summary.json's call_costs.target_1) lie more than CALIBRATION_MOVED apart, max / min - 1
(`calibration_flags`). A run older than a field gives no flag for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from specbench.analysis import load
from specbench.analysis.selection import ReportError
from specbench.runs.results import ROWS, SUMMARY


LOAD_APART = 1.0  # median load averages further apart than this flag the runs compared
CALIBRATION_MOVED = 0.10  # target_1 calibrations further apart than this (max / min - 1) flag its predictions
# a run's columns a restriction keeps as they are: how the report named it, the time it divides by, the fields its
# summary lacks (shown as missing, not recomputed)
KEPT = ("label", "time", "missing", "run_dir")


def held(run: pd.Series) -> frozenset[str]:
    """The example ids the run holds."""
    return frozenset(map(str, run["example_ids"]))


@lru_cache(maxsize=256)
def _numbers(run_dir: str, ids: frozenset[str], stamp: tuple[int, ...]) -> dict[str, Any]:
    """load_run of the folder's rows of `ids` (stamp: its files' mtimes and sizes, so a changed folder is read
    again)."""
    record, summary, rows, _ = load.read_folder(Path(run_dir))
    mine = [r for r in rows if str(r["id"]) in ids]
    return load.load_run(Path(run_dir), record, load.subset_summary(summary or {}, mine), mine)


def restricted(run: pd.Series, ids: frozenset[str]) -> pd.Series:
    """The run over its examples of `ids` only: its numbers recomputed from those rows (load.subset_summary); the
    run itself where it holds no other id."""
    if held(run) <= ids:
        return run
    folder = Path(run["run_dir"])
    stats = [(folder / f).stat() for f in (ROWS, SUMMARY)]
    stamp = tuple(x for st in stats for x in (st.st_mtime_ns, st.st_size))
    fresh = _numbers(str(folder), ids, stamp)
    out = {**run.to_dict(), **{k: v for k, v in fresh.items() if k in run.index and k not in KEPT}}
    for k in run.get("missing") or ():  # a field the run's summary lacks stays as shown: missing
        if k in out and pd.isna(run[k]):
            out[k] = run[k]
    if run.get("time") == "after_first_block":  # as load.timed set it
        out["tokens_per_s_median"] = out["after_first_block_tps"]
    return pd.Series(out, name=run.name)


def command(run: pd.Series, method: str | None = None, like: pd.Series | None = None) -> str:
    """The `python run.py` command that runs `method` (default: the run's) with the run's pair, dataset, decode
    choice and folder overrides (its method options only for its own method) over the examples `like` selects (its
    limit= and shard=; default: the run's)."""
    flat = run.get("flat") or {}
    own = flat.get("method.name", run["method"])
    name = method or own
    extra = [f"decode={run['decode']}"] if isinstance(run.get("decode"), str) else []
    extra += [o for o in Path(run["run_dir"]).name.split(",") if "=" in o  # a run's leaf; `default`: none
              and not o.startswith(("limit=", "shard=")) and (name == own or not o.startswith("method."))]
    want = flat if like is None else like.get("flat") or {}
    extra += [f"{k}={'null' if want.get(k) is None else want[k]}" for k in ("limit", "shard")
              if want.get(k) != flat.get(k)]
    return " ".join(["python run.py", f"method={name}", f"pair={run['pair']}", f"dataset={run['dataset']}", *extra])


def _names(runs: Sequence[pd.Series]) -> list[str]:
    """Each run by its label, with its folder where runs share one."""
    labels = [str(r.get("label", r["run_dir"])) for r in runs]
    return [f"{name} [{r['run_dir']}]" if labels.count(name) > 1 else name for name, r in zip(labels, runs)]


def _and(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def _examples(ids: frozenset[str]) -> str:
    """'3 (a, b, c)', '40 (a, b, c, ...)'."""
    return f"{len(ids)} ({', '.join(sorted(ids)[:3])}{', ...' if len(ids) > 3 else ''})"


def _no_shared(runs: Sequence[pd.Series], where: str, names: list[str]) -> str:
    """Why runs cannot be compared (they share no example id) and the commands that run the examples of the run
    holding the most with the others."""
    big = max(range(len(runs)), key=lambda i: (len(held(runs[i])), str(runs[i]["run_dir"])))
    adds = [command(r, like=runs[big]) for i, r in enumerate(runs) if i != big]
    return (f"{where}: {_and(names)} share no example id, so nothing is compared ("
            f"{'; '.join(f'{n} holds {_examples(held(r))}' for n, r in zip(names, runs))}); run {names[big]}'s "
            f"examples with the others: {'; '.join(adds)}")


def _known(runs: Sequence[pd.Series], names: list[str], column: str) -> dict[str, Any]:
    """{run name: its value} of the runs with a value in `column` (none where the table lacks it)."""
    values = {n: r.get(column) for n, r in zip(names, runs)}
    return {n: v for n, v in values.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}


def measurement_flags(runs: Sequence[pd.Series], where: str, names: list[str]) -> list[str]:
    """The runs (named `names`) measured at machine loads more than LOAD_APART apart, or on CPUs of other models (a
    run older than the field: no flag); see the module's docstring."""
    out = []
    loads = _known(runs, names, "load_average_median")
    if loads and max(loads.values()) - min(loads.values()) > LOAD_APART:
        out.append(f"{where}: {_and(names)} measured at different machine loads (median 1-minute load average "
                   f"{', '.join(f'{k} {v:.2f}' for k, v in loads.items())}; more than {LOAD_APART:.1f} apart): the "
                   "speedups between them measure the load too; rerun them on a machine otherwise idle")
    cpus = _known(runs, names, "cpu")
    if len(set(cpus.values())) > 1:
        out.append(f"{where}: {_and(names)} measured on different CPUs "
                   f"({'; '.join(f'{k}: {v}' for k, v in cpus.items())}): the speedups between them measure the CPUs "
                   "too")
    return out


def calibration_flags(runs: pd.DataFrame, where: str) -> list[str]:
    """The runs' predicted speedups whose target_1 calibrations lie more than CALIBRATION_MOVED apart (a run older
    than the field: no flag); see the module's docstring."""
    mine = [r for _, r in runs.iterrows() if not pd.isna(r.get("predicted_speedup"))]
    t1 = _known(mine, _names(mine), "target_1")
    if not t1 or min(t1.values()) <= 0 or max(t1.values()) / min(t1.values()) - 1 <= CALIBRATION_MOVED:
        return []
    lo, hi = min(t1, key=lambda k: t1[k]), max(t1, key=lambda k: t1[k])
    return [f"{where}: the predicted speedups price ar's step at target_1 calibrations from {1e3 * t1[lo]:.3g} ms "
            f"({lo}) to {1e3 * t1[hi]:.3g} ms ({hi}), {t1[hi] / t1[lo] - 1:.0%} apart (more than "
            f"{CALIBRATION_MOVED:.0%}): the machine changed between the calibrations; trust these predictions less"]


@dataclass(frozen=True)
class Compared:
    """Runs one number compares, each over the example ids all of them hold (`compared`)."""

    runs: tuple[pd.Series, ...]  # in the order given, each `restricted` to ids
    ids: frozenset[str]
    notes: tuple[str, ...] = ()  # on how many examples, where a run holds more; the measurement flags


def compared(runs: Sequence[pd.Series], where: str) -> Compared:
    """The runs a number compares (a run and its baseline; GammaTune's run and its baseline's γ grid), each over the
    example ids all of them hold (`restricted`), with a note where a run holds more ('p · gsm8k: vanilla, ar
    compared on the 20 examples both hold (ar holds 100)') and the `measurement_flags`; ReportError, naming the runs
    and the commands that run the missing examples, when they share no id. One run (a baseline against itself)
    comes back as it is."""
    unique = list({str(r["run_dir"]): r for r in runs}.values())
    names = _names(unique)
    ids = frozenset.intersection(*(held(r) for r in unique))
    if not ids:
        raise ReportError(_no_shared(unique, where, names))
    notes = measurement_flags(unique, where, names)
    more = [f"{n} holds {len(held(r))}" for n, r in zip(names, unique) if held(r) != ids]
    if more:
        both = "both" if len(unique) == 2 else f"all {len(unique)}"
        notes.insert(0, f"{where}: {_and(names)} compared on the {len(ids)} examples {both} hold "
                        f"({', '.join(more)})")
    return Compared(tuple(restricted(r, ids) for r in runs), ids, tuple(notes))
