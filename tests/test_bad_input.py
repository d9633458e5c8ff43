"""Bad input fails before any model is loaded, naming the key, file, line or field at fault and what is
valid, and leaves no result folder behind (through the real Hydra config, the runner and `python run.py`)."""

import functools
import gzip
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import specbench.data.sources as data
import specbench.runs.runner as runner
from helpers import CONF, ROOT, compose_cfg, small
from specbench.data.dataset import DataSourceError, build_dataset, load_source, read_local
from specbench.common.options import OptionError
from specbench.runs.layout import discard_job_dir, job_dir
from specbench.runs.results import folder_lock
from specbench.runs.runner import build_method, run, sampling_params


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a run gets as far as loading a model: bad input must be refused before that."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(runner, "load_pair", refuse)


def refused(tmp_path, *overrides: str, error: type = ValueError) -> str:
    """The message of the error a run of the shrunk config with `overrides` fails with; no folder is left."""
    with pytest.raises(error) as err:
        run(small(*overrides), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    return str(err.value)


# ---------------------------------------------------------------- config values, through the runner

BAD_VALUES = [  # override (as typed on the command line), the key the error must name, what it must say
    ("method.gamma=true", "method.gamma", "must be an integer"),  # ran as γ=1
    ("method.gamma=false", "method.gamma", "must be an integer"),
    ("method.gamma=abc", "method.gamma", "must be an integer"),
    ("method.gamma=2.5", "method.gamma", "must be an integer"),
    ("method.gamma=0", "method.gamma", "must be an integer >= 1"),
    ("method.parts.rule=3", "method.parts.rule", "must be a registered name"),
    ("decode.max_new_tokens=true", "decode.max_new_tokens", "must be an integer >= 1"),
    ("decode.max_new_tokens=abc", "decode.max_new_tokens", "must be an integer >= 1"),
    ("decode.max_new_tokens=2.5", "decode.max_new_tokens", "must be an integer >= 1"),  # ran as 2
    ("decode.max_new_tokens=0", "decode.max_new_tokens", "must be an integer >= 1"),
    ("decode.temperature=abc", "decode.temperature", "must be a finite number >= 0"),
    ("decode.temperature=true", "decode.temperature", "must be a finite number >= 0"),  # ran as 1.0
    ("decode.temperature=nan", "decode.temperature", "must be a finite number >= 0"),
    ("decode.temperature=inf", "decode.temperature", "must be a finite number >= 0"),
    ("decode.temperature=-0.5", "decode.temperature", "must be a finite number >= 0"),
    ("decode.top_k=true", "decode.top_k", "must be an integer >= 0 or null"),
    ("decode.top_k=1.5", "decode.top_k", "must be an integer >= 0 or null"),
    ("decode.top_p=nan", "decode.top_p", "must be a finite number in (0, 1] or null"),
    ("decode.top_p=abc", "decode.top_p", "must be a finite number in (0, 1] or null"),
    ("decode.top_p=0", "decode.top_p", "must be a finite number in (0, 1] or null"),
    ("decode.seed=abc", "decode.seed", "must be an integer"),
    ("decode.seed=true", "decode.seed", "must be an integer"),  # ran as seed 1
    ("decode.seed=1.5", "decode.seed", "must be an integer"),
    ("decode.seed=-1", "decode.seed", "must be an integer"),
    ("limit=abc", "limit", "must be an integer >= 1 or null"),
    ("limit=true", "limit", "must be an integer >= 1 or null"),  # ran one example
    ("limit=2.5", "limit", "must be an integer >= 1 or null"),
    ("limit=0", "limit", "must be an integer >= 1 or null"),
    ("shard=true", "shard", "must look like 'i/n'"),
    ("shard=3/2", "shard", "need 0 <= i < n"),
    ("dataset.chat_template=yes", "dataset.chat_template", "must be one of auto, true, false"),
    ("dataset.system_prompt=3", "dataset.system_prompt", "must be a string or null"),
    ("warmup=true", "warmup", "must be an integer >= 0"),
    ("warmup=-1", "warmup", "must be an integer >= 0"),  # warmed up on all but the last example
    ("warmup=abc", "warmup", "must be an integer >= 0"),
    ("threads=true", "threads", "must be auto (the CPUs not already busy), an integer >= 1 or null"),
    ("threads=0", "threads", "must be auto (the CPUs not already busy), an integer >= 1 or null"),  # ran with torch's default
    ("threads=abc", "threads", "must be auto (the CPUs not already busy), an integer >= 1 or null"),
    ("threads=2.5", "threads", "must be auto (the CPUs not already busy), an integer >= 1 or null"),
    ("repeats=0", "repeats", "must be an integer >= 1"),
    ("repeats=true", "repeats", "must be an integer >= 1"),
    ("remeasure=yes", "remeasure", "must be true or false"),
    ("trace=yes", "trace", "must be true or false"),  # bool('yes'): traced
    ("resume_any_version=no", "resume_any_version", "must be true or false"),  # bool('no') is True
    ("stop_strings=abc", "stop_strings", "must be a list of strings"),  # stopped at 'a', 'b' or 'c'
    ("on_long_prompt=drop", "on_long_prompt", "must be one of error, truncate"),
    ("progress=maybe", "progress", "must be one of auto, true, false"),
    ("+dataset.limit=3", "dataset.limit", "is not a dataset option: examples are selected by the top-level key `limit`"),
    ("+dataset.shard=0/2", "dataset.shard", "is not a dataset option: examples are selected by the top-level key `shard`"),
]


@pytest.mark.parametrize("override,key,what", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_a_bad_value_names_its_key_and_what_is_valid(tmp_path, no_model, override, key, what):
    message = refused(tmp_path, "method=vanilla", override)
    assert message.startswith(f"{key} ") or f" {key}" in message, message
    assert what in message, message


@pytest.mark.parametrize("method,override,key", [
    ("adasd", "method.gamma=0", "method.gamma"),
    ("adasd", "method.gamma=true", "method.gamma"),
    ("adasd", "method.fixed_t_v=inf", "method.fixed_t_v"),
    ("adasd", "method.persist=1", "method.persist"),
    ("adasd_verify_only", "method.gamma=true", "method.gamma"),
    ("gammatune", "method.eta=nan", "method.eta"),
    ("gammatune", "method.delta=true", "method.delta"),
    ("gammatune", "method.gamma_min=0", "method.gamma_min"),  # said 'gamma'
    ("gammatune", "method.gamma_max=1.5", "method.gamma_max"),
    ("gammatune_plus", "method.tau=abc", "method.tau"),
    ("heuristic", "method.gamma=false", "method.gamma"),
    ("heuristic", "method.persist=yes", "method.persist"),
    ("confidence", "method.gamma=0", "method.gamma"),
    ("confidence", "method.threshold=true", "method.threshold"),
    ("confidence", "method.roc=no", "method.roc"),
    ("hf_assisted", "method.gamma=true", "method.gamma"),
    ("hf_assisted", "method.gamma=0", "method.gamma"),
    ("hf_assisted", "method.persist=no", "method.persist"),
    ("hf_assisted", "method.assistant_confidence_threshold=nan", "method.assistant_confidence_threshold"),
    ("distilled", "method.drafter=3", "method.drafter"),
])
def test_method_options_name_their_key(tmp_path, no_model, method, override, key):
    message = refused(tmp_path, f"method={method}", override)
    assert re.search(rf"(^|\s){re.escape(key)} must be ", message), message


@functools.lru_cache(maxsize=None)
def options_of(group: str, name: str) -> dict:
    """The resolved options of conf/<group>/<name>.yaml (callers copy it before changing a key)."""
    return OmegaConf.to_container(compose_cfg(f"{group}={name}")[group], resolve=True)


def config_names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def wrong_values(value) -> list:
    """Values of the wrong kind for a config value like `value` (taken from the YAML files themselves)."""
    if isinstance(value, bool):
        return ["yes", 1]
    if isinstance(value, int):
        return [True, "abc", 2.5]
    if isinstance(value, float):
        return [True, "abc", math.nan, math.inf]
    return []


def numeric_and_flag_cases(group: str, skip: set[str]) -> list[tuple[str, str, object]]:
    return [(name, key, bad) for name in config_names(group) for key, v in options_of(group, name).items()
            if key not in skip for bad in wrong_values(v)]


@pytest.mark.parametrize("name,key,bad", numeric_and_flag_cases("method", {"name"}))
def test_every_numeric_or_flag_method_option_rejects_the_wrong_kind(name, key, bad):
    """Every number and flag of every conf/method file, so a new method's options are covered too."""
    with pytest.raises(OptionError, match=rf"^method\.{key} must be "):
        build_method({**options_of("method", name), key: bad})


@pytest.mark.parametrize("name,key,bad", numeric_and_flag_cases("dataset", {"name"}))
def test_every_numeric_dataset_option_rejects_the_wrong_kind(name, key, bad):
    with pytest.raises(ValueError, match=rf"^dataset\.{key} must "):
        build_dataset({**options_of("dataset", name), key: bad})


@pytest.mark.parametrize("name,key,bad", numeric_and_flag_cases("decode", set()))
def test_every_numeric_decode_option_rejects_the_wrong_kind(name, key, bad):
    with pytest.raises(OptionError, match=rf"^decode\.{key} must "):
        sampling_params({**options_of("decode", name), key: bad})


@pytest.mark.parametrize("cfg,key", [
    ({"name": "toy_arith", "n": 0}, "dataset.n"),  # ran with no examples
    ({"name": "gsm8k", "num_fewshot": 9}, "dataset.num_fewshot"),
    ({"name": "mmlu", "split": "train"}, "dataset.split"),
    ({"name": "xsum", "split": 3}, "dataset.split"),
])
def test_dataset_option_ranges_name_their_key(cfg, key):
    with pytest.raises(ValueError, match=rf"^{re.escape(key)} must be "):
        build_dataset(cfg)


def test_unknown_options_list_the_valid_ones():
    with pytest.raises(OptionError, match=r"method 'vanilla' got unknown options \['gama'\]; each part's valid options: "
                                          r"policy vanilla: gamma; drafter draft_model: none; shape chain: none"):
        build_method({"name": "vanilla", "gama": 3})
    with pytest.raises(OptionError, match=r"dataset 'toy_arith' got unknown options \['data_dir'\]; valid options: n, seed"):
        build_dataset({"name": "toy_arith", "data_dir": "x"})


def test_good_values_still_pass():
    method = build_method({"name": "gammatune_plus", "gamma": 3, "eta": 1, "tau": 0, "persist": True}).policy
    assert (method.window(), method.tau) == (3, 0)
    params = sampling_params({"max_new_tokens": 4, "temperature": 1, "top_k": 0, "top_p": 1, "seed": 2**40})
    assert (params.temperature, params.top_k, params.top_p) == (1.0, 0, 1.0)


def test_a_shard_with_no_examples_is_refused(tmp_path, no_model):
    message = refused(tmp_path, "limit=2", "shard=3/4")  # exited 0 with an empty summary
    assert "shard=3/4 selects no examples" in message and "only 2" in message


# ---------------------------------------------------------------- data files

def write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(content) if path.name.endswith(".gz") else content)
    return path


GSM_ROW = b'{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\\n#### 5"}'


def gsm8k_dir(tmp_path: Path, content: bytes) -> Path:
    """A data folder whose gsm8k/test.jsonl holds `content`."""
    write(tmp_path / "data" / "gsm8k" / "test.jsonl", content)
    return tmp_path / "data"


BAD_JSONL = [  # content of gsm8k/test.jsonl, what the error must say after the file name
    (b"", ": the file is empty"),
    (b"\n\n  \n", ": the file is empty"),
    (GSM_ROW + b"\n\n" + b'{"question": "x", "answer": }\n', ", line 3: not valid JSON"),  # blank line 2 counts
    (GSM_ROW + b"\n" + GSM_ROW + b"\n" + b'{"question": "caf\xe9", "answer": "#### 1"}\n',
     ", line 3: byte 0xe9 at column 18 is not UTF-8"),
    (GSM_ROW + b"\n[1, 2]\n", ", line 2: expected a JSON object"),
    (GSM_ROW + b'\n{"question": "no answer"}\n', ", line 2: the row has no 'answer' field"),
    (GSM_ROW + b'\n{"question": null, "answer": "#### 1"}\n', ", line 2: the row's 'question' field is null"),
    (b'{"question": 7, "answer": "#### 1"}\n', ", line 1: field 'question' must be a string"),
    (b'{"question": "x", "answer": "5"}\n', ", line 1: field 'answer' has no final '#### <number>' line"),
]


@pytest.mark.parametrize("content,says", BAD_JSONL, ids=[s for _, s in BAD_JSONL])
def test_a_bad_jsonl_file_names_the_file_and_line(tmp_path, content, says):
    folder = gsm8k_dir(tmp_path, content)
    with pytest.raises(DataSourceError) as err:
        build_dataset({"name": "gsm8k", "data_dir": str(folder)}).examples()
    assert str(err.value).startswith(str(folder / "gsm8k" / "test.jsonl") + says), str(err.value)


BAD_JSON = [  # content of alpaca_eval/instructions_805.json
    (b"", ": the file is empty"),
    (b"[]", ": no rows"),
    (b'{"instruction": "x"}', ": expected a JSON list of rows"),
    (b'[\n {"instruction": "a"},\n {"instruction": }\n]', ", line 3: not valid JSON"),
    (b'[\n {"instruction": "a"},\n {"instruction": "\xff"}\n]', ", line 3: byte 0xff at column 19 is not UTF-8"),
    (b'[{"instruction": "a"}, "b"]', ", row 2: expected a JSON object"),
    (b'[{"instruction": "a"}, {"dataset": "koala"}]', ", row 2: the row has no 'instruction' field"),
]


@pytest.mark.parametrize("content,says", BAD_JSON, ids=[s for _, s in BAD_JSON])
def test_a_bad_json_file_names_the_file_and_line_or_row(tmp_path, content, says):
    path = write(tmp_path / "data" / "alpaca_eval" / "instructions_805.json", content)
    with pytest.raises(DataSourceError) as err:
        build_dataset({"name": "alpaca_eval", "data_dir": str(tmp_path / "data")}).examples()
    assert str(err.value).startswith(str(path) + says), str(err.value)


def test_gzip_files_name_the_file_and_line(tmp_path):
    good = b'{"task_id": "t/0", "prompt": "def f():\\n"}\n'
    path = write(tmp_path / "a.jsonl.gz", good + b'{"task_id": "t/1", \n')
    with pytest.raises(DataSourceError, match=rf"^{re.escape(str(path))}, line 2: not valid JSON"):
        read_local(path)
    broken = tmp_path / "b.jsonl.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(DataSourceError, match=rf"^{re.escape(str(broken))}: cannot be read \(BadGzipFile"):
        read_local(broken)
    truncated = tmp_path / "c.jsonl.gz"
    truncated.write_bytes(gzip.compress(good * 50)[:-30])
    with pytest.raises(DataSourceError, match=rf"^{re.escape(str(truncated))}: cannot be read"):
        read_local(truncated)
    assert read_local(write(tmp_path / "d.jsonl.gz", good)) == [json.loads(good)]


@pytest.mark.parametrize("name,options,file,content,says", [
    ("mmlu", {"split": "test"}, "mmlu/test.jsonl",
     b'{"question": "q", "subject": "s", "choices": ["a", "b"], "answer": 2}', "line 1: field 'answer'"),
    ("mmlu", {"split": "test"}, "mmlu/test.jsonl",
     b'{"question": "q", "subject": "s", "choices": "abcd", "answer": 0}', "line 1: field 'choices'"),
    ("spec_bench", {}, "spec_bench/question.jsonl",
     b'{"question_id": 1, "category": "qa", "turns": "one turn"}', "line 1: field 'turns'"),
    ("spec_bench", {}, "spec_bench/question.jsonl",
     b'{"question_id": 1, "turns": ["x"]}', "line 1: the row has no 'category' field"),
    ("mt_bench", {}, "mt_bench/question.jsonl",
     b'\n{"question_id": 81, "category": "writing", "turns": []}', "line 2: field 'turns'"),
    ("xsum", {"split": "test_1000"}, "xsum/test_1000.jsonl",
     b'{"id": "1", "summary": "s"}', "line 1: the row has no 'document' field"),
])
def test_rows_missing_or_with_bad_fields_name_file_line_and_field(tmp_path, name, options, file, content, says):
    path = write(tmp_path / "data" / file, content)
    with pytest.raises(DataSourceError) as err:
        build_dataset({"name": name, "data_dir": str(tmp_path / "data"), **options}).examples()
    assert str(err.value).startswith(f"{path}, {says}"), str(err.value)


def test_hub_rows_name_the_set_and_row(monkeypatch):
    rows = [{"question": "q", "answer": "#### 1"}, {"question": None, "answer": "#### 2"}]  # hub: absent = None
    monkeypatch.setattr(data, "load_hub", lambda *args: rows)
    with pytest.raises(DataSourceError, match=r"^GSM8K test \(openai/gsm8k \(config main, split test\)\), row 2: "
                                              r"the row's 'question' field is null"):
        build_dataset({"name": "gsm8k", "data_dir": None}).examples()
    monkeypatch.setattr(data, "load_hub", lambda *args: [])
    with pytest.raises(DataSourceError, match=r"^UltraChat_200k test_sft \(HuggingFaceH4/ultrachat_200k.*: no rows"):
        build_dataset({"name": "ultrachat", "data_dir": None}).examples()


def test_a_missing_field_is_still_a_key_error_for_callers_that_catch_one(tmp_path):
    rows = load_source(data.Source("S", local="s.jsonl"), write(tmp_path / "s.jsonl", b'{"a": 1}').parent)
    with pytest.raises(KeyError, match=r"s.jsonl, line 1: the row has no 'b' field"):
        rows[0]["b"]
    assert rows[0].get("b") is None and rows == [{"a": 1}]


def test_a_bad_data_file_through_the_runner(tmp_path, no_model):
    folder = gsm8k_dir(tmp_path, GSM_ROW + b"\n" + b"{oops\n")
    message = refused(tmp_path, "dataset=gsm8k", f"dataset.data_dir={folder}", error=DataSourceError)
    assert message.startswith(f"{folder / 'gsm8k' / 'test.jsonl'}, line 2: not valid JSON")
    message = refused(tmp_path, "dataset=gsm8k", f"dataset.data_dir={gsm8k_dir(tmp_path, b'')}",
                      error=DataSourceError)  # exited 0 with an empty summary
    assert message == f"{folder / 'gsm8k' / 'test.jsonl'}: the file is empty; a benchmark needs at least one row"


# ---------------------------------------------------------------- run.py: no folder left behind

def run_py(*args: str, multirun: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *(["-m"] if multirun else []), "pair=tiny_random",
                           "dataset=smoke", "limit=1", "decode.max_new_tokens=4", "warmup=0", "threads=1", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_cli_bad_data_file_leaves_no_folder(tmp_path):
    folder = gsm8k_dir(tmp_path, GSM_ROW + b"\n\n" + b'{"question": "\xff"}\n')
    root = tmp_path / "results"
    p = run_py("dataset=gsm8k", f"dataset.data_dir={folder}", f"hydra.run.dir={root}/gsm8k/vanilla/job",
               f"paths.results={root}")
    assert p.returncode != 0
    assert f"{folder / 'gsm8k' / 'test.jsonl'}, line 3: byte 0xff at column 15 is not UTF-8" in p.stderr, p.stderr
    assert not (root / "gsm8k").exists()  # the job folder and its parents Hydra made, up to the results root


def test_cli_sweep_keeps_good_jobs_and_removes_refused_ones(tmp_path):
    p = run_py("method.gamma=2,true", f"paths.results={tmp_path}", multirun=True)
    assert p.returncode != 0 and "method.gamma must be an integer, got True (a boolean)" in p.stderr, p.stderr
    jobs = [d for d in tmp_path.rglob("*") if (d / ".hydra").is_dir()]
    assert len(jobs) == 1 and "method.gamma=2" in jobs[0].name and (jobs[0] / "summary.json").exists()
    assert not any("gamma=true" in str(d).lower() for d in tmp_path.rglob("*"))


def test_cli_refused_rerun_keeps_a_folder_with_results(tmp_path):
    out = tmp_path / "run"
    run(small("limit=1", "decode.max_new_tokens=4"), out)
    rows = (out / "rows.jsonl").read_text()
    p = run_py(f"hydra.run.dir={out}", "decode.temperature=abc")
    assert p.returncode != 0 and "decode.temperature must be a finite number >= 0, got 'abc'" in p.stderr, p.stderr
    assert (out / "rows.jsonl").read_text() == rows and (out / "summary.json").exists()


@pytest.mark.parametrize("override, says", [
    ("method.gama=3", "method 'vanilla' got unknown options ['gama'] (method.gama=3); each part's valid options: policy "
                      "vanilla: gamma; drafter draft_model: none; shape chain: none"),
    ("+method.gama=3", "method 'vanilla' got unknown options ['gama'] (+method.gama=3); each part's valid options: "
                       "policy vanilla: gamma; drafter draft_model: none; shape chain: none"),
    ("dataset.nn=3", "dataset 'smoke' got unknown options ['nn'] (dataset.nn=3); valid options: chat_template, "),
    ("+dataset.nn=3", "dataset 'smoke' got unknown options ['nn'] (+dataset.nn=3); valid options: chat_template, "),
])
def test_cli_mistyped_option_key_lists_the_valid_keys(tmp_path, override, says):
    p = run_py(override, f"hydra.run.dir={tmp_path / 'job'}")
    assert p.returncode != 0 and says in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "use +" not in p.stderr.lower() and not (tmp_path / "job").exists()


def test_option_keys_are_checked_for_every_choice_the_command_runs():
    from specbench.runs.overrides import check_option_overrides

    with pytest.raises(OptionError, match=r"method 'vanilla' got unknown options \['persist'\]"):
        check_option_overrides(["-m", "method=adasd,vanilla", "+method.persist=true"])  # adasd has it, vanilla not
    with pytest.raises(OptionError, match=r"method 'draft_only' got unknown .*'gama'.*policy ar: none; drafter none: verifier"):
        check_option_overrides(["-m", "experiment=adasd_table1", "+method.gama=1"])  # the experiment's sweep
    with pytest.raises(OptionError, match=r"dataset 'gsm8k' got unknown options \['nfewshot'\] .*num_fewshot"):
        check_option_overrides(["dataset=gsm8k", "++dataset.nfewshot=2"])
    for fine in (["method=adasd", "+method.persist=true"], ["method.gamma=3", "dataset.n=5", "~method.parts.rule"],
                 ["dataset.limit=3"], ["method=nope", "method.gamma=2"], ["decode.nope=1"], ["-m", "method=ar,vanilla"]):
        check_option_overrides(fine)  # valid, or refused later by Hydra or the runner with their own message


@pytest.mark.parametrize("args, shown, multirun", [
    (["+limt=5"], "+limt=5", False),  # Hydra's own advice for limt=5: it ran every example into a folder +limt=5
    (["++limt=1,2", "method=ar,vanilla"], "++limt=1,2", True),
])
def test_cli_unknown_top_level_key_is_refused_before_anything_runs(tmp_path, args, shown, multirun):
    root = tmp_path / "results"
    p = run_py(*args, f"paths.results={root}", multirun=multirun)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert f"unknown top-level key 'limt' ({shown}): no config reads it; did you mean limit? Valid top-level keys: " \
           "batch_size, device, engine, limit, " in p.stderr, p.stderr
    assert "config groups (group=name): dataset, " in p.stderr and "hydra/launcher" in p.stderr, p.stderr
    assert not root.exists()  # no run folder, no sweep folder


def test_top_level_keys_are_those_of_the_configs_the_command_composes(tmp_path):
    from specbench.runs.overrides import check_option_overrides

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf, ignore=lambda d, names: [n for n in names if Path(d).name == "local" and n not in
                                                          ("README.md", "example.yaml")])  # none of this checkout's
    (conf / "experiment" / "noted.yaml").write_text("# @package _global_\nnote: x\n")
    (conf / "local" / "default.yaml").write_text("# @package _global_\nsite: here\n")

    def refused(*args: str) -> str:
        with pytest.raises(OptionError) as err:
            check_option_overrides(list(args), conf)
        return str(err.value)

    for bad in ("limt=5", "+limt=5", "++limt=5"):
        assert refused(bad).startswith(f"unknown top-level key 'limt' ({bad}): no config reads it; did you mean limit?")
    assert "'note' (+note=y)" in refused("+note=y")  # only with the experiment that adds it
    assert "'launcher' (launcher=slurm)" in refused("launcher=slurm") and "did you mean hydra/launcher?" in refused("launcher=slurm")
    both = refused("limit=2", "+lmit=3", "zzz=1", "method=ar")
    assert both.startswith("unknown top-level keys 'lmit', 'zzz' (+lmit=3, zzz=1): no config reads them; "
                           "did you mean limit for lmit? Valid top-level keys: ")
    assert "site" in both and "note" not in both and "slurm" in both
    for fine in (["experiment=noted", "note=y"], ["+experiment=noted", "note=y"], ["-m", "experiment=noted,adasd_table1", "note=y"],
                 ["-m", "experiment=glob(*)", "note=y"], ["site=there"], ["+slurm.partition=gpu"],  # read with oc.select
                 ["hydra/launcher=local", "hydra.job.chdir=false", "++hydra.verbose=true"], ["local=example", "slurm.qos=high"],
                 ["pair=tiny_random", "+pair.target.foo=1", "decode.seed=2", "+decode.nope=1"], ["~trace"],
                 ["method=nope", "limit=2"], ["--config-name=other", "limt=5"]):
        check_option_overrides(fine, conf)  # valid, or refused later by Hydra with its own message


def test_discard_job_dir_removes_only_what_hydra_made(tmp_path):
    discard = discard_job_dir
    root, hydra_files = tmp_path / "results", {".hydra", "run.log"}

    def job(name: str, *files: str) -> Path:
        d = root / "pair" / "set" / name
        (d / ".hydra").mkdir(parents=True)
        for f in ("run.log", *files):
            (d / f).write_text("x")
        return d

    kept = job("earlier", "rows.jsonl", "config.json")
    assert not discard(kept, root, hydra_files) and (kept / "rows.jsonl").exists()
    refused = job("refused")
    assert discard(refused, root, hydra_files) and not refused.exists() and kept.exists()  # shared parents stay
    alone = root / "other" / "set" / "alone"
    (alone / ".hydra").mkdir(parents=True)
    assert discard(alone, root, hydra_files) and not (root / "other").exists() and root.is_dir()  # up to the root
    busy = job("busy")
    with folder_lock(busy):  # another run holds the folder: never removed under it
        assert not discard(busy, root, hydra_files) and busy.exists()
    outside = tmp_path / "elsewhere" / "job"
    (outside / ".hydra").mkdir(parents=True)
    assert discard(outside, root, hydra_files) and not outside.exists() and outside.parent.exists()
    assert not discard(root, root, hydra_files) and root.exists()
    # the runner's record of the config and an unfinished example's traces are no results; rows or a summary are
    no_rows = job("no_rows", "config.json", ".lock", "traces")
    assert discard(no_rows, root, hydra_files) and not no_rows.exists()
    finished_empty = job("finished", "config.json", "summary.json")
    assert not discard(finished_empty, root, hydra_files) and (finished_empty / "summary.json").exists()


def test_a_job_failing_before_its_first_row_leaves_nothing(tmp_path, monkeypatch):
    """Interrupted in its first example, after config.json is written: the folder goes, up to the results root."""
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "decode_batch", interrupted)
    root = tmp_path / "results"
    cfg = small("limit=2", "decode.max_new_tokens=4", f"paths.results={root}")
    folder = job_dir(cfg)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, folder)
    assert (folder / "config.json").exists() and not (folder / "rows.jsonl").exists()  # what a report would list
    assert discard_job_dir(folder, root, set()) and list(root.iterdir()) == []


def test_a_pair_without_a_draft_names_the_methods_that_run_there(tmp_path, no_model):
    """pair.draft=null with a method that drafts with the pair's draft: one error, before loading, naming the methods
    that need no draft model (each of them built from its conf: its roles leave the draft out)."""
    message = refused(tmp_path, "pair.draft=null", "method=vanilla", "limit=1", error=OptionError)
    assert "pair.draft is null" in message and "'vanilla'" in message
    listed = message.split("methods that run there: ")[1].split(", ")
    assert {"ar", "pld", "suffix", "lookahead", "layer_skip"} <= set(listed)
    assert not {"vanilla", "draft_only", "sd2", "uag"} & set(listed)
    for name in listed:
        assert "draft" not in build_method({"name": name}).plan.roles


def test_the_target_alone_runs_where_the_pair_has_no_draft(tmp_path):
    """tiny_random with pair.draft=null builds its target alone (the same target as with a draft): ar and pld run."""
    for method in ("ar", "pld"):
        summary = run(small("pair.draft=null", f"method={method}", "limit=1", "decode.max_new_tokens=4"),
                      tmp_path / method)
        assert summary["n_examples"] == 1


def test_an_unknown_policy_is_called_a_policy():
    with pytest.raises(KeyError, match="unknown policy .nope.; valid names: .*vanilla"):
        build_method({"name": "vanilla", "parts": {"policy": "nope"}})
