"""Finished runs as pandas frames: load run folders, select runs, pair each run with its speedup baseline.

`load_runs` reads every run folder (config.json + rows.jsonl) under the given paths into a DataFrame
with one row per run; `load_examples` and `load_traces` give one row per example / per iteration.
Run numbers are recomputed from rows.jsonl (the rows are the record; summary.json only says that the
run finished) by `specbench.common.aggregate.run_metrics`, pooled over tokens and iterations, the
function that also writes summary.json's numbers and `bench methods`' table.

A speedup divides a run's tokens_per_s by that of one baseline run (`MethodSpec`, e.g. `vanilla` or
`vanilla:gamma=8`) with the same *setting*: the resolved config without the method node and the keys a
resumed run may change, plus the recorded device (device, CPU, platform, torch threads, GPU). So pair,
dataset, decode settings, seed and device must agree, and both runs must hold the same example ids.
A baseline that exists but differs is refused (`ReportError` naming the differing keys); with no
baseline run at all for the pair and dataset the speedup is empty. Git hash and package versions are
recorded per run (columns `git_hash`, `versions`) but not compared: a sweep may span commits.
The tables live in `specbench.analysis.tables`, the figures in `specbench.analysis.figures`, the
CLI that writes both in `specbench.analysis.report`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import yaml

from specbench.common.aggregate import run_metrics
from specbench.common.configs import differences, flatten
from specbench.runs.results import CONFIG, RESUMABLE_KEYS, ROWS, SUMMARY, read_measured, read_rows, without_keys
from specbench.runs.traces import read_traces

log = logging.getLogger(__name__)

# gamma: the method option `gamma`, the fixed or initial speculation length (GammaTune's sweep axis).
SUMMARY_COLUMNS = ["label", "pair", "dataset", "method", "temperature", "seed", "gamma", "n_examples",
                   "tokens_per_s", "mean_drafted", "mean_accepted", "acceptance_rate", "block_efficiency",
                   "mean_t_v", "score", "lossless", "finished"]


class ReportError(ValueError):
    """A comparison or table the report refuses to make (mismatched or ambiguous runs)."""


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

    def __str__(self) -> str:
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in self.options) if self.options else "")


def select(runs: pd.DataFrame, keep: Iterable[bool]) -> pd.DataFrame:
    """runs[keep] for a per-run list of booleans (also when runs is empty)."""
    return runs[pd.Series(list(keep), index=runs.index, dtype=bool)]


def setting_of(record: dict) -> dict:
    """What two runs must share to be compared: config minus method and resumable keys, plus the device.

    (limit is resumable: the runs' example ids are compared instead.)
    """
    out = without_keys(record["config"], RESUMABLE_KEYS | {("method",)})
    out["device_info"] = record.get("device_info", {})
    return out


def pair_label(pair: dict) -> str:
    """'Llama-3.1-70B – Llama-3.1-8B' for hub pairs (the papers' row groups), else the pair's config name."""
    paths = [(pair.get(k) or {}).get("path") for k in ("target", "draft")]
    if pair.get("builder") == "hub" and paths[0]:
        return " – ".join(p.rstrip("/").split("/")[-1] for p in paths if p)
    return pair["name"]


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def numbers(rows: list[dict], source: str) -> dict[str, float]:
    """`run_metrics` of the rows (specbench.common.aggregate: pooled over tokens and iterations), NaN where
    undefined, plus the totals as `new_tokens` and `decode_s`."""
    out = {k: _num(v) for k, v in run_metrics(rows, source).items()}
    return {**out, "new_tokens": out["total_new_tokens"], "decode_s": out["total_decode_s"]}


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every folder under `paths` holding config.json and rows.jsonl (a run folder), sorted."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"results path {p} does not exist")
        found |= {c.parent for c in ([p / CONFIG] if (p / CONFIG).exists() else p.rglob(CONFIG))
                  if (c.parent / ROWS).exists()}
    return sorted(found)


def load_run(run_dir: Path) -> dict[str, Any]:
    """One run folder (with at least one row) as a flat record: identity, setting, provenance and `numbers`."""
    record = json.loads((run_dir / CONFIG).read_text())
    cfg, rows = record["config"], read_measured(run_dir)  # the newest set of repeats
    summary = json.loads((run_dir / SUMMARY).read_text()) if (run_dir / SUMMARY).exists() else None
    method, decode = dict(cfg["method"]), cfg["decode"]
    options = {k: v for k, v in method.items() if k != "name"}
    setting = setting_of(record)
    return {
        "run_dir": str(run_dir), "pair": cfg["pair"]["name"], "pair_label": pair_label(cfg["pair"]),
        "dataset": cfg["dataset"]["name"], "method": method["name"], "options": options,
        "decode": record.get("choices", {}).get("decode"), "temperature": float(decode["temperature"]),
        "top_k": decode.get("top_k"), "top_p": decode.get("top_p"), "max_new_tokens": decode["max_new_tokens"],
        "seed": int(decode["seed"]), "device": record.get("device_info", {}).get("device"),
        "gamma": _num(options.get("gamma")),
        "lossless": all(r.get("lossless", True) for r in rows), "n_examples": len(rows),
        # finished: summary.json was written after the last row (a crashed or running job has none or an older one)
        "finished": summary is not None and summary.get("n_examples") == len(rows),
        **numbers(rows, str(run_dir / ROWS)),
        "git_hash": record.get("git_hash"), "git_dirty": record.get("git_dirty"), "versions": record.get("versions"),
        "config": cfg, "flat": {**flatten(cfg), **flatten({"device_info": setting["device_info"]})},
        "setting": json.dumps(setting, sort_keys=True, default=str),
        "example_ids": tuple(sorted(r["id"] for r in rows)),
    }


def _labels(runs: pd.DataFrame) -> list[str]:
    """Method name, plus the config values that tell apart its runs on one pair and dataset (e.g. 'vanilla gamma=8')."""
    labels = []
    for _, run in runs.iterrows():
        same = runs[(runs["method"] == run["method"]) & (runs["pair"] == run["pair"]) & (runs["dataset"] == run["dataset"])]
        keys = sorted({k for f in same["flat"] for k in f if len({json.dumps(g.get(k), default=str) for g in same["flat"]}) > 1})
        keys = [k for k in keys if not k.startswith(("device_info.", "pair.", "dataset."))]
        labels.append(" ".join([run["method"], *(f"{k.split('.')[-1]}={run['flat'].get(k)}" for k in keys)]))
    return labels


def load_runs(*paths: str | Path) -> pd.DataFrame:
    """One row per run folder found under `paths` (columns: see SUMMARY_COLUMNS, plus config, setting, ...)."""
    dirs = find_run_dirs(paths)
    if not dirs:
        raise ReportError(f"no run folders ({CONFIG} + {ROWS}) under {', '.join(map(str, paths))}")
    empty = [d for d in dirs if not read_rows(d / ROWS)]
    for d in empty:
        log.warning("%s: no rows yet (a job that has just started?): left out", d)
    runs = pd.DataFrame([load_run(d) for d in dirs if d not in empty])
    if runs.empty:
        raise ReportError(f"no run folder under {', '.join(map(str, paths))} holds any rows yet")
    for d in runs.loc[~runs["finished"], "run_dir"]:
        log.warning("%s: unfinished (no summary.json for its last row): its numbers cover the rows so far", d)
    runs["label"] = _labels(runs)
    return runs


def load_examples(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per example of every run: the run's run_dir/label/pair/dataset/method/seed/gamma + its row fields."""
    keep = ["run_dir", "label", "pair", "dataset", "method", "temperature", "seed", "gamma"]
    frames = []
    for _, run in runs.iterrows():
        rows = pd.DataFrame(read_measured(Path(run["run_dir"]))).drop(columns=["token_ids", "carried_state"],
                                                                         errors="ignore")
        frames.append(rows.drop(columns=[c for c in keep if c in rows]).assign(**{c: run[c] for c in keep}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_traces(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per iteration of every traced run (specbench.runs.traces columns + run_dir/label/pair/dataset/method)."""
    frames = []
    for _, run in runs.iterrows():
        t = read_traces(Path(run["run_dir"]))
        if len(t):
            frames.append(t.assign(**{c: run[c] for c in ("run_dir", "label", "pair", "dataset", "method")}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def where(runs: pd.DataFrame, conditions: Iterable[str]) -> pd.DataFrame:
    """Runs whose config value (dotted, e.g. decode.temperature, method.gamma) or column equals each KEY=VALUE.

    A run without the key passes (so method.gamma=5 keeps `ar`); a key no run has is an error.
    """
    for cond in conditions:
        key, eq, value = cond.partition("=")
        if not eq:
            raise ReportError(f"--where {cond!r}: expected KEY=VALUE, e.g. decode.temperature=1.0")
        want = yaml.safe_load(value)
        got = [run["flat"].get(key, run.get(key, KeyError)) for _, run in runs.iterrows()]
        if all(g is KeyError for g in got):
            valid = sorted({k for f in runs["flat"] for k in f} | set(SUMMARY_COLUMNS))
            raise ReportError(f"--where {cond!r}: no run has {key!r}; valid keys: {', '.join(valid)}")
        runs = select(runs, (g is KeyError or g == want for g in got))
    return runs


def find_baseline(run: pd.Series, runs: pd.DataFrame, baseline: str | MethodSpec) -> pd.Series | None:
    """The baseline run with run's pair, dataset and setting; None if the pair and dataset have no baseline run.

    Raises ReportError if baseline runs exist but none has the same setting and example ids.
    """
    spec = MethodSpec.parse(baseline)
    cands = runs[(runs["pair"] == run["pair"]) & (runs["dataset"] == run["dataset"])]
    cands = select(cands, (spec.matches(c) for _, c in cands.iterrows()))
    if cands.empty:
        return None
    same = cands[cands["setting"] == run["setting"]]
    if len(same) > 1:
        raise ReportError(f"baseline {spec} is ambiguous for {run['run_dir']}: {', '.join(same['run_dir'])} "
                          "have the same setting; give its options (e.g. --baseline vanilla:gamma=5)")
    if len(same) == 1:
        base = same.iloc[0]
        if base["example_ids"] != run["example_ids"]:
            raise ReportError(f"refusing to compare {run['run_dir']} ({run['n_examples']} examples) with baseline "
                              f"{base['run_dir']} ({base['n_examples']} examples): they hold different example ids")
        return base
    mine = json.loads(run["setting"])
    diffs, other = min(((differences(mine, json.loads(c["setting"])), c["run_dir"]) for _, c in cands.iterrows()),
                       key=lambda d: len(d[0]))  # the closest baseline run
    raise ReportError(f"refusing to compare {run['run_dir']} ({run['method']}) with baseline {spec} at {other}: "
                      f"they differ in {'; '.join(diffs)}. A speedup needs the same pair, dataset, decode "
                      "settings, seed and device; run the baseline with those settings or select runs with --where.")


def speedup(run: pd.Series, runs: pd.DataFrame, baseline: str | MethodSpec) -> float:
    """tokens_per_s of run / tokens_per_s of its baseline run (NaN when there is no baseline run)."""
    base = find_baseline(run, runs, baseline)
    return float("nan") if base is None else run["tokens_per_s"] / base["tokens_per_s"]


def add_speedup(runs: pd.DataFrame, baseline: str | MethodSpec = "vanilla") -> pd.DataFrame:
    """runs with `speedup` and `baseline_dir` columns (empty where the pair and dataset have no baseline run)."""
    out = runs.copy()
    bases = [find_baseline(r, runs, baseline) for _, r in runs.iterrows()]
    out["baseline_dir"] = [None if b is None else b["run_dir"] for b in bases]
    out["speedup"] = [float("nan") if b is None else r["tokens_per_s"] / b["tokens_per_s"]
                      for (_, r), b in zip(runs.iterrows(), bases)]
    return out
