"""Sweeps off the basic launcher: a killed or requeued job resumes its folder, shards merge, SLURM runs.

The reference for every resumed or merged run is the same configuration run once, uninterrupted
and unsharded, in this process: the rows must match it in everything but wall-clock timings.
"""

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import ROOT, TIMING, compose_cfg, small
from specbench.runs import merge
from specbench.runs.layout import job_dir
from specbench.runs.runner import run
from specbench.runs.slurm import slurm_unavailable

BASE = ["pair=tiny_random", "dataset=smoke", "device=cpu", "warmup=0", "progress=false", "threads=1"]
JOB = ["method=vanilla", "decode=t1", "decode.max_new_tokens=48", "limit=12"]


def untimed(rows: list[dict], drop: set[str] | frozenset[str] = frozenset()) -> list[dict]:
    """Rows without the wall-clock fields and those in `drop` (everything else is deterministic for a config)."""
    return [{k: v for k, v in r.items() if k not in TIMING | drop} for r in rows]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def reference(tmp_path: Path, *job: str) -> list[dict]:
    run(small("threads=1", *job), tmp_path / "reference")
    return read(tmp_path / "reference" / "rows.jsonl")


def wait_for_rows(folder: Path, pattern: str, n: int, proc: subprocess.Popen, timeout_s: float = 120) -> Path:
    """The first rows.jsonl under folder (glob pattern) once it holds >= n complete rows."""
    end = time.time() + timeout_s
    while time.time() < end:
        for f in folder.glob(pattern):
            if f.read_bytes().count(b"\n") >= n:
                return f
        assert proc.poll() is None, f"the job ended (exit {proc.returncode}) before writing {n} rows"
        time.sleep(0.02)
    raise AssertionError(f"no {n} rows under {folder} within {timeout_s} s")


def stop(p: subprocess.Popen) -> None:
    """SIGKILL a job this test started, and every process it started, if still running."""
    if p.poll() is None:
        for c in psutil.Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
    p.wait()


def test_killed_run_resumes_to_the_rows_of_an_uninterrupted_run(tmp_path, caplog):
    """SIGKILL mid-run (a preempted SLURM job), then the same command again: the same rows as one clean run."""
    ref = reference(tmp_path, *JOB)
    out = tmp_path / "killed"
    p = subprocess.Popen([sys.executable, "run.py", *BASE, *JOB, f"hydra.run.dir={out}"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_rows(out, "rows.jsonl", 2, p)
    finally:
        stop(p)  # SIGKILL, as a preempted job gets
    before = (out / "rows.jsonl").read_bytes()
    n_before = before.count(b"\n")
    assert 2 <= n_before < len(ref), "the kill must land mid-run"
    assert not (out / "summary.json").exists()
    with caplog.at_level(logging.INFO, logger="specbench.runs.runner"):  # the same command again (in-process)
        run(compose_cfg(*BASE, *JOB), out)
    assert f"{len(ref)} examples, {n_before} already done" in caplog.text
    after = (out / "rows.jsonl").read_bytes()
    assert after.startswith(before[: before.rfind(b"\n") + 1])  # finished rows kept as written, not redone
    assert untimed(read(out / "rows.jsonl")) == untimed(ref)
    assert json.loads((out / "summary.json").read_text())["n_examples"] == len(ref)


@pytest.mark.slow  # ~50 s: three Python processes start (sweep, job, requeued job); CI runs the SLURM test
def test_local_launcher_requeue_resumes_the_same_folder(tmp_path):
    """submitit's preemption signal (USR2) mid-job: the launcher checkpoints, the job is requeued and resumes."""
    ref = reference(tmp_path, *JOB)
    sweep = tmp_path / "sweep"
    p = subprocess.Popen([sys.executable, "run.py", "-m", "hydra/launcher=local", *BASE, *JOB,
                          f"paths.results={sweep}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=open(tmp_path / "sweep.err", "w"))  # a file: a pipe left unread could fill up
    try:
        rows = wait_for_rows(sweep, "tiny_random/smoke/vanilla/t1/*/rows.jsonl", 2, p, timeout_s=240)
        tasks = [c for c in psutil.Process(p.pid).children(recursive=True)
                 if "submitit.core._submit" in " ".join(c.cmdline())]
        assert len(tasks) == 1, [c.cmdline() for c in psutil.Process(p.pid).children(recursive=True)]
        tasks[0].send_signal(signal.SIGUSR2)
        p.wait(timeout=300)
    finally:
        stop(p)
    assert p.returncode == 0, (tmp_path / "sweep.err").read_text()[-3000:]
    logs = "".join(f.read_text() for f in sweep.glob(".sweeps/*/.submitit/*/*_log.*"))
    assert "preempted" in logs and "Requeued" in logs  # submitit's own record of the requeue
    resumed = [int(line.split(" already done")[0].rsplit(" ", 1)[1]) for line in logs.splitlines()
               if " already done" in line]
    assert len(resumed) == 2 and resumed[0] == 0 and 0 < resumed[1] < len(ref), resumed
    assert untimed(read(rows)) == untimed(ref)


def shard_runs(root: Path, n: int, *job: str) -> list[Path]:
    """Shards i/n of `job`, in the folders Hydra's sweep would use (shard=iofn in the folder name)."""
    dirs = []
    for i in range(n):
        cfg = small("threads=1", *job, f"shard={i}/{n}", f"paths.results={root}")
        run(cfg, job_dir(cfg))
        dirs.append(job_dir(cfg))
    return dirs


SHARD_JOB = ["method=vanilla", "decode=t1", "decode.max_new_tokens=48", "limit=7"]


@pytest.fixture(scope="module")
def shard_tree(tmp_path_factory):
    """Three shards of a 7-example run and the unsharded reference, made once for this module."""
    root = tmp_path_factory.mktemp("shards")
    shard_runs(root / "results", 3, *SHARD_JOB)
    reference(root, *SHARD_JOB)
    return root


@pytest.fixture
def shards(shard_tree, tmp_path):
    """A private copy of shard_tree: (folder, shard folders, reference rows, job overrides)."""
    shutil.copytree(shard_tree, tmp_path, dirs_exist_ok=True)
    dirs = [tmp_path / "results/tiny_random/smoke/vanilla/t1" / f"decode.max_new_tokens=48,device=cpu,shard={i}of3"
            for i in range(3)]
    return tmp_path, dirs, read(tmp_path / "reference" / "rows.jsonl"), SHARD_JOB


def test_shards_merge_into_the_unsharded_run(shards, capsys):
    tmp_path, dirs, ref, job = shards
    assert merge.main([str(tmp_path / "results")]) == 0
    out = job_dir(small("threads=1", *job, f"paths.results={tmp_path / 'results'}"))  # where run.py writes it
    assert out == tmp_path / "results/tiny_random/smoke/vanilla/t1/decode.max_new_tokens=48,device=cpu"
    assert f"-> {out}" in capsys.readouterr().out
    rows = read(out / "rows.jsonl")
    assert untimed(rows, {"batch"}) == untimed(ref, {"batch"})  # the dataset's order, the same outputs
    assert [r["batch"] for r in rows] == [0, 0, 0, 1, 1, 1, 2]  # each shard numbers the chunks of its examples
    s = json.loads((out / "summary.json").read_text())
    assert s["n_examples"] == 7 and s["total_new_tokens"] == sum(r["new_tokens"] for r in ref)
    assert s["acceptance_rate"] == sum(r["accepted"] for r in ref) / sum(r["drafted"] for r in ref)
    assert s["block_efficiency"] == sum(r["new_tokens"] for r in ref) / sum(r["target_calls"] for r in ref)
    assert s["tokens_per_s"] == pytest.approx(sum(r["new_tokens"] for r in rows) / sum(r["decode_s"] for r in rows))
    assert [m["shard"] for m in s["merged_from"]] == ["0/3", "1/3", "2/3"]
    assert s["config"]["shard"] is None
    assert json.loads((out / "config.json").read_text())["config"]["shard"] is None
    # the unsharded run of the same config resumes the merged folder with nothing left to do
    again = run(small("threads=1", *job), out)
    assert again["n_examples"] == 7 and read(out / "rows.jsonl") == rows
    assert merge.main([str(d) for d in dirs]) == 0  # merging again: identical rows, summary rewritten
    assert read(out / "rows.jsonl") == rows


def test_merge_refuses_incomplete_overlapping_or_mixed_shards(shards, capsys):
    tmp_path, dirs, _, job = shards
    out = tmp_path / "merged"

    def refused(args: list, reason: str) -> None:
        assert merge.main([*map(str, args), "--out", str(out)]) == 1
        assert reason in capsys.readouterr().err
        assert not out.exists()  # nothing written for a refused group

    refused(dirs[:2], "missing shard(s) 2/3")
    twin = tmp_path / "twin"
    shutil.copytree(dirs[1], twin)
    refused([*dirs, twin], "shard 1/3 appears twice")
    other = tmp_path / "other"
    run(small("threads=1", *job, "method.gamma=3", "shard=2/3"), other)
    refused([dirs[0], dirs[1], other], "differ in config beyond the shard")
    assert "method.gamma: 5 vs 3" in "".join(merge.config_diff(
        json.loads((dirs[2] / "config.json").read_text())["config"],
        json.loads((other / "config.json").read_text())["config"]))
    (dirs[2] / "rows.jsonl").write_text("".join((dirs[2] / "rows.jsonl").read_text().splitlines(True)[:-1]))
    refused(dirs, "unfinished shard")
    refused([tmp_path / "reference"], "not a shard run")
    refused([tmp_path / "other" / "nothing"], "no such folder")
    (tmp_path / "empty").mkdir()
    refused([tmp_path / "empty"], "no shard runs")


def test_slurm_launcher_config_composes_with_and_without_local_settings():
    """hydra/launcher=slurm reads conf/local's `slurm:` keys; absent, the launcher's own defaults hold."""
    from omegaconf import OmegaConf

    bare = OmegaConf.to_container(compose_cfg("hydra/launcher=slurm").hydra.launcher, resolve=True)
    assert bare["partition"] is None and bare["timeout_min"] == 240 and bare["max_num_timeout"] == 5
    assert bare["_target_"].endswith("SlurmLauncher")
    assert re.fullmatch(r"results/\.sweeps/[\d_-]+/\.submitit/%j", bare["submitit_folder"])  # one folder per sweep
    local = OmegaConf.to_container(compose_cfg("hydra/launcher=slurm", "local=example").hydra.launcher, resolve=True)
    assert (local["partition"], local["gpus_per_node"], local["array_parallelism"]) == ("gpu", None, 64)  # defaults
    # machine settings are no part of a run's identity: the same folder resumes on another partition
    from specbench.runs.identity import identity
    from specbench.runs.runner import resolved

    a, b = (resolved(compose_cfg(*o)) for o in ([], ["local=example"]))
    assert "slurm" in b and "slurm" not in a and identity(a) == identity(b)


def test_a_sweeps_jobs_ask_for_the_gpus_their_pairs_need():
    """gpus_per_node defaults to the most any job's pair needs, ceil(weights GB x 1.2 / 80) by the pair files'
    params_b at 2 bytes (bfloat16): llama70b_8b (70.6 + 8.03) x 2 x 1.2 / 80 = 2.36 -> 3, the Qwen2.5-Coder pair 1,
    none for the toy pair; a slurm.gpus_per_node setting wins."""
    from omegaconf import OmegaConf

    def gpus(*overrides: str, task: list[str] | None = None) -> int | None:
        cfg = compose_cfg("hydra/launcher=slurm", *overrides)
        if task is not None:  # a multirun's sweep overrides, which a single composition cannot take
            cfg.hydra.overrides.task = task
        return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)["gpus_per_node"]

    assert gpus() is None and gpus("pair=qwen25coder_1p5b_0p5b") == 1 and gpus("pair=llama70b_8b") == 3
    assert gpus(task=["pair=toy,qwen25coder_1p5b_0p5b,llama70b_8b", "method=ar,vanilla"]) == 3
    assert gpus(task=["pair=toy,qwen25coder_1p5b_0p5b"]) == 1
    assert gpus("pair=llama70b_8b", "+slurm.gpus_per_node=4") == 4


@pytest.fixture
def slurm_cluster(request, capsys):
    """Skip, printing why on the terminal, when no SLURM cluster is reachable (fail if CI started one)."""
    reason = slurm_unavailable()
    if reason:
        if os.environ.get("SPECBENCH_SLURM") == "1":
            pytest.fail(f"CI started a SLURM cluster but it is not reachable: {reason}")
        with capsys.disabled():
            print(f"\nSKIPPED {request.node.name}: no SLURM cluster: {reason}")
        pytest.skip(f"no SLURM cluster: {reason}")


@pytest.mark.slurm
def test_sweep_on_a_slurm_cluster(tmp_path, slurm_cluster):
    """Two jobs through hydra/launcher=slurm on a real (single-node) cluster; every job's results checked."""
    from omegaconf import OmegaConf

    sweep = tmp_path / "sweep"
    p = subprocess.run([sys.executable, "run.py", "-m", "hydra/launcher=slurm", *BASE, "method=ar,vanilla",
                        "limit=2", "decode.max_new_tokens=8", "hydra.launcher.timeout_min=10",
                        f"paths.results={sweep}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    for method in ("ar", "vanilla"):
        (d,) = [f.parent for f in sweep.glob(f"tiny_random/smoke/{method}/greedy/*/summary.json")]
        s = json.loads((d / "summary.json").read_text())
        assert s["n_examples"] == 2 and len(read(d / "rows.jsonl")) == 2 and s["method"] == method
        ref = run(small("threads=1", f"method={method}", "limit=2", "decode.max_new_tokens=8"),
                  tmp_path / f"ref-{method}")
        assert untimed(read(d / "rows.jsonl")) == untimed(read(tmp_path / f"ref-{method}" / "rows.jsonl"))
        assert ref["n_examples"] == 2
        # the job ran as a task of a SLURM array job: hydra.job.id is submitit's "<array job id>_<task>"
        job_id = str(OmegaConf.load(d / ".hydra/hydra.yaml").hydra.job.id)
        array_id, task = job_id.split("_")
        (submitit,) = sweep.glob(f".sweeps/*/.submitit/{job_id}")  # the sweep's own folder
        assert submitit.is_dir() and array_id.isdigit() and task in ("0", "1")
    # the tasks ran the submitting interpreter, and their logs (files, not a terminal) hold no progress bar
    (script,) = list(sweep.glob(".sweeps/*/.submitit/*/*_submission.sh"))
    assert f"{sys.executable} -u -m submitit.core._submit" in script.read_text()
    logs = [f.read_text() for f in sweep.glob(".sweeps/*/.submitit/*_*/*_log.*")]
    assert len(logs) == 4 and sum("Job completed successfully" in t for t in logs) == 2
    assert not any("%|" in t or "\r" in t for t in logs)


@pytest.mark.slurm
@pytest.mark.slow  # a requeued SLURM job waits for the scheduler to start it again
def test_preempted_slurm_job_is_requeued_and_resumes(tmp_path, slurm_cluster):
    """submitit's preemption (SIGTERM, then USR2 through scancel, as SlurmJob._interrupt): requeue, resume."""
    from omegaconf import OmegaConf

    ref = reference(tmp_path, *JOB)
    sweep = tmp_path / "sweep"
    p = subprocess.Popen([sys.executable, "run.py", "-m", "hydra/launcher=slurm", *BASE, *JOB,
                          "hydra.launcher.timeout_min=20", f"paths.results={sweep}"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "sweep.err", "w"))
    rows = wait_for_rows(sweep, "tiny_random/smoke/vanilla/t1/*/rows.jsonl", 2, p, timeout_s=300)
    try:
        job_id = str(OmegaConf.load(rows.parent / ".hydra/hydra.yaml").hydra.job.id)  # SLURM's, set by submitit
        for sig in ("SIGTERM", "USR2"):
            subprocess.run(["scancel", job_id, "--signal", sig], check=True)
        p.wait(timeout=600)
    finally:
        stop(p)
    assert p.returncode == 0, (tmp_path / "sweep.err").read_text()[-3000:]
    logs = "".join(f.read_text() for f in sweep.glob(".sweeps/*/.submitit/*/*_log.*"))
    assert "preempted" in logs and f"Requeued job {job_id}" in logs
    resumed = [int(line.split(" already done")[0].rsplit(" ", 1)[1]) for line in logs.splitlines()
               if " already done" in line]
    assert len(resumed) == 2 and resumed[0] == 0 and 0 < resumed[1] < len(ref), resumed
    assert untimed(read(rows)) == untimed(ref)


@pytest.mark.slurm
def test_training_on_two_slurm_tasks(tmp_path, slurm_cluster):
    """task=distill as one SLURM job of two tasks (hydra.launcher.tasks_per_node=2): submitit's environment becomes
    torch's, accelerate trains on 2 processes (gloo), and the result is the 1-process run's (the loop's equality)."""
    synth = tmp_path / "synth"
    run(small("task=synth", "task.n=10", "task.max_new_tokens=8", "task.batch_size=5"), synth)
    args = ["task=distill", f"task.data={synth}", "task.val_n=2", "task.batch_size=4", "task.max_steps=2",
            "task.warmup_steps=1", "task.eval_every=2"]
    one = run(small("threads=1", *args), tmp_path / "one")
    sweep = tmp_path / "sweep"
    p = subprocess.run([sys.executable, "run.py", "-m", "hydra/launcher=slurm", *BASE, *args,
                        "hydra.launcher.tasks_per_node=2", "hydra.launcher.cpus_per_task=1",
                        "hydra.launcher.timeout_min=10", f"paths.distill={sweep}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (info,) = [json.loads(f.read_text()) for f in sweep.glob("**/distill.json")]
    assert info["processes"] == 2 and one["processes"] == 1
    assert info["val_kl_final"] == pytest.approx(one["val_kl_final"], rel=1e-4)


def test_a_benchmark_refuses_several_processes(tmp_path, monkeypatch):
    from specbench.common.errors import InputError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(InputError, match="task=bench runs on one process, not 2"):
        run(small("limit=1"), tmp_path / "b")
    assert not (tmp_path / "b" / "rows.jsonl").exists()
