"""run.py through Hydra: the default run and a sweep, one folder per job with its choices recorded."""

import json
import subprocess
import sys

from helpers import ROOT, TINY


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
               f"hydra.sweep.dir={tmp_path}",
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


def test_unknown_method_on_the_command_line(tmp_path):
    p = run_py(f"hydra.run.dir={tmp_path}", "method=nope")
    assert p.returncode != 0 and "vanilla" in p.stderr and "nope" in p.stderr
