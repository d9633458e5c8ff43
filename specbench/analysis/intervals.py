"""95% bootstrap intervals over prompts for the report's numbers, paired by prompt where two runs are compared.

A run's prompts are resampled with replacement (B = RESAMPLES draws of P prompts out of P), and where the run has R
repeats (whole passes over the prompts) each draw also resamples R of them with replacement (a two-level bootstrap:
the prompts are the sample, the repeats the timing noise). The interval is the percentile interval: the 2.5% and
97.5% quantiles of the statistic over the draws. A comparison of run a with its baseline b draws the same prompts for
both (paired); their repeats are drawn independently (repeats are not paired). The generator is seeded (SEED), so
one folder always gives the same report.

Statistics (over the drawn prompts and repeats, so each is the number the table prints):
    tok/s      median over repeats of Σ tokens / Σ seconds            (tokens_per_s_median; one repeat: tokens_per_s)
    τ          Σ new_tokens / Σ target_calls, pooled over repeats     (block_efficiency)
    AccRate    Σ accepted / Σ drafted                                (acceptance_rate)
    accept len Σ (accepted + iterations) / Σ iterations             (Spec-Bench's #Mean Accepted Tokens)
    vllm length 1 + Σ accepted / Σ draft_iterations                  (vLLM's mean acceptance length)
    score      Σ score / #scored                                     (score)
    speedup    tok/s of run a / tok/s of run b                                    (the default speedup)
    mean ratio (1/P) Σ_i (tokens_a,i / seconds_a,i) / (tokens_b,i / seconds_b,i)  (the mean of per-prompt speedups;
               a prompt's tokens and seconds summed over its repeats)
    Δscore     score_a - score_b over the prompts both score

The throughput divides by one of TIMES (`after_first_block`: specbench.runs.projection.after_first_block). Written
here rather than with scipy.stats.bootstrap, which resamples one level only (no repeats within prompts).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
TIMES = {"decode": "decode_s, the prompt's prefill and first iteration included",
         "after_first_block": "after each generation's first block (prefill and first iteration left out)"}
# (tokens, seconds) fields of a time
_TIME_FIELDS = {"decode": ("new_tokens", "seconds"), "after_first_block": ("later_tokens", "later_seconds")}

Draw = dict[str, np.ndarray]  # field -> (RESAMPLES, P, R) values of the drawn prompts and repeats


@dataclass(frozen=True)
class Prompts:
    """A run's rows as arrays per prompt and repeat: ids (P,) sorted, count (P,) repeats per prompt, and
    fields[name] (P, R) with NaN where a prompt has fewer than R repeats or no value (an unscored row)."""

    ids: tuple[str, ...]
    count: np.ndarray
    fields: dict[str, np.ndarray]


def _later_tokens(row: dict) -> float:
    """Tokens committed after the first block: Σ accepted + one per later iteration (call_stats), NaN without."""
    stats = row.get("call_stats")
    if not isinstance(stats, dict) or row.get("first_block_s") is None:
        return float("nan")
    return float(sum(stats.get("accepted") or []) + sum((stats.get("iterations") or {}).values()))


def _value(row: dict, name: str) -> float:
    if name == "seconds":
        return float(row["decode_s"])
    if name == "later_tokens":
        return _later_tokens(row)
    if name == "later_seconds":
        fb = row.get("first_block_s")
        return float("nan") if fb is None else row["decode_s"] - fb / int(row.get("batch_size") or 1)
    x = row.get(name)
    return float("nan") if x is None else float(x)


FIELDS = ("new_tokens", "seconds", "later_tokens", "later_seconds", "accepted", "drafted", "target_calls", "iterations",
          "draft_iterations", "score")


def prompt_arrays(rows: list[dict]) -> Prompts:
    """The rows (one per prompt and repeat) as Prompts, prompts sorted by id."""
    by_id: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: int(r.get("repeat") or 0)):
        by_id.setdefault(str(r["id"]), []).append(r)
    ids = tuple(sorted(by_id))
    width = max((len(v) for v in by_id.values()), default=1)
    fields = {f: np.full((len(ids), width), np.nan) for f in FIELDS}
    for i, k in enumerate(ids):
        for j, r in enumerate(by_id[k]):
            for f in FIELDS:
                fields[f][i, j] = _value(r, f)
    return Prompts(ids, np.array([len(by_id[k]) for k in ids]), fields)


def subset(p: Prompts, ids: set[str]) -> Prompts:
    """The prompts of p whose id is in ids (order kept)."""
    keep = np.array([k in ids for k in p.ids], dtype=bool)
    return Prompts(tuple(k for k in p.ids if k in ids), p.count[keep], {f: a[keep] for f, a in p.fields.items()})


def _draw(p: Prompts, idx: np.ndarray, names: tuple[str, ...], rng: np.random.Generator) -> Draw:
    """The fields `names` of the prompts idx (B, P) at R repeats drawn with replacement per draw: (B, P, R)."""
    width = p.fields[names[0]].shape[1]
    rep = rng.integers(0, width, (idx.shape[0], width))  # (B, R): a repeat is a whole pass over the prompts
    return {f: p.fields[f][idx[:, :, None], rep[:, None, :]] for f in names}


def _ratio(num: np.ndarray, den: np.ndarray, axes: tuple[int, ...] = (-2, -1)) -> np.ndarray:
    """Σ num / Σ den over `axes` (default prompts and repeats: pooled; NaN where Σ den is 0)."""
    n, d = np.nansum(num, axis=axes), np.nansum(den, axis=axes)
    return np.divide(n, d, out=np.full(np.shape(n), np.nan), where=d != 0)


def _mean(x: np.ndarray, axes: tuple[int, ...] = (-2, -1)) -> np.ndarray:
    """The mean of the non-NaN values over `axes` (NaN where there are none)."""
    n = np.sum(~np.isnan(x), axis=axes)
    return np.divide(np.nansum(x, axis=axes), n, out=np.full(np.shape(n), np.nan), where=n > 0)


def _rate(d: Draw, tok: str, sec: str) -> np.ndarray:
    """Throughput as the tables print it: per repeat Σ tokens / Σ seconds over the prompts, the median over repeats."""
    per_repeat = _ratio(d[tok], d[sec], axes=(-2,))  # (B, R)
    with warnings.catch_warnings():  # a draw whose repeats all lack the time (no first_block_s): NaN, said once here
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(per_repeat, axis=-1)


def _one(stat: str, time: str) -> tuple[tuple[str, ...], Callable[[Draw], np.ndarray]]:
    """The fields one run's statistic `stat` (ONE_RUN) reads at `time`, and its formula over a draw."""
    _check(stat, ONE_RUN, time)
    tok, sec = _TIME_FIELDS[time]
    table: dict[str, tuple[tuple[str, ...], Callable[[Draw], np.ndarray]]] = {
        "tok/s": ((tok, sec), lambda d: _rate(d, tok, sec)),
        "τ": (("new_tokens", "target_calls"), lambda d: _ratio(d["new_tokens"], d["target_calls"])),
        "AccRate": (("accepted", "drafted"), lambda d: _ratio(d["accepted"], d["drafted"])),
        "accept length": (("accepted", "iterations"), lambda d: _ratio(d["accepted"] + d["iterations"], d["iterations"])),
        "vllm length": (("accepted", "draft_iterations"), lambda d: 1 + _ratio(d["accepted"], d["draft_iterations"])),
        "score": (("score",), lambda d: _mean(d["score"]))}
    return table[stat]


def _two(stat: str, time: str) -> tuple[tuple[str, ...], Callable[[Draw, Draw], np.ndarray]]:
    """The fields a paired statistic `stat` (PAIRED) reads at `time`, and its formula over two draws."""
    _check(stat, PAIRED, time)
    tok, sec = _TIME_FIELDS[time]

    def score_diff(a: Draw, b: Draw) -> np.ndarray:
        both = ~np.isnan(_mean(a["score"], (-1,))) & ~np.isnan(_mean(b["score"], (-1,)))  # (B, P)
        return (_mean(np.where(both[..., None], a["score"], np.nan))
                - _mean(np.where(both[..., None], b["score"], np.nan)))

    table: dict[str, tuple[tuple[str, ...], Callable[[Draw, Draw], np.ndarray]]] = {
        "speedup": ((tok, sec), lambda a, b: _rate(a, tok, sec) / _rate(b, tok, sec)),
        "mean ratio": ((tok, sec), lambda a, b: _mean(  # (B, P): each prompt's Σ tokens / Σ seconds over its repeats
            _ratio(a[tok], a[sec], axes=(-1,)) / _ratio(b[tok], b[sec], axes=(-1,)), (-1,))),
        "Δscore": (("score",), score_diff)}
    return table[stat]


ONE_RUN = ("tok/s", "τ", "AccRate", "accept length", "vllm length", "score")
PAIRED = ("speedup", "mean ratio", "Δscore")


def _check(stat: str, valid: tuple[str, ...], time: str) -> None:
    if stat not in valid:
        raise ValueError(f"statistic {stat!r}: valid statistics are {', '.join(valid)}")
    if time not in TIMES:
        raise ValueError(f"time {time!r}: valid times are {', '.join(TIMES)}")


def _quantiles(values: np.ndarray) -> tuple[float, float]:
    if np.isnan(values).all():
        return float("nan"), float("nan")
    lo, hi = np.nanquantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


def value(p: Prompts, stat: str, time: str = "decode") -> float:
    """One run's statistic `stat` (ONE_RUN) pooled over every prompt and repeat (the draws' formula on all rows)."""
    names, f = _one(stat, time)
    return float(f({n: p.fields[n][None] for n in names})[0])


def interval(p: Prompts, stat: str, time: str = "decode") -> tuple[float, float]:
    """The 95% bootstrap interval of one run's statistic `stat` (ONE_RUN); NaN, NaN where it is undefined."""
    names, f = _one(stat, time)
    rng = np.random.default_rng(SEED)
    idx = rng.integers(0, len(p.ids), (RESAMPLES, len(p.ids)))
    return _quantiles(f(_draw(p, idx, names, rng)))


def _aligned(a: Prompts, b: Prompts) -> tuple[np.ndarray, np.ndarray]:
    """The positions in a and in b of the prompts both hold (by id)."""
    common = sorted(set(a.ids) & set(b.ids))
    if not common:
        raise ValueError("the two runs share no prompt: a paired interval needs the same prompts")
    at_a, at_b = {k: i for i, k in enumerate(a.ids)}, {k: i for i, k in enumerate(b.ids)}
    return np.array([at_a[k] for k in common]), np.array([at_b[k] for k in common])


def paired_value(a: Prompts, b: Prompts, stat: str, time: str = "decode") -> float:
    """The statistic `stat` (PAIRED) of run a against run b on their common prompts and every recorded repeat."""
    names, f = _two(stat, time)
    ia, ib = _aligned(a, b)
    return float(f({n: a.fields[n][ia][None] for n in names}, {n: b.fields[n][ib][None] for n in names})[0])


def paired_interval(a: Prompts, b: Prompts, stat: str, time: str = "decode") -> tuple[float, float]:
    """The 95% bootstrap interval of `stat` (PAIRED) of run a against run b: the same prompts drawn for both."""
    names, f = _two(stat, time)
    ia, ib = _aligned(a, b)
    rng = np.random.default_rng(SEED)
    idx = rng.integers(0, len(ia), (RESAMPLES, len(ia)))
    return _quantiles(f(_draw(a, ia[idx], names, rng), _draw(b, ib[idx], names, rng)))


def text(value: float, lo: float, hi: float, spec: str) -> str:
    """'1.23 [1.10–1.35]' ('' without a value; the value alone without an interval)."""
    if np.isnan(value):
        return ""
    out = format(value, spec)
    return out if np.isnan(lo) or np.isnan(hi) else f"{out} [{lo:{spec}}–{hi:{spec}}]"


def of_run(run: pd.Series, stat: str) -> tuple[float, float]:
    """The interval of a loaded run's (specbench.analysis.load) statistic `stat`, at the run's `time`."""
    return interval(run["prompts"], stat, run["time"])


def of_pair(run: pd.Series, base: pd.Series | None, stat: str, ids: set[str] | None = None
            ) -> tuple[float, float, float]:
    """(value, lo, hi) of `stat` (PAIRED) of a loaded run against its baseline run on the prompts `ids` (None: all);
    NaN without a baseline; the baseline against itself: the value, no interval."""
    if base is None:
        return float("nan"), float("nan"), float("nan")
    a, b = (r["prompts"] if ids is None else subset(r["prompts"], ids) for r in (run, base))
    value = paired_value(a, b, stat, run["time"])
    if base["run_dir"] == run["run_dir"]:
        return value, float("nan"), float("nan")
    return value, *paired_interval(a, b, stat, run["time"])


def excludes_zero(lo: float, hi: float) -> bool:
    """Does the interval [lo, hi] leave out 0 (a difference the prompts support at the 95% level)?"""
    return bool(lo > 0 or hi < 0)
