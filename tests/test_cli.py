"""run.py through Hydra: the default run and a sweep, one folder per job with its choices recorded; every run
folder a leaf, each sweep's own record, and no folder left by a job interrupted before its first row."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from helpers import ROOT, TINY
from specbench.runs import merge


def run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_default_run(tmp_path):
    """The default run (toy pair, toy_arith, vanilla) with the toy pair shrunk and trained into tmp_path."""
    out = tmp_path / "run"
    p = run_py(f"hydra.run.dir={out}", "limit=2", "decode.max_new_tokens=8",
               f"pair.cache_dir={tmp_path / 'toy'}", *TINY)
    assert p.returncode == 0, p.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["n_examples"] == 2 and s["n_examples"] == len((out / "rows.jsonl").read_text().splitlines())
    assert s["choices"] == {**s["choices"], "pair": "toy", "dataset": "toy_arith", "method": "vanilla"}
    assert len(list((tmp_path / "toy").iterdir())) == 1  # trained once, into the configured cache


def test_sweep_writes_one_folder_per_job(tmp_path):
    p = run_py("-m", "pair=tiny_random", "dataset=smoke", "method=ar,vanilla", "decode=greedy,t1",
               f"paths.results={tmp_path}",
               "limit=2", "decode.max_new_tokens=8", "warmup=0")
    assert p.returncode == 0, p.stderr
    summaries = sorted(tmp_path.rglob("summary.json"))
    assert len(summaries) == 4
    seen = set()
    for f in summaries:
        s = json.loads(f.read_text())
        seen.add((s["choices"]["method"], s["choices"]["decode"]))
        assert f.parent.relative_to(tmp_path).parts[:4] == ("tiny_random", "smoke", s["choices"]["method"], s["choices"]["decode"])
        assert s["n_examples"] == 2
    assert seen == {("ar", "greedy"), ("ar", "t1"), ("vanilla", "greedy"), ("vanilla", "t1")}


def test_a_run_and_a_sweeps_job_at_the_default_batch_size_resume_one_folder(tmp_path):
    """`python run.py`, then docs/usage.md's batch-size sweep `-m ... batch_size=1,2`: the sweep's batch_size=1 job
    resumes the folder of the run without the key (batch_size=1 is its default), batch_size=2 writes its own."""
    base = ["pair=tiny_random", "dataset=smoke", "method=ar", "limit=2", "warmup=0", "threads=1", "progress=false",
            f"paths.results={tmp_path}"]
    for args in (base, ["-m", *base, "batch_size=1,2"]):
        p = run_py(*args)
        assert p.returncode == 0, p.stderr[-3000:]
    top = tmp_path / "tiny_random/smoke/ar/greedy"
    assert sorted(f.parent for f in tmp_path.rglob("config.json")) == [top / "batch_size=2", top / "default"]
    s = json.loads((top / "default" / "summary.json").read_text())
    assert (s["batch_size"], s["decoded"], s["resumed"]) == (1, 0, 2)  # the sweep's job found the run's rows


def test_unknown_method_on_the_command_line(tmp_path):
    p = run_py(f"hydra.run.dir={tmp_path}", "method=nope")
    assert p.returncode != 0 and "vanilla" in p.stderr and "nope" in p.stderr


def test_run_folders_are_leaves_and_each_sweep_keeps_its_multirun_yaml(tmp_path):
    """The default run, shard runs of an override and a second sweep: the default run has its own leaf, no
    override or shard '/' nests a folder, the shards merge into the unsharded run's folder, and each sweep's
    multirun.yaml stays."""
    base = ["pair=tiny_random", "dataset=smoke", "limit=2", "warmup=0", "threads=1", "progress=false",
            f"paths.results={tmp_path}"]
    for args in (base, ["-m", *base, "decode.max_new_tokens=4", "shard=0/2,1/2"],
                 ["-m", *base, "decode.max_new_tokens=5,6"]):
        p = run_py(*args)
        assert p.returncode == 0, p.stderr[-3000:]
    top = tmp_path / "tiny_random/smoke/vanilla/greedy"
    leaves = ["decode.max_new_tokens=4,shard=0of2", "decode.max_new_tokens=4,shard=1of2", "decode.max_new_tokens=5",
              "decode.max_new_tokens=6", "default"]
    runs = sorted(f.parent for f in tmp_path.rglob("config.json"))
    assert runs == [top / name for name in leaves]
    assert not any(a in b.parents for a in runs for b in runs)  # no run folder inside another
    sweeps = sorted((tmp_path / ".sweeps").iterdir())  # named by start time
    assert [list(OmegaConf.load(d / "multirun.yaml").hydra.overrides.task) for d in sweeps] == \
        [[*base, "decode.max_new_tokens=4", "shard=0/2,1/2"], [*base, "decode.max_new_tokens=5,6"]]
    assert merge.main([str(tmp_path)]) == 0
    merged = json.loads((top / "decode.max_new_tokens=4" / "summary.json").read_text())
    assert merged["n_examples"] == 2 and [m["shard"] for m in merged["merged_from"]] == ["0/2", "1/2"]


# run.py whose warm-up (runner.warm_up: after config.json, before the first row) writes the file $READY_FILE and
# waits for the test's SIGINT: where the interrupt lands depends on no timing and no load
WAITING_RUN = """
import os, runpy, sys, time
from pathlib import Path
import specbench.runs.runner as runner

def wait_for_interrupt(*args):
    Path(os.environ["READY_FILE"]).write_text("warming up")
    while True:
        time.sleep(3600)

runner.warm_up = wait_for_interrupt
sys.argv[0] = "run.py"
runpy.run_path("run.py", run_name="__main__")
"""


def test_a_job_interrupted_before_its_first_row_leaves_no_folder(tmp_path):
    """Ctrl-C during the warm-up, after config.json is written: nothing is left under the results root."""
    ready, results, stderr = tmp_path / "ready", tmp_path / "results", tmp_path / "stderr"  # a file: never full
    results.mkdir()
    with stderr.open("w") as f:
        p = subprocess.Popen([sys.executable, "-c", WAITING_RUN, "pair=tiny_random", "dataset=smoke", "limit=2",
                              "warmup=1", "decode.max_new_tokens=8", "threads=1", "progress=false",
                              f"paths.results={results}"], cwd=ROOT, env={**os.environ, "READY_FILE": str(ready)},
                             stdout=subprocess.DEVNULL, stderr=f,
                             # Ctrl-C as from a terminal, also where pytest runs in the background of a shell without
                             # job control (which starts it, and so the job, with SIGINT ignored)
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    end = time.time() + 600  # only against a job that hangs before its warm-up
    while not ready.exists():
        if p.poll() is not None or time.time() > end:
            p.kill()
            p.wait()
            pytest.fail(f"the job did not reach its warm-up:\n{stderr.read_text()[-3000:]}")
        time.sleep(0.05)
    assert any(results.rglob("config.json")) and not any(results.rglob("rows.jsonl"))  # it waits in the warm-up
    p.send_signal(signal.SIGINT)
    p.wait(timeout=600)
    err = stderr.read_text()
    assert p.returncode != 0 and "KeyboardInterrupt" in err and "in wait_for_interrupt" in err, err[-3000:]
    assert list(results.iterdir()) == []


def test_bench_methods_writes_the_folders_run_py_writes(tmp_path, monkeypatch, capsys):
    """`python -m specbench.bench methods`: each method's run in the folder run.py uses for the same overrides;
    a method failing before its first row leaves no folder there either."""
    import specbench.runs.runner as runner
    from specbench import bench

    args = ["methods", "--pair", "tiny_random", "--dataset", "smoke", "--limit", "1", "--max-new-tokens", "4",
            "--out", str(tmp_path)]
    assert bench.main([*args, "--methods", "ar,vanilla", "warmup=0"]) == 0
    assert "vanilla" in capsys.readouterr().out
    runs = sorted(f.parent.relative_to(tmp_path).as_posix() for f in tmp_path.rglob("config.json"))
    assert runs == [f"tiny_random/smoke/{m}/greedy/decode.max_new_tokens=4" for m in ("ar", "vanilla")]

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "decode_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench.main([*args, "--methods", "draft_only", "warmup=0"])
    assert not (tmp_path / "tiny_random/smoke/draft_only").exists() and len(list(tmp_path.rglob("config.json"))) == 2


COMPOSED = ("pair=tiny_random", "dataset=smoke", "limit=2", "decode.max_new_tokens=8", "warmup=0")


def test_a_method_composed_on_the_command_line_runs_and_is_named_by_its_parts(tmp_path):
    """`method.parts.<part>=` and a part's options with no `+` (max_depth: the suffix drafter's, which vanilla's preset
    lacks), the `+` forms of both, and a rule part: each runs the parts it names, in a method folder named by them,
    with rows and a summary that carry that name; the leaf holds the other overrides, without `+`."""
    p = run_py("-m", *COMPOSED, f"paths.results={tmp_path}", "method=vanilla,gammatune", "method.parts.drafter=suffix",
               "method.max_depth=8", "+method.gamma=3")
    assert p.returncode == 0, p.stderr
    p = run_py(*COMPOSED, f"paths.results={tmp_path}", "method=vanilla", "+method.parts.rule=block")
    assert p.returncode == 0, p.stderr
    found = {s.parent.relative_to(tmp_path / "tiny_random" / "smoke").as_posix(): json.loads(s.read_text())
             for s in tmp_path.rglob("summary.json")}
    leaf = "decode.max_new_tokens=8,method.gamma=3,method.max_depth=8"
    assert set(found) == {f"vanilla+drafter=suffix/greedy/{leaf}", f"gammatune+drafter=suffix/greedy/{leaf}",
                          "vanilla+rule=block/greedy/decode.max_new_tokens=8"}
    for folder, s in found.items():
        name = folder.split("/")[0]
        assert s["method"] == name and {r["method"] for r in map(json.loads, (tmp_path / "tiny_random" / "smoke" /
                                                                              folder / "rows.jsonl").open())} == {name}
        parts = s["config"]["method"]["parts"]
        assert parts["drafter"] == ("suffix" if "suffix" in name else "draft_model")
        assert parts["rule"] == ("block" if "block" in name else "rejection")
        if "suffix" in name:
            assert s["config"]["method"]["max_depth"] == 8 and s["config"]["method"]["gamma"] == 3
            assert "draft" not in s["runtime"]["models"]  # the suffix drafter needs no draft model


def test_an_unknown_option_names_each_part_and_its_options(tmp_path):
    p = run_py(*COMPOSED, f"paths.results={tmp_path}", "method=vanilla", "method.parts.drafter=suffix",
               "method.max_dept=8")
    assert p.returncode != 0 and not any(tmp_path.iterdir())
    assert ("method 'vanilla+drafter=suffix' got unknown options ['max_dept'] (method.max_dept=8); each part's valid "
            "options: policy vanilla: gamma; drafter suffix: global_cache, max_depth, max_spec_factor, "
            "max_spec_offset, min_token_prob; shape chain: none") in p.stderr
    p = run_py(*COMPOSED, f"paths.results={tmp_path}", "method=gammatune_pld", "method.parts.drafter=suffix")
    assert p.returncode != 0 and "max_ngram is an option of the preset 'gammatune_pld': drop it with ~method.max_ngram" \
        in p.stderr
    p = run_py(*COMPOSED, f"paths.results={tmp_path}", "method=vanilla", "method.rule=block")
    assert p.returncode != 0 and "the rule is a part: method.parts.rule" in p.stderr


def test_help_lists_every_config_and_key_without_loading_torch():
    """`python run.py --help`: every method, pair, dataset, decode setting, experiment and task with its description,
    the run and decode keys, and a sweep and a SLURM example; torch is not imported for it."""
    p = subprocess.run([sys.executable, "-X", "importtime", "run.py", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "torch" not in {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines()}  # never imported
    for group in ("method", "pair", "dataset", "decode", "experiment", "task"):
        for f in (ROOT / "conf" / group).glob("*.yaml"):
            assert f"\n  {f.stem} " in p.stdout, (group, f.stem)
    assert "  ar                     The target model alone" in p.stdout
    assert "  limit=null  the first N examples" in p.stdout and "  decode.temperature=0.0" in p.stdout
    assert "python run.py -m method=ar,vanilla" in p.stdout and "hydra/launcher=slurm" in p.stdout


def test_help_of_one_method_lists_its_parts_and_options():
    p = run_py("--help", "method=gammatune_pld")
    assert p.returncode == 0, p.stderr
    assert "'policy': 'gammatune', 'drafter': 'lookup'" in p.stdout and "  drafter lookup: max_ngram=2" in p.stdout
    assert "  policy gammatune: delta=2, eta=0.5, gamma=10" in p.stdout
    bad = run_py("--help", "method=nope")
    assert bad.returncode == 1 and bad.stderr.startswith("unknown method 'nope'; methods: adasd,")


def test_a_submitit_sweep_leaves_no_literal_job_id_folder(tmp_path):
    """submitit makes its folder pattern's literal `.submitit/%j` when it starts; the sweep removes it when it ends,
    and keeps each job's own folder (its id)."""
    p = run_py("-m", "hydra/launcher=local", "pair=tiny_random", "dataset=smoke", "limit=1", "decode.max_new_tokens=4",
               "warmup=0", "threads=1", "method=ar,vanilla", f"paths.results={tmp_path}")
    assert p.returncode == 0, p.stderr
    (submitit,) = tmp_path.glob(".sweeps/*/.submitit")
    jobs = sorted(d.name for d in submitit.iterdir())
    assert len(jobs) == 2 and all(j.isdigit() for j in jobs), jobs  # no "%j"
