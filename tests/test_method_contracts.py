"""Contracts every method in conf/method keeps, checked for each name, so a new method file is tested
without a test of its own:
  (a) a method that says it is lossless decodes, greedily, the tokens of the target's own argmax decode
      (full forwards without a cache: the truth `ar` must match too);
  (b) no iteration drafts more than the budget() it began with (a chain: the window), nor more than max_new_tokens leaves
      (new tokens so far + drafts + the verifier's token <= max_new_tokens), and no row holds more new tokens;
  (c) with trace=true, every key of the method's state() is in every trace record;
  (d) a method that says it is lossless samples, under temperature with top-k, top-p or both, at B = 1 and
      B = 4, first two tokens that follow the target's exact joint p(t1) p(t2 | t1) under those settings
      (computed with numpy from cache-free target forwards, helpers.warped_probs; chi-square), or refuses the
      settings or batch size before decoding (uag samples not at all, hf_assisted decodes one row at a time).

Each method runs through the real composed config (`method=<name>`: conf/method/<name>.yaml) on tiny_random
with one vocab_size for both models (transformers' assisted generation, `hf_assisted`, refuses different sizes),
the smoke prompts, greedy, float32 (the CPU default), one thread. A method whose config names a trained drafter
(`drafter:`, as distilled and sd2) or head (`head:`, as eagle3, eagle3_tree and medusa) gets a two-step
`task=distill` run of its class's `kind` (the session fixture `trained_drafter`). A method with a loop of its own
(Method.loop: hf_assisted) decodes with transformers' loop, which never asks window(): its contract is (a), the
length part of (b), (c) and (d).
For (d) the method built from the same config, bound as the runner binds it, decodes SAMPLED_NEW new tokens after two
fixed prompts a few dozen times per case (DRAWS): the first two tokens against the exact joint (chi-square), every
token against the exact distribution given its prefix (a randomized probability integral transform, pit_pvalue), and
the case must have judged drafts both ways (some accepted, some rejected); two wrong variants show the check fails: a
verifier that drops top-k and top-p, and correct counts against a target joint that ignores one of them.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import DictConfig, OmegaConf

import specbench.runs.runner as runner
from helpers import TEST_DEVICE, SAME_VOCAB, chi2_pvalue_groups, small, warped_probs
from specbench.common.options import OptionError
from specbench.data.dataset import build_dataset
from specbench.data.prompting import encode
from specbench.decoding.acceptance import Greedy
from specbench.decoding.engine import Engine
from specbench.decoding.compose import method_names
from specbench.decoding.method import Method
from specbench.decoding.records import IterationRecord
from specbench.decoding.sampling import Sampler
from specbench.models.pairs import load_pair
from specbench.runs.results import ROWS, read_rows
from specbench.runs.traces import read_traces

MAX_NEW, EXAMPLES = 24, 8  # a window of 20 meets the length cap inside a generation
SETTINGS = (*SAME_VOCAB, "decode=greedy", f"decode.max_new_tokens={MAX_NEW}", f"limit={EXAMPLES}", "threads=1",
            "trace=true")
# a part that is not a method of its own (a rule) joins the contracts on a method that takes it: name -> (the
# registered method, its overrides)
VARIANTS = {"vanilla[rule=block]": ("vanilla", ("method.parts.rule=block",)),
            "gammatune[rule=block]": ("gammatune", ("method.parts.rule=block",)),
            "suffix[shape=tree]": ("suffix", ("method.parts.shape=tree",))}
NAMES = method_names() + list(VARIANTS)


def method_cfg(name: str, trained_drafter: Callable[..., Path] | None = None) -> DictConfig:
    """The composed run config of method `name` (or of a VARIANTS entry); with `trained_drafter`, a `drafter` or `head`
    it names is replaced by a trained folder of the method's kind (without, the configured path stays: enough to build,
    not to decode)."""
    base, overrides = VARIANTS.get(name, (name, ()))
    cfg = small(*SETTINGS, f"method={base}", *overrides)
    for key in ("drafter", "head"):
        if key in cfg.method and trained_drafter is not None:
            folder = trained_drafter(runner.build_method({"name": base}).drafter.distill_kind, *SAME_VOCAB)
            cfg = small(*SETTINGS, f"method={base}", *overrides, f"method.{key}={folder}")
    return cfg


def lossless_names() -> list[str]:
    """The registered methods that, as configured in conf/method/, say they are lossless."""
    built = {n: runner.build_method(OmegaConf.to_container(method_cfg(n).method, resolve=True)) for n in NAMES}
    return [n for n, m in built.items() if m.plan.lossless]


@dataclasses.dataclass
class Decoded:
    """One traced run of a method: the method object, its rows, its traces and, for every iteration the engine
    ran, (the last window() answer before the iteration's update, drafts of the iteration)."""

    method: Method
    rows: list[dict]
    traces: pd.DataFrame
    windows: list[tuple[int | None, int]]


def watch_windows(method: Method) -> list[tuple[int | None, int]]:
    """Wrap the policy's window() to note the budget in force (Method.budget: the most nodes the engine lets it
    draft, the window for a chain) and its update() to log (budget in force, drafted) per iteration; returns the
    log."""
    log: list[tuple[int | None, int]] = []
    last: list[int | None] = [None]  # no window asked yet (a method that never drafts)
    policy = method.policy
    window, update = policy.window, policy.update

    def logged_window() -> int:
        w = window()
        last[0] = method.drafter.budget(method.shape.budget(w))
        return w

    def logged_update(record: IterationRecord) -> None:
        log.append((last[0], record.drafted))
        update(record)

    policy.window, policy.update = logged_window, logged_update  # type: ignore[method-assign]
    return log


def decode_run(cfg: DictConfig, out: Path) -> Decoded:
    """runner.run(cfg) into `out` with the method it builds watched (watch_windows)."""
    built: list[tuple[Method, list]] = []
    real = runner.build_method

    def build_watched(method_cfg: dict) -> Method:
        method = real(method_cfg)
        built.append((method, watch_windows(method)))
        return method

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "build_method", build_watched)
        runner.run(cfg, out)
    [(method, windows)] = built
    return Decoded(method, read_rows(out / ROWS), read_traces(out), windows)


def argmax_decode(model: torch.nn.Module, prompt: list[int], max_new: int, eos: set[int], vocab: int) -> list[int]:
    """New tokens [<= max_new]: t = argmax over the tokenizer's ids of p(. | prompt + tokens so far), each from a
    full forward without a cache, up to and including an EOS id."""
    ids = list(prompt)
    with torch.no_grad():
        while len(ids) - len(prompt) < max_new and (len(ids) == len(prompt) or ids[-1] not in eos):
            ids.append(int(model(torch.tensor([ids], device=model.device)).logits[0, -1, :vocab].argmax()))
    return ids[len(prompt):]


def check_lossless(d: Decoded, truth: dict[str, list[int]]) -> None:
    """Every example decoded, each with exactly the truth's tokens."""
    assert [r["id"] for r in d.rows] == list(truth), f"{d.method.name}: examples differ"
    for r in d.rows:
        want, got = truth[r["id"]], r["token_ids"]
        at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
        assert got == want, (f"{d.method.name} says it is lossless but {r['id']} differs from the target's argmax "
                             f"decode at new token {at} ({len(got)} tokens, truth {len(want)})")


def check_windows(d: Decoded, max_new: int) -> dict[str, int]:
    """Drafts per iteration <= the window() in force (engine methods) and <= max_new - committed - 1;
    new tokens per row <= max_new. Returns how many iterations drafted a whole window / up to the length cap."""
    met = {"window": sum(0 < drafted == window for window, drafted in d.windows), "length": 0}
    for k, (window, drafted) in enumerate(d.windows):
        assert drafted <= (window or 0), f"{d.method.name}: iteration {k} drafted {drafted}, window() was {window}"
    if d.method.loop is None:  # every traced iteration went through the watched update
        assert len(d.windows) == len(d.traces), f"{d.method.name}: {len(d.windows)} updates, {len(d.traces)} records"
    for r in d.rows:
        its = d.traces[d.traces["id"] == r["id"]].sort_values("iteration")
        assert len(its) == r["iterations"], f"{d.method.name}: {r['id']} traced {len(its)} of {r['iterations']}"
        committed = 0
        for k, (drafted, accepted) in enumerate(zip(its["drafted"], its["accepted"])):
            left = max_new - committed - 1  # room for drafts: the verifier adds one token
            assert drafted <= left, (f"{d.method.name}: {r['id']} iteration {k} drafted {drafted} after {committed} "
                                     f"of {max_new} new tokens")
            met["length"] += 0 < drafted == left
            committed += accepted + 1
        assert len(r["token_ids"]) == r["new_tokens"] <= max_new, f"{d.method.name}: {r['id']} overran max_new_tokens"
    return met


def check_state(d: Decoded) -> None:
    """Every key of state() is a trace column with a value in every record."""
    assert len(d.traces), f"{d.method.name}: no trace records"
    for key in d.method.logged_state(d.method.policy):
        assert key in d.traces.columns, f"{d.method.name}: state key {key!r} missing from the traces"
        assert d.traces[key].notna().all(), f"{d.method.name}: state key {key!r} missing from some trace records"


@pytest.fixture(scope="module")
def truth() -> dict[str, list[int]]:
    """Example id -> the greedy continuation by cache-free target forwards (argmax_decode), `ar`'s EOS ids."""
    cfg = small(*SETTINGS)
    pair = load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device(TEST_DEVICE))
    assert pair.target.dtype == torch.float32
    eos = pair.eos_ids([pair.target])
    examples = build_dataset(OmegaConf.to_container(cfg.dataset)).examples()[:EXAMPLES]
    return {ex.id: argmax_decode(pair.target, encode(pair.tokenizer, ex), MAX_NEW, eos, pair.vocab_size)
            for ex in examples}


@pytest.fixture(scope="module")
def decoded(tmp_path_factory, trained_drafter) -> Callable[[str], Decoded]:
    """name -> the method's traced run on SETTINGS, decoded once a module."""

    @functools.cache
    def one(name: str) -> Decoded:
        return decode_run(method_cfg(name, trained_drafter), tmp_path_factory.mktemp(name))

    return one


def test_every_registered_method_is_checked():
    """The registry lists every method file (a new one joins these tests), and the lossless list is not empty."""
    assert {"ar", "vanilla", "adasd", "draft_only", "distilled", "sd2", "hf_assisted", "pld", "layer_skip",
            "uag"} <= set(NAMES)
    lossless = lossless_names()
    assert {"ar", "vanilla", "heuristic", "confidence", "gammatune", "gammatune_plus", "adasd_gen_only", "distilled",
            "sd2", "hf_assisted", "pld", "layer_skip", "uag", "vanilla[rule=block]", "gammatune[rule=block]", "suffix", "suffix[shape=tree]"} <= set(lossless)
    assert "draft_only" not in lossless and "adasd" not in lossless


@pytest.mark.parametrize("name", lossless_names())
def test_a_lossless_method_decodes_the_targets_greedy_tokens(decoded, truth, name):
    d = decoded(name)
    assert d.method.plan.lossless
    check_lossless(d, truth)


@pytest.mark.parametrize("name", NAMES)
def test_an_iterations_wall_time_splits_into_forwards_and_host_work(decoded, name):
    """Each traced iteration's verifier forwards, drafter forwards and host work (verify_forward_s, draft_forward_s,
    host_s) sum over a row to its decode_s, and its forwards to its model_s (batch_size 1: the engine's own
    bookkeeping, whatever the timings); an external method (transformers' loop) records no split."""
    d = decoded(name)
    if d.method.loop is not None:
        pytest.skip(f"{name} decodes in transformers' loop: its iterations are not the engine's")
    for r in d.rows:
        its = d.traces[d.traces["id"] == r["id"]]
        forwards = its["verify_forward_s"].sum() + its["draft_forward_s"].sum()
        assert (its[["verify_forward_s", "draft_forward_s"]] >= 0).all().all()
        assert forwards + its["host_s"].sum() == pytest.approx(r["decode_s"], rel=1e-9, abs=1e-12), r["id"]
        assert forwards == pytest.approx(r["model_s"], rel=1e-9, abs=1e-12), r["id"]


@pytest.mark.parametrize("name", NAMES)
def test_drafts_stay_inside_the_window_and_max_new_tokens(decoded, name):
    check_windows(decoded(name), MAX_NEW)


@pytest.mark.parametrize("name", NAMES)
def test_state_keys_are_in_the_traces(decoded, name):
    check_state(decoded(name))


def test_the_caps_were_reached(decoded):
    """The window checks are not vacuous: some iterations drafted a whole window, some up to the length cap."""
    met = [check_windows(decoded(name), MAX_NEW) for name in NAMES]
    assert sum(m["window"] for m in met) > 0 and sum(m["length"] for m in met) > 0, met


class ShiftEveryThird(Greedy):
    """Greedy matching whose every third next token is moved to the following id: it says lossless, it is not."""

    name = "shift_every_third"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, c, p, generators, thresholds):
        ok, top = super().decide(c, p, generators, thresholds)
        self.calls += 1
        return ok, (top + 1) % p.shape[-1] if self.calls % 3 == 0 else top


def test_the_lossless_check_catches_a_lossy_method(monkeypatch, tmp_path, truth):
    """vanilla whose engine decides with ShiftEveryThird corrupts tokens while its plan says it is lossless."""
    from specbench.decoding import engine

    monkeypatch.setattr(engine, "make_rule", lambda spec, greedy=False: ShiftEveryThird())
    d = decode_run(small(*SETTINGS, "method=vanilla"), tmp_path)
    assert d.method.plan.lossless
    check_windows(d, MAX_NEW)
    check_state(d)
    with pytest.raises(AssertionError, match="vanilla says it is lossless but smoke-00 differs"):
        check_lossless(d, truth)


def test_the_window_length_and_state_checks_catch_bad_runs():
    """Hand-made runs of vanilla γ=2 and max_new_tokens=4: one that keeps the contracts, then one break each."""
    method = runner.build_method({"name": "vanilla", "gamma": 2})
    traces = pd.DataFrame({"id": ["a", "a"], "iteration": [0, 1], "drafted": [2, 0], "accepted": [2, 0],
                           "stop": ["window", "length"], "gamma": [2, 2]})
    rows = [{"id": "a", "token_ids": [1, 2, 3, 4], "new_tokens": 4, "iterations": 2}]
    good = Decoded(method, rows, traces, [(2, 2), (2, 0)])
    assert check_windows(good, 4) == {"window": 1, "length": 0}
    capped = dataclasses.replace(good, rows=[{**rows[0], "token_ids": [1, 2, 3], "new_tokens": 3, "iterations": 1}],
                                 traces=traces.iloc[:1], windows=[(2, 2)])  # max_new_tokens=3 left room for 2 drafts
    assert check_windows(capped, 3) == {"window": 1, "length": 1}
    check_state(good)
    with pytest.raises(AssertionError, match="iteration 0 drafted 2, window\\(\\) was 1"):
        check_windows(dataclasses.replace(good, windows=[(1, 2), (1, 0)]), 4)
    with pytest.raises(AssertionError, match="1 updates, 2 records"):  # an iteration the watch did not see
        check_windows(dataclasses.replace(good, windows=[(2, 2)]), 4)
    with pytest.raises(AssertionError, match="iteration 1 drafted 1 after 3 of 4 new tokens"):
        check_windows(dataclasses.replace(good, traces=traces.assign(drafted=[2, 1])), 4)
    with pytest.raises(AssertionError, match="a overran max_new_tokens"):
        check_windows(dataclasses.replace(good, rows=[{**rows[0], "token_ids": [1, 2, 3, 4, 5], "new_tokens": 5}]), 4)
    with pytest.raises(AssertionError, match="state key 'gamma' missing from the traces"):
        check_state(dataclasses.replace(good, traces=traces.drop(columns="gamma")))
    with pytest.raises(AssertionError, match="state key 'gamma' missing from some trace records"):
        check_state(dataclasses.replace(good, traces=traces.assign(gamma=[2, None])))


# --- (d) sampling: under temperature with top-k / top-p the first two tokens follow the target's exact joint ---

SAMPLED = {"top_k": (0.5, 3, None), "top_p": (0.5, None, 0.5), "top_k_top_p": (0.8, 6, 0.65)}  # T, top_k, top_p
# two prompt lengths, so a B = 4 batch left-pads; the second ends with its first token, so prompt lookup (pld) drafts
# its second token, 6, the target's likeliest; under every setting each cut of the first two tokens' distributions
# is at least 0.01 away from a tie or from top_p (warped_probs checks 1e-4) and EOS is not a first token
SAMPLED_PROMPTS = ([64, 205], [32, 6, 110, 161, 32])
DRAWS = {1: 32, 4: 64}  # batch size -> decodes of SAMPLED_NEW new tokens per method and setting
# new tokens per decode: enough for every method's drafts to be both accepted and rejected in every case (asserted);
# lookahead's n-gram pool fills from its window as it decodes, and the heads trained two steps (eagle3) seldom agree
# with the target, so their first accepted drafts come later
SAMPLED_NEW, LONGER = 16, {"lookahead": 32, "eagle3": 32, "eagle3_tree": 32}
# the p-value a lossless method's case must pass: with about 80 cases a correct method fails one by chance with
# probability about 80 * 1e-4 < 1% (a fresh random stream, e.g. on CUDA); a wrong variant must fall below 1e-6
P_PASS = 1e-4
# what a lossless method refuses before decoding instead (the runner's check_batch, then check_decode)
REFUSES = {("uag", 1): "decode.temperature=0 only", ("uag", 4): "one row at a time",
           ("hf_assisted", 4): "batch size 1 only", ("lookahead", 4): "one row at a time"}


@pytest.fixture(scope="module")
def sampling_pair():
    """The pair of SETTINGS (tiny_random with one vocab_size), loaded once for the sampling contract."""
    cfg = small(*SETTINGS)
    return load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device(TEST_DEVICE))


def sampled_joints(pair, setting: str, ignore: str | None = None) -> np.ndarray:
    """Exact p(t1, t2 | prompt) [prompts, V, V] under SAMPLED[setting] (with the `ignore` key, top_k or top_p, off)
    from cache-free target forwards: p(t1) p(t2 | t1), each warped by helpers.warped_probs."""
    T, top_k, top_p = SAMPLED[setting]
    top_k, top_p = (None if ignore == "top_k" else top_k), (None if ignore == "top_p" else top_p)
    V = pair.vocab_size

    def probs(prefixes: list[list[int]]) -> list[np.ndarray]:  # [V] after each of n equal-length prefixes
        with torch.no_grad():
            logits = pair.target(torch.tensor(prefixes, device=pair.target.device)).logits[:, -1, :V]
        return [warped_probs(row, T, top_k, top_p) for row in logits.double().cpu().numpy()]

    joints = np.zeros((len(SAMPLED_PROMPTS), V, V))
    for i, prompt in enumerate(SAMPLED_PROMPTS):
        [p1] = probs([list(prompt)])
        first = np.flatnonzero(p1)
        if ignore is None:
            assert not set(first.tolist()) & pair.eos_ids([pair.target]), "an EOS first token would end the decode"
        for t, p2 in zip(first, probs([[*prompt, int(t)] for t in first])):
            joints[i, t] = p1[t] * p2
    return joints


@functools.cache
def composed(name: str, trained_drafter: Callable[..., Path]) -> tuple[dict, dict]:
    """The method and decode nodes of method_cfg(name, trained_drafter), resolved (composed once a session)."""
    cfg = method_cfg(name, trained_drafter)
    return OmegaConf.to_container(cfg.method, resolve=True), OmegaConf.to_container(cfg.decode, resolve=True)


def sampled_engine(pair, name: str, B: int, setting: str, trained_drafter: Callable[..., Path]) -> Engine:
    """Method `name` from its composed config with SAMPLED[setting], checked for batch size B and bound to `pair`
    as the runner does (check_batch, check_decode, make_engine)."""
    T, top_k, top_p = SAMPLED[setting]
    method_dict, decode = composed(name, trained_drafter)
    params = runner.sampling_params({**decode, "temperature": T, "top_k": top_k, "top_p": top_p})
    method = runner.build_method(method_dict)
    method.plan.refuse(method.name, B, params=params)
    return runner.make_engine(pair, method, params, ())


@dataclasses.dataclass
class Sampled:
    """A method's sampled decodes: counts [prompts, V, V] of the first two new tokens, each decode's (prompt, new
    tokens), and the drafts its iterations judged: accepted and rejected."""

    counts: np.ndarray
    decodes: list[tuple[list[int], list[int]]]
    accepted: int
    rejected: int


def sample(engine: Engine, B: int, new_tokens: int = SAMPLED_NEW) -> Sampled:
    """DRAWS[B] seeded decodes of `new_tokens` new tokens, B rows per call, the rows taking the prompts in turn (B = 1:
    call by call; B = 4: two rows of each prompt per call)."""
    n = len(SAMPLED_PROMPTS)
    out = Sampled(np.zeros((n, engine.sampler.vocab_size, engine.sampler.vocab_size)), [], 0, 0)
    gens = [torch.Generator(device=engine.device).manual_seed(1000 + b) for b in range(B)]
    for call in range(DRAWS[B] // B):
        rows = [(call * B + b) % n for b in range(B)]  # the prompt of each row
        for i, g in zip(rows, engine.generate_batch([list(SAMPLED_PROMPTS[i]) for i in rows], new_tokens, gens)):
            out.counts[i, g.token_ids[0], g.token_ids[1]] += 1
            out.decodes.append((list(SAMPLED_PROMPTS[i]), list(g.token_ids)))
            out.accepted += sum(r.accepted for r in g.records)
            out.rejected += sum(r.drafted - r.accepted for r in g.records)
    return out


def pit_pvalue(pair, decodes: list[tuple[list[int], list[int]]], setting: str) -> float:
    """Every new token against its exact distribution given the tokens before it: with the truncated, warped target
    p(. | prefix) (one cache-free target forward per decode, helpers.warped_probs) and u ~ U[0, 1) from a fixed seed,
    the randomized probability integral transform F(x - 1) + u p(x) of each token x is uniform on [0, 1) and
    independent across positions exactly when each token is drawn from p (the Rosenblatt transform); the p-value of a
    Kolmogorov-Smirnov test of them all against U[0, 1), 0 for a token p never emits."""
    from scipy.stats import kstest

    T, top_k, top_p = SAMPLED[setting]
    V, rng, pits = pair.vocab_size, np.random.default_rng(7), []
    for prompt, new in decodes:
        with torch.no_grad():
            logits = pair.target(torch.tensor([prompt + new], device=pair.target.device)).logits[0, :, :V]
        for k, x in enumerate(new):
            p = warped_probs(logits[len(prompt) - 1 + k].double().cpu().numpy(), T, top_k, top_p, margin=0)
            if p[x] == 0:
                return 0.0
            pits.append(p[:x].sum() + rng.random() * p[x])
    return float(kstest(pits, "uniform").pvalue)


@pytest.fixture(scope="module")
def sampled(sampling_pair, trained_drafter) -> Callable[[str, int, str], Sampled]:
    """(name, B, setting) -> the Sampled decodes of the method's engine, decoded once a module."""

    @functools.cache
    def one(name: str, B: int, setting: str) -> Sampled:
        return sample(sampled_engine(sampling_pair, name, B, setting, trained_drafter), B, LONGER.get(name, SAMPLED_NEW))

    return one


@pytest.fixture(scope="module")
def sampled_truth(sampling_pair) -> Callable[..., np.ndarray]:
    """(setting, ignore=None) -> sampled_joints, computed once a module."""
    return functools.cache(functools.partial(sampled_joints, sampling_pair))


@pytest.mark.parametrize("setting", list(SAMPLED))
@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("name", lossless_names())
def test_a_lossless_method_samples_the_targets_truncated_distribution(sampled, sampled_truth, sampling_pair, name, B,
                                                                     setting):
    if (name, B) in REFUSES:
        with pytest.raises(OptionError, match=REFUSES[name, B]):
            sampled(name, B, setting)
        return
    got = sampled(name, B, setting)
    assert got.counts.sum() == DRAWS[B]
    assert chi2_pvalue_groups(got.counts, sampled_truth(setting)) > P_PASS  # the first two tokens' exact joint
    assert pit_pvalue(sampling_pair, got.decodes, setting) > P_PASS  # every token given its prefix
    if name != "ar":  # the rule judged drafts both ways: accepted ones and rejected ones
        assert got.accepted > 0 and got.rejected > 0, (got.accepted, got.rejected)


@pytest.mark.parametrize("setting", list(SAMPLED))
def test_the_sampling_check_fails_against_a_target_that_ignores_a_truncation(sampled, sampled_truth, setting):
    """ar's and vanilla's counts at B = 1 and 4 (together: draws of one distribution) against the joint without
    top-p (without top-k under top-k alone): the check must fail."""
    ignore = "top_k" if setting == "top_k" else "top_p"
    counts = sum(sampled(name, B, setting).counts for name in ("ar", "vanilla") for B in (1, 4))
    assert chi2_pvalue_groups(counts, sampled_truth(setting)) > P_PASS
    assert chi2_pvalue_groups(counts, sampled_truth(setting, ignore)) < 1e-6


@pytest.mark.parametrize("setting", list(SAMPLED))
def test_the_sampling_check_catches_a_verifier_that_drops_top_k_and_top_p(monkeypatch, sampling_pair, trained_drafter,
                                                                          sampled_truth, setting):
    """vanilla whose target distributions [B, positions, V] keep the temperature but drop top-k and top-p (its
    drafts [B, V] keep every setting): its tokens follow the untruncated target and the check fails."""
    real = Sampler.probs

    def untruncated_verify(self, logits):
        if logits.dim() == 2:
            return real(self, logits)
        return torch.softmax(logits[..., : self.vocab_size].float() / self.params.temperature, dim=-1)

    monkeypatch.setattr(Sampler, "probs", untruncated_verify)
    got = sample(sampled_engine(sampling_pair, "vanilla", 4, setting, trained_drafter), 4)
    assert chi2_pvalue_groups(got.counts, sampled_truth(setting)) < 1e-6
    assert pit_pvalue(sampling_pair, got.decodes, setting) < 1e-6
