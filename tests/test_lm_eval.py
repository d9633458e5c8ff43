"""The lm-eval model `specbench`: lm-eval's CLI scores a speculative decoder offline on a local task."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, SYNTHETIC
from specbench.data.dataset import read_local
from specbench.common.options import OptionError
from specbench.lm_eval import SpecbenchLM, task_sampling, to_override
from specbench.decoding.sampling import SamplingParams

TASKS = ROOT / "tests" / "lm_eval_tasks"
LIMIT, MAX_NEW = 3, 16


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """`python -m specbench.lm_eval ... --tasks gsm8k_local` once, offline, on tiny_random with vanilla, on the
    synthetic GSM8K fixtures (the task's file names ../shared/data, the default: here it reads SYNTHETIC)."""
    out = tmp_path_factory.mktemp("lm_eval")
    tasks = out / "tasks"
    tasks.mkdir()
    (tasks / "gsm8k_local.yaml").write_text((TASKS / "gsm8k_local.yaml").read_text().replace("../shared/data",
                                                                                              str(SYNTHETIC)))
    rows = out / "rows.jsonl"
    cmd = [sys.executable, "-m", "specbench.lm_eval", "--model", "specbench",
           "--model_args", f"pair=tiny_random,method=vanilla,method.gamma=3,max_gen_toks={MAX_NEW},threads=1,"
                           f"rows_path={rows}",
           "--device", "cpu", "--include_path", str(tasks), "--tasks", "gsm8k_local", "--limit", str(LIMIT),
           "--output_path", str(out / "results"), "--log_samples"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(next((out / "results").rglob("results_*.json")).read_text())
    samples = [json.loads(line) for line in next((out / "results").rglob("samples_gsm8k_local_*.jsonl")).open()]
    samples = sorted((x for x in samples if x["filter"] == "strict-match"), key=lambda x: x["doc_id"])  # one per doc
    return results, samples, [json.loads(line) for line in rows.open()]


def test_cli_scores_the_task_with_lm_evals_metrics(cli_run):
    results, samples, _ = cli_run
    r = results["results"]["gsm8k_local"]
    assert {"exact_match,strict-match", "exact_match,flexible-extract"} <= set(r)
    assert results["config"]["model"] == "specbench" and results["n-samples"]["gsm8k_local"]["effective"] == LIMIT
    assert len(samples) == LIMIT and all(isinstance(s["resps"][0][0], str) for s in samples)
    test = read_local(SYNTHETIC / "gsm8k" / "test.jsonl")
    assert [s["doc"]["question"] for s in samples] == [t["question"] for t in test[:LIMIT]]


def test_cli_decoded_with_the_configured_speculative_method(cli_run):
    _, samples, rows = cli_run
    assert len(rows) == LIMIT and all(r["method"] == "vanilla" for r in rows)
    assert all(0 < r["new_tokens"] <= MAX_NEW for r in rows)
    assert sum(r["drafted"] for r in rows) > 0 and all(r["mean_drafted"] <= 3 for r in rows)  # gamma=3
    assert [r["output"] for r in rows] == [s["resps"][0][0] for s in samples]


def test_outputs_equal_the_engines_and_are_lossless(cli_run):
    """The same requests through the adapter in-process: vanilla == CLI outputs == ar (greedy is lossless)."""
    _, samples, _ = cli_run
    kwargs = {"pair": "tiny_random", "device": "cpu", "max_gen_toks": MAX_NEW}
    vanilla = SpecbenchLM(method="vanilla", **{"method.gamma": 3}, **kwargs)
    ar = SpecbenchLM(method="ar", **kwargs)
    for s in samples:
        context, gen_kwargs = s["arguments"]["gen_args_0"]["arg_0"], s["arguments"]["gen_args_0"]["arg_1"]
        text, m = vanilla.generate_one(context, gen_kwargs)
        assert text == s["resps"][0][0] == ar.generate_one(context, gen_kwargs)[0]
        assert m["drafted"] > 0
    with pytest.raises(NotImplementedError, match="generate_until"):
        ar.loglikelihood([])


def test_model_args_become_hydra_overrides():
    assert [to_override(k, v) for k, v in {"method": "vanilla", "method.gamma": 8, "trace": True,
                                           "decode.top_k": None}.items()] == \
        ["method=vanilla", "method.gamma=8", "trace=true", "decode.top_k=null"]
    greedy, t1 = SamplingParams(0.0), SamplingParams(1.0, None, 0.9)
    assert task_sampling({"do_sample": False}, greedy) == greedy
    assert task_sampling({"do_sample": False, "temperature": 0.7}, t1) == SamplingParams(0.0, None, 0.9)
    assert task_sampling({"temperature": 0.7}, greedy) == SamplingParams(0.7)
    assert task_sampling({}, t1) == t1 and task_sampling({"do_sample": True}, greedy) == SamplingParams(1.0)


def test_unknown_method_lists_valid_names():
    with pytest.raises(Exception, match="(?s)speculate_harder.*vanilla"):
        SpecbenchLM(pair="tiny_random", method="speculate_harder", device="cpu")


def test_new_tokens_follow_the_request_then_lm_evals_default():
    lm = SpecbenchLM(pair="tiny_random", method="ar", device="cpu")
    assert lm.max_gen_toks == 256  # lm-eval's HFLM default, not decode.max_new_tokens (128)
    context = "Question: 12 + 30?\nAnswer:"
    assert lm.generate_one(context, {"until": [], "max_gen_toks": 7})[1]["new_tokens"] == 7
    assert lm.generate_one(context, {"until": [], "max_new_tokens": 5})[1]["new_tokens"] == 5  # lm-eval's alias
    assert lm.generate_one(context, {"until": []})[1]["new_tokens"] == 256
    small = SpecbenchLM(pair="tiny_random", method="ar", device="cpu", max_gen_toks=9)
    assert small.generate_one(context, {"until": []})[1]["new_tokens"] == 9
    with pytest.raises(OptionError, match="decode.max_new_tokens does not apply under lm-eval.*max_gen_toks"):
        SpecbenchLM(pair="tiny_random", device="cpu", **{"decode.max_new_tokens": 8})


def test_threads_are_set_as_in_a_run():
    before = torch.get_num_threads()
    try:
        SpecbenchLM(pair="tiny_random", method="ar", device="cpu", threads=2)
        assert torch.get_num_threads() == 2
        SpecbenchLM(pair="tiny_random", method="ar", device="cpu", threads=1)
        assert torch.get_num_threads() == 1
        with pytest.raises(OptionError, match="threads must be auto .*, an integer >= 1 or null"):
            SpecbenchLM(pair="tiny_random", method="ar", device="cpu", threads=0)
    finally:
        torch.set_num_threads(before)


def test_a_mistyped_option_key_lists_the_valid_ones():
    with pytest.raises(OptionError, match=r"method 'vanilla' got unknown options \['gama'\] \(method.gama=3\); "
                                          r"each part.s valid options: policy vanilla: gamma; drafter draft_model: none"):
        SpecbenchLM(pair="tiny_random", device="cpu", **{"method.gama": 3})
