"""task=distill on accelerate: a 2-process CPU run (torchrun, gloo) with a global batch of 2 x b equals a 1-process run
with batch 2 x b (and one accumulating 2 micro-batches of b) at the same seed and data order: the same loss at every
step and the same final weights, within float tolerance (each micro-batch is padded to its own longest sequence); the
run records its processes. Runs killed anywhere resume to the uninterrupted weights."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from helpers import ROOT, small
from specbench.runs.runner import run

SYNTH = ("task=synth", "task.n=14", "task.max_new_tokens=12", "task.batch_size=7")
# a free port of its own (--standalone): test processes may run several at once
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
SMALL = ("pair=tiny_random", "dataset=smoke", "device=cpu", "warmup=0", "progress=false")  # helpers.small's


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    run(small(*SYNTH), out)
    return out


def weights(folder) -> dict[str, torch.Tensor]:
    """Every trained tensor of a finished run: the drafter's (and sd2's steering) or the head's."""
    files = [*folder.glob("drafter/*.safetensors"), *folder.glob("steering.safetensors"),
             *folder.glob("head/*.safetensors")]
    return {f"{f.name}:{k}": v for f in files for k, v in load_file(f).items()}


@pytest.mark.parametrize("kind", ["sd2", "eagle3"])
def test_two_processes_train_what_one_process_trains(tmp_path, synth_dir, kind):
    args = ["task=distill", f"task.kind={kind}", f"task.data={synth_dir}", "task.val_n=2", "task.batch_size=4",
            "task.max_steps=4", "task.warmup_steps=1", "task.eval_every=2", "task.save_every=100", "threads=1",
            "task.ttt_steps=2", "task.draft_vocab=64"]
    one = run(small(*args), tmp_path / "one")
    run(small(*args, "task.accumulate=2"), tmp_path / "acc")  # 2 micro-batches of 2 rows: the 2 processes' split
    p = subprocess.run([*TORCHRUN, "run.py", *SMALL,
                        *args, f"hydra.run.dir={tmp_path / 'two'}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    two = json.loads((tmp_path / "two" / "distill.json").read_text())
    assert (one["processes"], two["processes"]) == (1, 2) and one["steps"] == two["steps"] == 4
    logs = [[json.loads(x) for x in (tmp_path / d / "train_log.jsonl").read_text().splitlines()]
            for d in ("one", "two", "acc")]
    assert [h["step"] for h in logs[0]] == [h["step"] for h in logs[1]] == [h["step"] for h in logs[2]]
    for a, b, c in zip(*logs):
        assert a.keys() == b.keys() == c.keys()
        for key in a.keys() - {"step"}:  # loss, lr, grad_norm; val_kl where measured
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (key, a, b)
            assert c[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (key, c, b)
    # Adam moves a weight by about lr per step whatever its gradient's size, so a gradient near 0 whose rounding
    # differs between the two runs may move its weight by up to lr x steps: all but a few in 10^4 agree to 1e-5
    w1, w2 = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert w1.keys() == w2.keys() and w1
    diff = torch.cat([(w1[k].float() - w2[k].float()).abs().flatten() for k in w1])
    assert float(diff.max()) <= 4 * 3e-3 and float((diff > 1e-5).float().mean()) < 1e-4, float(diff.max())


def test_a_batch_that_does_not_split_over_the_processes_is_refused(tmp_path, synth_dir):
    args = ["task=distill", f"task.data={synth_dir}", "task.val_n=2", "task.batch_size=3", "task.max_steps=2"]
    p = subprocess.run([*TORCHRUN, "run.py", *SMALL,
                        *args, f"hydra.run.dir={tmp_path / 'two'}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode != 0 and "task.batch_size 3 does not split over 2 process(es)" in p.stderr
    assert not (tmp_path / "two" / "distill.json").exists()


KILLER = """import os, signal, sys
sys.path.insert(0, {root!r})
import torch
from specbench.common.files import atomic_path
from specbench.training import distill, features, loop

features.SHARD_ROWS = 4  # 14 rows in 4 shards
where, at = os.environ.get("KILL_AT", ":").split(":")
main = os.environ.get("RANK", "0") == "0"

def die():
    os.kill(os.getpid(), signal.SIGKILL)

real_shard, real_step, calls = features.write_shard, loop.step_loss, []

def shard(path, *a, **k):  # dies once shard `at` is written
    real_shard(path, *a, **k)
    if where == "shard" and main and path.name == f"shard-{{int(at):05d}}.safetensors":
        die()

def step(*a, **k):  # dies after the forward and backward of this run's step `at`, before the optimiser's step
    out = real_step(*a, **k)
    calls.append(1)
    if where == "step" and main and len(calls) == int(at):
        die()
    return out

def save(obj, path):  # dies halfway through writing the step-`at` checkpoint
    if where == "save" and obj["step"] == int(at):
        with atomic_path(path) as tmp:
            torch.save(obj, tmp)
            tmp.write_bytes(tmp.read_bytes()[: tmp.stat().st_size // 2])
            die()
    real_save(obj, path)

real_save = distill.save_atomic
features.write_shard, loop.step_loss, distill.save_atomic = shard, step, save
sys.argv[0] = {run_py!r}
import runpy
runpy.run_path({run_py!r}, run_name="__main__")
"""


@pytest.mark.parametrize("processes", [1, 2])
def test_a_run_killed_anywhere_resumes_to_the_uninterrupted_weights(tmp_path, synth_dir, processes):
    """kill -9 of the main process in the features cache's write, in a step (after its backward, before the optimiser),
    and halfway through writing a checkpoint: each time the same command again continues from what was finished (a
    half-written checkpoint is never read), and the last ends with the weights and log of an uninterrupted run, bit for
    bit."""
    args = [*SMALL, "task=distill", "task.kind=sd2", f"task.data={synth_dir}", "task.val_n=2", "task.batch_size=4",
            "task.max_steps=5", "task.warmup_steps=1", "task.eval_every=2", "task.save_every=2", "threads=1",
            f"task.features={tmp_path / 'features'}"]
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER.format(root=str(ROOT), run_py=str(ROOT / "run.py")))
    launch = TORCHRUN[:-1] + [str(processes)] if processes > 1 else [sys.executable]

    def go(folder: str, kill: str = ":") -> subprocess.CompletedProcess:
        return subprocess.run([*launch, str(killer), *args, f"hydra.run.dir={tmp_path / folder}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, env={**os.environ, "KILL_AT": kill})

    assert go("straight").returncode == 0
    shutil.rmtree(tmp_path / "features")  # the killed runs write the cache again
    run_dir = tmp_path / "resumed"
    assert go("resumed", "shard:0").returncode != 0
    assert not any((tmp_path / "features").glob("*/meta.json")) and not run_dir.joinpath("checkpoint.pt").exists()
    assert go("resumed", "step:3").returncode != 0
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["step"] == 2
    assert go("resumed", "save:4").returncode != 0
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["step"] == 2  # the half-written one is not it
    again = go("resumed")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming at step 2 of 5" in again.stderr + again.stdout + (run_dir / "run.log").read_text()
    w1, w2 = weights(tmp_path / "straight"), weights(run_dir)
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    logs = [(tmp_path / d / "train_log.jsonl").read_text() for d in ("straight", "resumed")]
    assert logs[0] == logs[1] and not (run_dir / "checkpoint.pt").exists()


def test_a_resume_on_other_processes_or_another_config_is_refused(tmp_path, synth_dir):
    args = ("task=distill", f"task.data={synth_dir}", "task.val_n=2", "task.batch_size=4", "task.max_steps=2")
    run(small(*args), tmp_path / "a")
    (tmp_path / "a" / "distill.json").unlink()
    torch.save({"step": 1, "train_rows": 12, "processes": 2}, tmp_path / "a" / "checkpoint.pt")
    from specbench.common.errors import InputError

    with pytest.raises(InputError, match=r"written by a run on 2 process\(es\); resume it on as many \(this run has 1\)"):
        run(small(*args), tmp_path / "a")
    with pytest.raises(InputError, match=r"different configuration \(saved vs now: task\.lr \(0\.001 vs 0\.002\)\)"):
        run(small(*args, "task.lr=2e-3"), tmp_path / "a")  # a resume after the config changed names the key
    assert torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)["step"] == 1  # untouched


def test_data_smaller_than_one_batch_is_refused_before_training(tmp_path, synth_dir):
    from specbench.common.errors import InputError

    with pytest.raises(InputError, match=r"task.accumulate must be a whole number >= 1 \(micro-batches a step\), got 0"):
        run(small("task=distill", f"task.data={synth_dir}", "task.val_n=2", "task.accumulate=0"), tmp_path / "a")
    with pytest.raises(InputError, match=r"the training data has 12 rows, fewer than one batch \(task.batch_size 16\)"):
        run(small("task=distill", f"task.data={synth_dir}", "task.val_n=2", "task.batch_size=16"), tmp_path / "d")
    assert not (tmp_path / "d" / "distill.json").exists() and not (tmp_path / "d" / "checkpoint.pt").exists()


def test_accelerate_launch_with_the_shipped_config_trains(tmp_path, synth_dir):
    """`accelerate launch --config_file launch/accelerate.yaml` runs run.py's training (on a machine without GPUs:
    `--cpu`, one process, as accelerate starts one there)."""
    p = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", "launch/accelerate.yaml",
                        "--cpu", "--num_processes", "1", "run.py", *SMALL, "task=distill", f"task.data={synth_dir}",
                        "task.val_n=2", "task.batch_size=4", "task.max_steps=2", "threads=1",
                        f"hydra.run.dir={tmp_path / 'd'}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    info = json.loads((tmp_path / "d" / "distill.json").read_text())
    assert info["processes"] == 1 and info["steps"] == 2
