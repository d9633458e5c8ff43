"""What rows say about themselves: the new-token budget a run chose (decode's or the dataset's), the
`truncated` flag (stopped by max_new_tokens before the task's answer was complete) and its count in the
summary, judged per dataset by the evaluator's `answer_complete`."""

import json
import logging

import pytest
import yaml

from helpers import ROOT, compose_cfg, small
from specbench.common.options import OptionError
from specbench.common.options import max_new_tokens
from specbench.data.dataset import Evaluator, Example, build_dataset
from specbench.decoding.metrics import TRUNCATED_WARN_FRAC, summarize
from specbench.evaluators.gsm8k import GSM8K
from specbench.evaluators.mmlu import MMLU
from specbench.evaluators.toy_arith import ToyArith
from specbench.runs.runner import run

DATASETS = sorted(p.stem for p in (ROOT / "conf" / "dataset").glob("*.yaml"))


# --- the budget --------------------------------------------------------------------------------------

def test_an_explicit_decode_budget_wins_and_null_means_the_datasets():
    assert max_new_tokens({"max_new_tokens": 64}, {"name": "gsm8k", "max_new_tokens": 512}) == 64
    assert max_new_tokens({"max_new_tokens": None}, {"name": "gsm8k", "max_new_tokens": 512}) == 512


def test_no_budget_anywhere_names_both_keys():
    with pytest.raises(OptionError, match=r"decode.max_new_tokens is null .* dataset 'mine' sets no max_new_tokens"):
        max_new_tokens({"max_new_tokens": None}, {"name": "mine"})
    with pytest.raises(OptionError, match="dataset.max_new_tokens must be an integer >= 1"):
        max_new_tokens({"max_new_tokens": None}, {"name": "mine", "max_new_tokens": "many"})
    with pytest.raises(OptionError, match="dataset.max_new_tokens must be an integer >= 1"):  # also with decode's set
        build_dataset({"name": "smoke", "max_new_tokens": 0})


@pytest.mark.parametrize("name", DATASETS)
def test_every_dataset_sets_its_budget_and_decode_defers_to_it(name):
    own = yaml.safe_load((ROOT / "conf" / "dataset" / f"{name}.yaml").read_text())["max_new_tokens"]
    assert isinstance(own, int) and own >= 1
    cfg = compose_cfg(f"dataset={name}")
    assert cfg.decode.max_new_tokens is None and max_new_tokens(cfg.decode, cfg.dataset) == own
    assert max_new_tokens(compose_cfg(f"dataset={name}", "decode.max_new_tokens=7").decode, cfg.dataset) == 7


def test_real_model_budgets():
    """Long enough for real models: GSM8K answers ran past 256 tokens, HumanEval code blocks closed at 189-226."""
    budget = {n: yaml.safe_load((ROOT / "conf" / "dataset" / f"{n}.yaml").read_text())["max_new_tokens"]
              for n in DATASETS}
    assert budget["gsm8k"] >= 512 and budget["humaneval"] >= 512
    assert min(budget[n] for n in ("mt_bench", "spec_bench", "alpaca", "alpaca_eval", "ultrachat")) >= 1024


@pytest.mark.parametrize("overrides,budget", [(["dataset.max_new_tokens=5"], 5),
                                              (["dataset.max_new_tokens=5", "decode.max_new_tokens=3"], 3)])
def test_a_run_decodes_with_the_chosen_budget(tmp_path, overrides, budget):
    run(small("limit=3", *overrides), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert max(r["new_tokens"] for r in rows) == budget
    assert all(r["new_tokens"] == budget for r in rows if r["stop_reason"] == "length")


# --- truncated -----------------------------------------------------------------------------------------

def test_truncated_default_a_length_stop_of_free_text():
    ev, ex = Evaluator(), Example(id="a", prompt="p")
    assert ev.truncated(ex, "some text", ["length"]) and not ev.truncated(ex, "some text", ["eos"])
    assert ev.truncated(ex, "two turns", ["length", "eos"])  # an earlier turn cut: the later answers build on it
    assert not ev.truncated(ex, "two turns", ["eos", "stop_string"])


@pytest.mark.parametrize("evaluator,example,done,cut", [
    (GSM8K(), Example(id="g", prompt="q", reference="18"), "9 + 9 = 18\n#### 18", "First, 9 + 9 = 18, then"),
    (GSM8K(), Example(id="g", prompt="q", reference="18"), "So she makes \\(\\boxed{18}\\) dollars.", "\\[ 9 \\times 2"),
    (ToyArith(n=1), Example(id="t", prompt="q", reference=4), "2 + 2 = 4\n#### 4", "2 + 2 = 4\n"),
    (MMLU(), Example(id="m", prompt="q", reference="B", meta={"choices": ["w", "x", "y", "z"], "subject": "s"}),
     "The answer is (B)", "Let us think about each of the"),
])
def test_datasets_that_know_when_their_answer_is_complete(evaluator, example, done, cut):
    assert evaluator.answer_complete(example, done) and not evaluator.answer_complete(example, cut)
    assert not evaluator.truncated(example, done, ["length"]) and evaluator.truncated(example, cut, ["length"])
    assert not evaluator.truncated(example, cut, ["eos"])  # the model ended it: not a budget artefact


def test_rows_flag_truncation_and_the_summary_counts_it(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="specbench.decoding.metrics"):
        summary = run(small("limit=3", "decode.max_new_tokens=8"), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert all(r["truncated"] == (r["stop_reason"] == "length") for r in rows)  # smoke is free text
    n = sum(r["truncated"] for r in rows)
    assert n > 0 and summary["n_truncated"] == n and summary["truncated_frac"] == pytest.approx(n / 3)
    assert "stopped at max_new_tokens before the answer was complete" in caplog.text


def test_summary_warns_only_above_the_threshold(caplog):
    rows = [{"truncated": i == 0} for i in range(int(1 / TRUNCATED_WARN_FRAC))]  # exactly the threshold
    with caplog.at_level(logging.WARNING, logger="specbench.decoding.metrics"):
        s = summarize(rows)
    assert s["n_truncated"] == 1 and s["truncated_frac"] == pytest.approx(TRUNCATED_WARN_FRAC)
    assert "max_new_tokens" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="specbench.decoding.metrics"):
        summarize(rows[:-1])
    assert "1 of 19 rows" in caplog.text
