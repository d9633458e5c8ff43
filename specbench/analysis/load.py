"""Finished runs as pandas frames: read run folders into the runs table (one row per run), its examples and its
traces, and select runs by config value (`where`) or time (`timed`).

Run numbers are summary.json's (`specbench.common.aggregate.run_metrics`, pooled over tokens and iterations), so
rows measured at different times (repeats, re-measurements) are not pooled here behind the run's back; a key an older
summary lacks is recomputed from rows.jsonl with the same function, and a field newer than a run is NaN and listed in
its `missing`. Throughput and speedups use `tokens_per_s_median` (the median over the run's repeats). A folder holding
more rows than its run's settings select (a run with limit=20 resumed in a folder of 100 rows) is the run of the
selected rows: those of summary.json's `selected_ids`.
"""

from __future__ import annotations

import json
import logging
import statistics
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd
import yaml

from specbench.analysis.intervals import TIMES, prompt_arrays
from specbench.analysis.selection import ReportError, labels, select
from specbench.common.aggregate import counts, ratio, repeat_spread, run_metrics, total
from specbench.common.configs import flatten
from specbench.common.options import OptionError, max_new_tokens
from specbench.runs.identity import identity
from specbench.runs.projection import predicted_speedup, run_stats
from specbench.runs.results import CONFIG, ROWS, SUMMARY, measured_rows, read_measured, read_rows
from specbench.runs.traces import read_traces

log = logging.getLogger(__name__)

# gamma: the method option `gamma`, the fixed or initial speculation length (GammaTune's sweep axis).
SUMMARY_COLUMNS = ["label", "pair", "dataset", "method", "temperature", "seed", "batch_size", "gamma", "n_examples",
                   "tokens_per_s", "mean_drafted", "mean_accepted", "acceptance_rate", "block_efficiency",
                   "mean_t_v", "score", "lossless", "finished"]
# summary.json fields newer than some runs: NaN (and named in the run's `missing`) where a summary lacks them
NEWER_FIELDS = ["repeats", "tokens_per_s_median", "acceptance_exact", "acceptance_relaxed", "n_truncated",
                "truncated_frac", "predicted_speedup", "decoded", "resumed", "nodes_per_call"]
# only with load_runs(..., full=True): per prompt its token ids, top-2 margins and off-top-1 positions (the
# divergence table reads them from the folder otherwise); the config record; the package versions
FULL_COLUMNS = ["outputs", "config", "versions"]


def setting_of(record: dict) -> dict:
    """What two runs must share to be compared: the run identity (specbench.runs.identity: no `limit`, whose runs'
    example ids are compared instead) without the method, with the budget that ran, plus the device."""
    out = identity(record["config"], drop={("method",)})
    ran = budget(record["config"])  # the budget that ran (a null decode.max_new_tokens: the dataset's)
    if "decode" in out and ran is not None:
        out["decode"] = {**out["decode"], "max_new_tokens": ran}
    # the CPU apart: runs on two CPUs are compared, their speedup flagged (specbench.analysis.shared, runtime.cpu)
    out["device_info"] = {k: v for k, v in record.get("device_info", {}).items() if k != "cpu"}
    return out


def budget(config: dict) -> int | None:
    """The new-token budget a run decoded with (specbench.common.options.max_new_tokens); None if it has none."""
    try:
        return max_new_tokens(config.get("decode", {}), config.get("dataset", {}))
    except OptionError:
        return None


def pair_label(pair: dict) -> str:
    """'Llama-3.1-70B – Llama-3.1-8B' for hub pairs (the papers' row groups), else the pair's config name."""
    paths = [(pair.get(k) or {}).get("path") for k in ("target", "draft")]
    if pair.get("builder") == "hub" and paths[0]:
        return " – ".join(p.rstrip("/").split("/")[-1] for p in paths if p)
    return pair["name"]


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every folder under `paths` holding config.json and rows.jsonl (a run folder), sorted."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"results path {p} does not exist")
        found |= {c.parent for c in ([p / CONFIG] if (p / CONFIG).exists() else p.rglob(CONFIG))
                  if (c.parent / ROWS).exists()}
    return sorted(found)


def unfinished(summary: dict | None, n: int) -> str | None:
    """Why a run folder with this summary.json (None: none) and n rows in its newest set of repeats is not a
    finished run (no summary, or other rows than its summary counts: decoded + resumed, else n_examples), else None."""
    if summary is None:
        return "no summary.json (running, crashed or stopped before the end)"
    if summary.get("decoded") is not None and summary.get("resumed") is not None:
        expected = summary["decoded"] + summary["resumed"]
    else:
        expected = summary.get("n_examples")
    if expected != n:
        return f"summary.json counts {expected} rows, rows.jsonl holds {n} (a rerun in progress or stopped)"
    return None


def summary_numbers(summary: dict, rows: list[dict], source: str) -> dict[str, float]:
    """`run_metrics` of the rows (NaN where undefined; totals as `new_tokens` and `decode_s`) with summary.json's
    values where it has them, the newer fields (NaN where missing) and the repeats' spread (tokens_per_s_min/_max)."""
    out = {k: _num(v) for k, v in run_metrics(rows, source).items()}
    out |= {"new_tokens": out["total_new_tokens"], "decode_s": out["total_decode_s"]}
    out.update({k: _num(summary[k]) for k in out if k in summary})
    out.update({k: _num(summary.get(k)) for k in NEWER_FIELDS})
    if pd.isna(out["tokens_per_s_median"]):  # one measurement: the median is the run's throughput
        out["tokens_per_s_median"] = out["tokens_per_s"]
    spread, band = summary.get("tokens_per_s_spread") or {}, summary.get("predicted_speedup_spread") or [None, None]
    return {**out, "tokens_per_s_min": _num(spread.get("min")), "tokens_per_s_max": _num(spread.get("max")),
            "predicted_low": _num(band[0]), "predicted_high": _num(band[1])}  # over the calibration's passes


def outputs(rows: list[dict]) -> dict[str, dict[str, list | None]]:
    """Per prompt id, its first repeat's token_ids, top2_margins and off_top1 (None where a row lacks them)."""
    out: dict[str, dict[str, list | None]] = {}
    for r in sorted(rows, key=lambda r: int(r.get("repeat") or 0)):
        out.setdefault(str(r["id"]), {k: r.get(k) for k in ("token_ids", "top2_margins", "off_top1")})
    return out


def categories(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per value of the rows' `category` (Spec-Bench's, SPEED-Bench's categories and tiers): its prompt ids and
    run_stats (merged call_stats, alpha_i) of its rows; {} when no row has a category."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("category") is not None:
            by.setdefault(str(r["category"]), []).append(r)
    return {c: {"ids": sorted({str(r["id"]) for r in rs}), **run_stats(rs)} for c, rs in by.items()}


def load_run(run_dir: Path, record: dict, summary: dict, rows: list[dict]) -> dict[str, Any]:
    """One finished run folder (its config.json record, summary.json and the rows of its newest set of
    repeats) as a flat record: identity, setting, provenance and `summary_numbers`."""
    cfg = record["config"]
    method, decode = dict(cfg["method"]), cfg["decode"]
    batch = int(cfg.get("batch_size", 1))  # a config without the key: 1
    compiled = bool((cfg.get("engine") or {}).get("compile", False))  # a config without the key: eager
    options = {k: v for k, v in method.items() if k != "name"}
    setting = setting_of(record)
    return {
        "run_dir": str(run_dir), "pair": cfg["pair"]["name"], "pair_label": pair_label(cfg["pair"]),
        # the method by its parts as the run named it (vanilla+drafter=suffix: specbench.decoding.compose.method_label)
        "dataset": cfg["dataset"]["name"], "method": summary.get("method") or method["name"], "options": options,
        "decode": record.get("choices", {}).get("decode"), "temperature": float(decode["temperature"]),
        "top_k": decode.get("top_k"), "top_p": decode.get("top_p"), "max_new_tokens": budget(cfg),
        "seed": int(decode["seed"]), "batch_size": batch, "device": record.get("device_info", {}).get("device"),
        "gamma": _num(options.get("gamma")),
        "lossless": all(r.get("lossless", True) for r in rows), "n_examples": len(rows),
        "finished": True,  # load_runs loads finished runs only
        **summary_numbers(summary, rows, str(run_dir / ROWS)),
        "missing": tuple(k for k in [*NEWER_FIELDS, "tokens_per_s_spread"] if k not in summary),
        "git_hash": record.get("git_hash"), "git_dirty": record.get("git_dirty"), "versions": record.get("versions"),
        # what the report's flags compare (specbench.analysis.shared; None / NaN in runs older than the fields): the
        # machine's load while the rows were written, the CPU model, the one-token target call the prediction used
        "load_average_median": _num(summary.get("load_average_median")),
        "cpu": ((record.get("runtime") or {}).get("cpu") or {}).get("model"),
        "cpu_flags": ((record.get("runtime") or {}).get("cpu") or {}).get("flags"),
        "gpu": record.get("device_info", {}).get("gpu"),  # its name, on CUDA
        "target_1": _num((summary.get("call_costs") or {}).get("target_1")),
        "config": cfg, "flat": {"batch_size": batch, **flatten(cfg), "engine.compile": compiled,
                                **flatten({"decode": setting.get("decode", {})}),
                                **flatten({"device_info": setting["device_info"]})},
        "setting": json.dumps(setting, sort_keys=True, default=str),
        "example_ids": tuple(sorted(r["id"] for r in rows)),
        # what a projection onto a cost profile reads (specbench.runs.projection): the pair's shapes and the dtype
        # that ran (None in runs older than them), the path, the rows' iterations and draft forwards
        "shapes": (record.get("runtime") or {}).get("shapes"), "dtype": (record.get("runtime") or {}).get("dtype"),
        "path": "compiled" if compiled else "eager", **run_stats(rows),
        "hidden_verify": bool((record.get("runtime") or {}).get("verify_hidden_layers")),  # verifies returned states
        "counts": counts(rows),  # N, C, I, A, D, k pooled: acceptance in other engines' conventions
        "outputs": outputs(rows),  # per prompt: token ids, top-2 margins (analysis.divergence)
        "categories": categories(rows),  # per row category: its prompts and acceptance per position
        "prompts": prompt_arrays(rows),  # per prompt and repeat: the bootstrap intervals' input (analysis.intervals)
        "time": "decode",  # what tokens_per_s_median divides by (analysis.intervals.TIMES; `timed` changes it)
    }


def one_folder_per_run(loaded: list[dict], finished: list[str]) -> tuple[list[dict], dict[str, str]]:
    """The loaded runs (with their summaries' `finished` times), one per run, and {folder left out: folder kept}: of
    several folders holding one run (the same method, setting and example ids; e.g. `.../default` and
    `.../batch_size=1`, which older versions wrote for one setting) the newest finished is kept, the others logged."""
    same: dict[str, list[int]] = {}
    for i, run in enumerate(loaded):
        key = json.dumps([run["config"]["method"], run["setting"], run["example_ids"]], sort_keys=True, default=str)
        same.setdefault(key, []).append(i)
    kept, twins = [], {}
    for at in same.values():
        keep = max(at, key=lambda i: (_time(finished[i]), loaded[i]["run_dir"]))
        kept.append(keep)
        for i in at:
            if i != keep:
                twins[loaded[i]["run_dir"]] = loaded[keep]["run_dir"]
                log.warning("left out %s: the same run (method, setting and examples) as %s, the one of them that "
                            "finished last, which is reported (older versions named a folder by a key at its default "
                            "value, e.g. batch_size=1 beside default); move or delete one of them",
                            loaded[i]["run_dir"], loaded[keep]["run_dir"])
    return [loaded[i] for i in sorted(kept)], twins


def _time(stamp: str) -> float:
    """A summary's `finished` time (%Y-%m-%dT%H:%M:%S%z) in seconds since the epoch; 0 where absent or unreadable."""
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return 0.0


def selected(rows: list[dict], summary: dict | None) -> list[dict]:
    """The rows of the run's selection: those of summary.json's `selected_ids` where the folder holds more rows than
    the run's settings select (a limit=20 run in a folder of 100 rows), else all."""
    ids = (summary or {}).get("selected_ids")
    if ids is None:
        return rows
    keep = set(map(str, ids))
    return [r for r in rows if str(r["id"]) in keep]


def read_folder(run_dir: Path) -> tuple[dict, dict | None, list[dict], int]:
    """A run folder's config.json record, summary.json (None: none yet), the rows of its run (its newest set of
    repeats, `selected`) and how many rows.jsonl holds in all."""
    record, every = json.loads((run_dir / CONFIG).read_text()), read_rows(run_dir / ROWS)
    summary = json.loads((run_dir / SUMMARY).read_text()) if (run_dir / SUMMARY).exists() else None
    return record, summary, selected(measured_rows(every, record), summary), len(every)


def load_runs(*paths: str | Path, full: bool = False) -> pd.DataFrame:
    """One row per run folder found under `paths`: SUMMARY_COLUMNS first (`runs[load.SUMMARY_COLUMNS]` is the
    readable summary), then what the report's tables read (config values, setting, per-prompt arrays, ...); with
    full=True also FULL_COLUMNS. attrs["same_run_as"] maps each folder left out as another folder's run to that
    folder."""
    dirs = find_run_dirs(paths)
    if not dirs:
        raise ReportError(f"no run folders ({CONFIG} + {ROWS}) under {', '.join(map(str, paths))}")
    why, loaded, finished = {}, [], []
    for d in dirs:  # each file read once
        record, summary, rows, held = read_folder(d)
        why[d] = "no rows yet (a job that has just started?)" if not held else unfinished(summary, len(rows))
        if why[d]:
            log.warning("left out %s: unfinished: %s", d, why[d])
        else:
            assert summary is not None, "unfinished() names a folder without summary.json"
            loaded.append(load_run(d, record, summary, rows))
            finished.append(str(summary.get("finished") or ""))
    kept, twins = one_folder_per_run(loaded, finished)
    runs = pd.DataFrame(kept)
    if runs.empty:
        raise ReportError(f"no finished run folder under {', '.join(map(str, paths))}: {len(dirs)} unfinished "
                          f"({'; '.join(f'{d}: {r}' for d, r in why.items())})")
    runs["label"] = labels(runs)
    columns = [*SUMMARY_COLUMNS, *(c for c in runs if c not in SUMMARY_COLUMNS and (full or c not in FULL_COLUMNS))]
    runs = runs[columns]
    runs.attrs["same_run_as"] = twins
    return runs


def subset_summary(summary: dict, rows: list[dict]) -> dict:
    """summary.json as it would read for `rows` only (a run compared on the examples it shares with others): the
    pooled numbers, the median over repeats, the acceptance split, truncation and median load of those rows, and
    the predicted speedup of their iterations at the run's call costs (summary.json's call_costs: what a call cost
    on the machine, measured over all the run's rows)."""
    drafted, truncated = total(rows, "drafted"), sum(bool(r.get("truncated")) for r in rows)
    stats, costs = run_stats(rows)["call_stats"], summary.get("call_costs")
    loads = [r["load_average"] for r in rows if r.get("load_average") is not None]
    predicted = predicted_speedup(stats, costs) if stats and costs else None
    band = summary.get("predicted_speedup_spread")
    if predicted is not None and band and summary.get("predicted_speedup"):  # linear in target_1: the same ratios
        band = [predicted * b / summary["predicted_speedup"] for b in band]
    return {**{k: summary[k] for k in ("method", "finished", "call_costs") if k in summary},
            **run_metrics(rows), **repeat_spread(rows), "n_examples": len(rows),
            "load_average_median": statistics.median(loads) if loads else summary.get("load_average_median"),
            "acceptance_exact": ratio(total(rows, "accepted_exact"), drafted),
            "acceptance_relaxed": ratio(total(rows, "accepted_relaxed"), drafted),
            "n_truncated": truncated, "truncated_frac": ratio(truncated, len(rows)),
            "predicted_speedup": predicted, "predicted_speedup_spread": band if predicted is not None else None}


@lru_cache(maxsize=64)
def _outputs(run_dir: str, ids: frozenset[str], stamp: tuple[int, int]) -> dict[str, dict[str, list | None]]:
    """`outputs` of the folder's rows of `ids` (stamp: rows.jsonl's mtime and size, so a changed folder is read
    again)."""
    return outputs([r for r in read_measured(Path(run_dir)) if str(r["id"]) in ids])


def outputs_of(run: pd.Series) -> dict[str, dict[str, list | None]]:
    """The run's `outputs` (per prompt: token ids, top-2 margins, off-top-1 positions): its column where the runs
    table has it (load_runs(..., full=True)), else read from its folder, for the prompts it holds."""
    if "outputs" in run.index:
        return run["outputs"]
    stat = (Path(run["run_dir"]) / ROWS).stat()
    return _outputs(str(run["run_dir"]), frozenset(map(str, run["example_ids"])), (stat.st_mtime_ns, stat.st_size))


def _per_run(runs: pd.DataFrame | str | Path, keep: list[str], read: Callable[[Path], pd.DataFrame]) -> pd.DataFrame:
    """What `read` gives of each run's folder (runs giving nothing left out), with the run's columns `keep`; `runs`
    is the runs table or a results folder (load_runs of it)."""
    runs = runs if isinstance(runs, pd.DataFrame) else load_runs(runs)
    frames = []
    for _, run in runs.iterrows():
        frame = read(Path(run["run_dir"]))
        if len(frame) and "id" in frame and "example_ids" in run.index:  # the run's examples (selected, shared)
            frame = frame[frame["id"].astype(str).isin(set(map(str, run["example_ids"])))]
        if len(frame):
            frames.append(frame.drop(columns=[c for c in keep if c in frame]).assign(**{c: run[c] for c in keep}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_examples(runs: pd.DataFrame | str | Path) -> pd.DataFrame:
    """One row per example of every run (a runs table or a results folder): the run's run_dir, label, pair, dataset,
    method, seed and gamma with its row's fields; a run's examples are those it holds (its selected ids, or the ids it
    shares with the runs it was compared with)."""
    keep = ["run_dir", "label", "pair", "dataset", "method", "temperature", "seed", "gamma"]
    return _per_run(runs, keep, lambda d: pd.DataFrame(read_measured(d)).drop(columns=["token_ids", "carried_state"],
                                                                                errors="ignore"))


def load_traces(runs: pd.DataFrame | str | Path) -> pd.DataFrame:
    """One row per iteration of every traced run (specbench.runs.traces columns + run_dir/label/pair/dataset/method)."""
    return _per_run(runs, ["run_dir", "label", "pair", "dataset", "method"], read_traces)


def timed(runs: pd.DataFrame, time: str) -> pd.DataFrame:
    """runs whose throughput (tokens_per_s_median, so every tok/s and speedup of the tables) divides by `time`
    (intervals.TIMES): `decode` as recorded, or `after_first_block` (after_first_block_tps; NaN without call_stats)."""
    if time not in TIMES:
        raise ReportError(f"--time {time!r}: valid times are {', '.join(TIMES)}")
    out = runs.copy()
    out["time"] = time
    if time == "after_first_block":
        out["tokens_per_s_median"] = out["after_first_block_tps"]
    return out


def where(runs: pd.DataFrame, conditions: Iterable[str]) -> pd.DataFrame:
    """Runs whose config value (dotted, e.g. decode.temperature, method.gamma) or column equals each KEY=VALUE; a run
    without the key passes (so method.gamma=5 keeps `ar`); a key no run has is an error."""
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
