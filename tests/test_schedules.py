"""The `heuristic` and `confidence` policies against hand-worked sequences, and both against `ar` through the runner."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_curve

from helpers import small
from specbench.decoding.records import IterationRecord
from specbench.runs.runner import build_method, run


def rec(drafted: int, accepted: int, stop: str = "window") -> IterationRecord:
    return IterationRecord(drafted=drafted, accepted=accepted, stop=stop, draft_s=0.0, verify_s=0.0)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


def test_heuristic_gamma_sequence_by_hand():
    m = build_method({"name": "heuristic", "gamma": 3}).policy
    m.reset()
    # (drafted, accepted, stop) -> γ after the update, worked by hand with
    # γ += 2 if accepted == drafted else max(1, γ - 1):
    steps = [
        ((3, 3, "window"), 5),  # all accepted: 3 + 2
        ((5, 2, "window"), 4),  # 5 - 1
        ((4, 0, "window"), 3),
        ((3, 1, "window"), 2),
        ((2, 0, "window"), 1),
        ((1, 0, "window"), 1),  # floor at 1
        ((1, 1, "window"), 3),
        ((3, 3, "eos"), 2),  # drafted EOS accepted: transformers counts 2 matches of 3 -> 3 - 1
        ((2, 1, "eos"), 1),  # drafted EOS rejected: 1 of 2 -> 2 - 1
        ((0, 0, "length"), 3),  # nothing drafted: 0 == 0 counts as all accepted (as transformers)
    ]
    got = []
    for (w, n, stop), _ in steps:
        assert m.window() == (got[-1] if got else 3)
        m.update(rec(w, n, stop))
        got.append(m.state()["gamma"])
    assert got == [g for _, g in steps]


@pytest.mark.parametrize("persist", [False, True])
def test_heuristic_reset_and_persist(persist):
    m = build_method({"name": "heuristic", "gamma": 5, "persist": persist}).policy
    m.reset()
    m.update(rec(5, 5))
    assert m.window() == 7
    m.reset()  # next example
    assert m.window() == (7 if persist else 5)


def drive(m, iterations: list[tuple[list[float], int]]) -> list[float]:
    """Feed (draft probabilities, accepted) per iteration through keep_drafting and update; thresholds after each."""
    out = []
    for probs, accepted in iterations:
        for i, p in enumerate(probs):
            q = torch.tensor([p, 1.0 - p])  # token 0 drafted with probability p
            m.keep_drafting(i + 1, q, 0)
        m.update(rec(len(probs), accepted, "policy"))
        out.append(m.state()["threshold"])
    return out


def test_confidence_threshold_update_matches_roc_by_hand():
    m = build_method({"name": "confidence"}).policy
    m.reset()
    its = [
        ([0.9, 0.8, 0.3], 3),  # all accepted: labels 1 1 1 (3 samples: no refit)
        ([0.7, 0.6], 1),  # 0.7 accepted, 0.6 first rejected: 1 0 (5 samples: no refit)
        ([0.95, 0.5, 0.45, 0.2], 1),  # 1 0, the last two dropped (7 samples, both labels: refit)
        ([0.35, 0.25], 2),  # 1 1 (9 samples: refit)
    ]
    thresholds = drive(m, its)
    probs = [float(torch.tensor(p)) for p in (0.9, 0.8, 0.3, 0.7, 0.6, 0.95, 0.5, 0.35, 0.25)]  # as float32
    labels = [1, 1, 1, 1, 0, 1, 0, 1, 1]

    def direct(k: int) -> float:
        fpr, tpr, th = roc_curve(labels[:k], probs[:k])
        return float(th[np.argmin(fpr + 3 * (1 - tpr))])

    assert thresholds[:2] == [0.4, 0.4]  # at most 5 samples: unchanged
    assert thresholds[2] == direct(7) and thresholds[3] == direct(9)
    assert m.probs == probs and m.labels == labels


def test_confidence_stop_rule_and_off_switch():
    m = build_method({"name": "confidence", "threshold": 0.4}).policy
    m.reset()
    assert m.keep_drafting(1, torch.tensor([0.4, 0.6]), 0)  # p == threshold: keep (the test is p < threshold)
    assert not m.keep_drafting(2, torch.tensor([0.39, 0.61]), 0)
    off = build_method({"name": "confidence", "threshold": 0.0}).policy
    off.reset()
    assert off.keep_drafting(1, torch.tensor([1e-6, 1.0]), 0)
    assert drive(off, [([0.1, 0.9], 1)] * 4) == [0.0] * 4 and off.probs == []  # no samples, no refit
    fixed = build_method({"name": "confidence", "roc": False}).policy
    fixed.reset()
    assert drive(fixed, [([0.9, 0.5, 0.45], 1)] * 4) == [0.4] * 4


def test_confidence_restarts_every_call():
    m = build_method({"name": "confidence"}).policy
    m.reset()
    drive(m, [([0.9, 0.8, 0.7, 0.6], 2), ([0.9, 0.5, 0.45], 2)])
    assert m.state()["threshold"] != 0.4
    m.reset()
    assert m.state() == {"threshold": 0.4, "samples": 0}


@pytest.fixture(scope="module")
def ar_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("ar")
    run(small("method=ar", "decode.max_new_tokens=40", "limit=12"), out)
    return rows(out)


@pytest.mark.parametrize("method", ["heuristic", "confidence"])
def test_greedy_equals_ar_through_the_runner(tmp_path, ar_rows, method):
    summary = run(small(f"method={method}", "decode.max_new_tokens=40", "limit=12"), tmp_path)
    got = rows(tmp_path)
    assert [r["id"] for r in got] == [r["id"] for r in ar_rows]
    for a, r in zip(ar_rows, got):
        assert r["token_ids"] == a["token_ids"], f"{r['id']}: {method} differs from ar"
        assert r["lossless"] is True
    assert 0.1 < summary["acceptance_rate"] < 0.95


def test_hf_assisted_rows_are_lossless(tmp_path):
    cfg = small("method=hf_assisted", "pair.target.vocab_size=259", "pair.draft.vocab_size=259",
                "decode.max_new_tokens=24", "limit=3")
    summary = run(cfg, tmp_path)
    got = rows(tmp_path)
    assert summary["lossless"] is True and all(r["lossless"] is True for r in got)
    for r in got:
        assert r["new_tokens"] == 24 and r["target_calls"] == r["iterations"] > 0
        assert r["drafted"] >= r["accepted"] and r["draft_calls"] >= r["drafted"]
        assert r["decode_s"] >= r["model_s"] > 0
