"""What a run records about how it ran: the thread count `threads=auto` picks, the `runtime` record and the code of
its method's parts."""

import hashlib
import json
import os
import subprocess

import pytest
import torch

from helpers import small
from specbench.common.options import OptionError
from specbench.runs import provenance, runner, validation


@pytest.mark.parametrize("cpus,load,expected", [(2, 0.3, 2), (2, 1.2, 1), (2, 1.6, 1), (2, 4.0, 1), (16, 5.4, 11)])
def test_auto_threads_are_the_cpus_not_already_busy(monkeypatch, cpus, load, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    old = torch.get_num_threads()
    try:
        assert validation.free_cpus() == expected
        assert validation.set_threads("auto") == expected == torch.get_num_threads()
        assert validation.set_threads(3) == 3  # an explicit number wins
        assert validation.set_threads(None) == 3  # null: left as torch has it
        with pytest.raises(OptionError, match="threads must be auto"):
            validation.set_threads("all")
    finally:
        torch.set_num_threads(old)


def test_config_and_summary_record_what_ran(tmp_path):
    s = runner.run(small("method=vanilla", "limit=2", "decode.max_new_tokens=8", "threads=1"), tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["runtime"]
    assert s["runtime"] == saved
    assert (saved["device"], saved["dtype"], saved["threads"]) == ("cpu", "float32", 1)
    assert set(saved["models"]) == {"target", "draft"}
    assert saved["models"]["target"] == {"path": None, "revision": None, "quantized": None, "converted": False}


def test_a_run_records_its_cpu_and_the_load_it_ran_under(tmp_path, monkeypatch):
    """runtime.cpu: the CPU model and its speed-deciding flags (as /proc/cpuinfo says); each row the 1-minute load
    average when it was written, the summary their median and maximum."""
    loads = iter([0.5, 2.25, 1.0])
    monkeypatch.setattr(runner.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    s = runner.run(small("method=vanilla", "limit=3", "decode.max_new_tokens=4", "threads=1", "warmup=0"), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["load_average"] for r in rows] == [0.5, 2.25, 1.0]
    assert (s["load_average_median"], s["load_average_max"]) == (1.0, 2.25)
    cpu = s["runtime"]["cpu"]
    assert set(cpu["flags"]) <= set(provenance.CPU_FLAGS)
    if os.path.exists("/proc/cpuinfo"):
        text = open("/proc/cpuinfo").read()
        model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                     None)
        assert model is None or cpu["model"] == model
        flags = next((line for line in text.splitlines() if line.startswith("flags")), "flags:")
        present = set(flags.split(":", 1)[1].split())
        assert cpu["flags"] == [f for f in provenance.CPU_FLAGS if f in present]


def test_a_run_records_its_methods_code(tmp_path):
    """The files of the parts a run imported, each with its sha256 (of the file as it is) and git state."""
    s = runner.run(small("method=gammatune", "method.parts.drafter=lookup", "limit=1", "decode.max_new_tokens=4",
                         "threads=1"), tmp_path)
    code = s["method_code"]
    assert {"methods/gammatune.py", "methods/pld.py", "specbench/decoding/policy.py", "specbench/decoding/parts.py",
            "specbench/decoding/acceptance.py"} <= set(code)
    root = provenance.ROOT
    for name, entry in code.items():
        assert entry["sha256"] == hashlib.sha256((root / name).read_bytes()).hexdigest()
        assert entry["git"] == provenance.file_state(root / name)


def test_a_files_git_state(tmp_path):
    """clean, modified, untracked, and outside any checkout, in a repository made here."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(git + ["init", "-q"], check=True)
    for name in ("clean.py", "changed.py"):
        (repo / name).write_text("x = 1\n")
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "c"], check=True)
    (repo / "changed.py").write_text("x = 2\n")
    (repo / "new.py").write_text("x = 3\n")
    states = {n: provenance.file_state(repo / n, repo) for n in ("clean.py", "changed.py", "new.py")}
    assert states == {"clean.py": "clean", "changed.py": "modified", "new.py": "untracked"}
    (tmp_path / "alone.py").write_text("x = 4\n")
    assert provenance.file_state(tmp_path / "alone.py", tmp_path) == "outside"


def test_a_local_checkpoint_loaded_in_another_dtype_is_converted(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m")
    same = provenance.model_record(AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32))
    half = provenance.model_record(AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.bfloat16))
    assert same["path"] == str(tmp_path / "m") and len(same["revision"]) == 16 and same["revision"] == half["revision"]
    assert (same["converted"], half["converted"]) == (False, True) and same["quantized"] is None
    (tmp_path / "m" / "config.json").write_text((tmp_path / "m" / "config.json").read_text() + " ")
    assert provenance.model_record(AutoModelForCausalLM.from_pretrained(tmp_path / "m"))["revision"] != same["revision"]


def test_a_hub_model_without_a_commit_hash_gets_its_cache_snapshot(tmp_path, monkeypatch):
    from huggingface_hub import constants as hf_constants
    from transformers import LlamaConfig, LlamaForCausalLM

    snapshot = "86107465c6380c0a8b26edbb3bad37f6d3d80898"
    repo = tmp_path / "models--org--m"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(snapshot)
    (repo / "snapshots" / snapshot).mkdir(parents=True)
    (repo / "snapshots" / snapshot / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    model.config._name_or_path = "org/m"  # as from_pretrained("org/m") sets it; no _commit_hash
    record = provenance.model_record(model)
    assert (record["path"], record["revision"], record["converted"]) == ("org/m", snapshot, True)  # bf16 -> fp32
    model.config._name_or_path = "org/absent"
    assert provenance.model_record(model)["revision"] is None


def test_a_target_split_between_the_cpu_and_disk_offload_decodes_the_same_rows(tmp_path):
    """The path pair=llama70b_8b takes (the target under device_map: auto), here with the toy pair's shipped weights
    as its models and max_memory leaving the CPU room for part of the target, the rest offloaded to disk: its rows
    are the toy pair's on one device, token for token, and config.json records where the target's modules went."""
    from specbench.models.toy import SHIPPED

    (folder,) = SHIPPED.iterdir()  # the default toy config's weights
    common = ("dataset=toy_arith", "limit=3", "method=vanilla", "decode.max_new_tokens=24", "threads=1")
    split = small("pair=llama70b_8b", f"pair.target.path={folder / 'target'}", f"pair.draft.path={folder / 'draft'}",
                  "pair.target.params_b=null", "pair.draft.params_b=null", "pair.target.dtype=float32",
                  "pair.draft.dtype=float32", "+pair.target.max_memory.cpu=3MB",
                  f"+pair.target.offload_folder={tmp_path / 'offload'}", *common)
    runner.run(split, tmp_path / "split")
    runner.run(small("pair=toy", *common), tmp_path / "one")
    rows = {k: [json.loads(x)["token_ids"] for x in (tmp_path / k / "rows.jsonl").read_text().splitlines()]
            for k in ("split", "one")}
    assert len(rows["one"]) == 3 and rows["split"] == rows["one"]
    placed = json.loads((tmp_path / "split" / "config.json").read_text())["runtime"]["models"]["target"]["placement"]
    assert set(placed) == {"cpu", "disk"} and placed["disk"] >= 2, placed
