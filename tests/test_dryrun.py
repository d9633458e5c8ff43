"""`python run.py [-m] ... --dry-run`: every job of a sweep with the folder the sweep itself writes, and everything each
job lacks (weights, trained drafters, datasets, GPUs) in one pass with the commands that fetch them; nothing written."""

import subprocess
import sys

from helpers import ROOT
from specbench.runs import dryrun

SWEEP = ["-m", "pair=tiny_random", "dataset=smoke", "method=ar,vanilla", "decode=greedy,t1", "limit=2",
         "decode.max_new_tokens=4", "warmup=0", "threads=1", "progress=false"]


def run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def listed(out: str) -> list[str]:
    """The folders a dry run names, in job order."""
    return [line.split("-> ", 1)[1].rsplit(" (", 1)[0] for line in out.splitlines() if line.startswith("    -> ")]


def test_a_dry_run_lists_the_folders_the_sweep_then_writes_and_writes_nothing(tmp_path):
    args = [*SWEEP, f"paths.results={tmp_path}"]
    dry = run_py(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert not any(tmp_path.iterdir())  # nothing written
    assert dry.stdout.startswith("4 jobs") and "4 of 4 jobs can run here as configured." in dry.stdout
    assert run_py(*args).returncode == 0
    written = sorted(str(f.parent) for f in tmp_path.rglob("summary.json"))
    assert sorted(listed(dry.stdout)) == written and len(written) == 4
    again = run_py(*args, "--dry-run")
    assert again.stdout.count("(resumes 2 rows)") == 4  # the rows a rerun would resume


def test_everything_a_job_lacks_is_named_in_one_pass_with_its_fetch_command(tmp_path, monkeypatch, capsys):
    """An empty Hugging Face cache: the hub pair's two models, the dataset's local copy, a trained drafter folder and
    the GPUs a SLURM job asks for too few of, for each job, and exit status 1."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    (tmp_path / "data").mkdir()
    code = dryrun.main(["-m", "pair=llama70b_8b", "method=sd2,vanilla", "dataset=gsm8k",
                        f"dataset.data_dir={tmp_path / 'data'}", f"paths.results={tmp_path / 'results'}",
                        "hydra/launcher=slurm", "+slurm.gpus_per_node=1"])
    out = capsys.readouterr().out
    assert code == 1 and "0 of 2 jobs can run here as configured." in out
    for lack in ("lacks weights: meta-llama/Llama-3.1-70B is not in the local Hugging Face cache",
                 "lacks weights: meta-llama/Llama-3.1-8B", "lacks dataset gsm8k", "gsm8k/test.jsonl",
                 "lacks GPUs: pair llama70b_8b has 157 GB of weights (x 1.2: 3 GPUs of 80 GB); the job asks for 1"):
        assert lack in out, lack
    assert out.count("lacks trained drafter: method.drafter=") == 1  # sd2's drafter; vanilla has none
    assert "  hf download meta-llama/Llama-3.1-70B\n" in out and "task=distill task.kind=sd2 pair=llama70b_8b" in out
    assert not (tmp_path / "results").exists() and "../" not in out


def test_a_config_that_does_not_compose_is_a_lack_of_its_job(tmp_path, capsys):
    code = dryrun.main(["-m", "pair=tiny_random,no_such_pair", "dataset=smoke", f"paths.results={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 1 and "1 of 2 jobs can run here as configured." in out
    assert "lacks config:" in out and "no_such_pair" in out and "(no folder: the config does not compose)" in out
