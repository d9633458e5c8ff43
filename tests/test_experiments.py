"""conf/experiment/: each paper experiment is one sweep. Its job grid is checked against the papers'
settings (written out here from ../shared/papers), representative jobs are composed, and the
experiments run end to end on the toy pair shrunk as in test_toy (one reduced case in CI, all slow).
"""

import json
import os
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest

from helpers import ROOT, SYNTHETIC, TINY, compose_cfg
from specbench.runs.layout import job_dir
from specbench.runs.runner import run
from specbench.runs.slurm import sweep_jobs

EXPERIMENTS = ["adasd_table1", "adasd_tables3_5", "gammatune_table2", "sd2_fig5", "sd2_table1", "sd2_table5",
               "spec_bench_table"]
ADASD_ROWS = ["draft_only", "ar", "vanilla", "hf_assisted", "adasd_gen_only", "adasd_verify_only", "adasd"]
GAMMA_GRID = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24]  # GammaTune section 5
GAMMATUNE_ROWS = ["vanilla", "heuristic", "confidence", "gammatune", "gammatune_plus"]
SD2_DATASETS = ["ultrachat", "humaneval", "xsum", "alpaca_eval", "gsm8k"]
SPEC_BENCH_ROWS = ["ar", "vanilla", "hf_assisted", "pld", "layer_skip", "gammatune", "adasd"]
# The papers' settings per experiment: rows x datasets x seeds (x initial gamma), decode, new tokens.
GRIDS = {
    "adasd_table1": dict(rows=ADASD_ROWS, datasets=["gsm8k", "humaneval", "mmlu"], seeds=[48763], decode="t1", max_new=512),
    "adasd_tables3_5": dict(rows=ADASD_ROWS + ["adasd_variant_a", "adasd_variant_b", "adasd_variant_c"],
                            datasets=["gsm8k", "humaneval", "mmlu"], seeds=[48763], decode="t1", max_new=512),
    "gammatune_table2": dict(rows=GAMMATUNE_ROWS, datasets=["spec_bench"], seeds=[None], decode="greedy", max_new=1024,
                             gammas=GAMMA_GRID),
    "sd2_fig5": dict(rows=["eagle3", "vanilla", "distilled", "sd2"], datasets=SD2_DATASETS, seeds=[0],
                     decode=["greedy", "t1"], max_new=128),
    "sd2_table1": dict(rows=["vanilla", "distilled", "sd2"], datasets=SD2_DATASETS, seeds=[0, 1, 2], decode="t1", max_new=128),
    "sd2_table5": dict(rows=["vanilla", "distilled", "sd2"], datasets=SD2_DATASETS, seeds=[0], decode="greedy", max_new=128),
    "spec_bench_table": dict(rows=SPEC_BENCH_ROWS, datasets=["spec_bench"], seeds=[None], decode="greedy", max_new=1024),
}


def job_settings(job: list[str]) -> tuple:
    """(row, dataset, seed, initial gamma, decode, max new tokens, limit, gamma) of one job's overrides
    (the GammaTune grid's method.gamma is its initial gamma, SD²'s fixed one its gamma)."""
    o = dict(x.split("=", 1) for x in job)
    seed = int(o["decode.seed"]) if "decode.seed" in o else None
    grid = o["experiment"] == "gammatune_table2"
    gamma0 = int(o["method.gamma"]) if grid else None
    return (o["method"], o["dataset"], seed, gamma0, o["decode"], int(o["decode.max_new_tokens"]), o.get("limit"),
            None if grid else o.get("method.gamma"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_jobs_are_the_papers_grid(name):
    g = GRIDS[name]
    jobs = sweep_jobs(compose_cfg(f"experiment={name}", "pair=llama70b_8b"))
    sd2 = name.startswith("sd2")
    decodes = g["decode"] if isinstance(g["decode"], list) else [g["decode"]]
    expected = {(r, d, s, gamma, dec, g["max_new"], "96" if sd2 else None, "8" if sd2 else None)
                for r, d, s, gamma, dec in product(g["rows"], g["datasets"], g["seeds"], g.get("gammas", [None]), decodes)}
    got = [job_settings(j) for j in jobs]
    assert len(got) == len(set(got)) == len(expected) and set(got) == expected
    assert all(f"experiment={name}" in j and "pair=llama70b_8b" in j for j in jobs)
    # a command-line override replaces the experiment's parameter of the same key (BasicSweeper order)
    narrowed = sweep_jobs(compose_cfg(f"experiment={name}", f"dataset={g['datasets'][-1]}"))
    assert len(narrowed) == len(expected) // len(g["datasets"])


def test_gammatune_jobs_start_every_method_at_the_initial_gamma():
    jobs = [j for j in sweep_jobs(compose_cfg("experiment=gammatune_table2")) if "method.gamma=12" in j]
    assert len(jobs) == len(GAMMATUNE_ROWS)
    for job in jobs:
        c = compose_cfg(*job)
        row = c.hydra.runtime.choices.method
        assert c.hydra.runtime.choices.experiment == "gammatune_table2" and c.method.name == row
        assert c.method.gamma == 12 and c.decode.temperature == 0.0 and c.decode.max_new_tokens == 1024
        assert sum(v == 12 for k, v in c.method.items() if k != "name") == 1  # only the initial γ is moved
        # the run folder names the initial γ; the experiment's own choice stays out of it
        assert job_dir(c).name == "decode.max_new_tokens=1024,method.gamma=12"


def test_adasd_and_sd2_jobs_compose_to_the_papers_settings():
    (job,) = [j for j in sweep_jobs(compose_cfg("experiment=adasd_table1")) if {"method=adasd", "dataset=mmlu"} <= set(j)]
    c = compose_cfg(*job)
    assert (c.method.name, c.method.gamma, c.method.parts.rule) == ("adasd", 20, "sample_match")
    assert (c.decode.temperature, c.decode.top_k, c.decode.top_p) == (1.0, None, None) and c.dataset.split == "validation"
    assert job_dir(c).name == "decode.max_new_tokens=512,decode.seed=48763"
    paths = ["paths.drafters.distilled=/d/distilled", "paths.drafters.sd2=/d/sd2"]
    for table, row in product(["sd2_table1", "sd2_table5"], ["vanilla", "distilled", "sd2"]):
        (job,) = [j for j in sweep_jobs(compose_cfg(f"experiment={table}", *paths))
                  if {"dataset=gsm8k", f"method={row}", "decode.seed=0"} <= set(j)]
        c = compose_cfg(*job)
        temp = "t1" if table == "sd2_table1" else "greedy"
        assert (c.method.name, c.method.gamma, c.method.parts.rule) == (row, 8, "rejection")
        assert c.method.get("drafter") == {"vanilla": None, "distilled": "/d/distilled", "sd2": "/d/sd2"}[row]
        assert c.decode.temperature == (1.0 if temp == "t1" else 0.0)
        assert c.limit == 96 and c.decode.max_new_tokens == 128
        # no drafter paths in folder names, nor a key at its default (seed 0; γ 8 but for vanilla's 5)
        assert job_dir(c).name == "decode.max_new_tokens=128" + (",method.gamma=8" if row == "vanilla" else "")


def toy_overrides(tmp: Path) -> list[str]:
    """The toy pair shrunk as in test_toy, trained into tmp; small, quick, offline runs."""
    return ["pair=toy", f"pair.cache_dir={tmp / 'toy'}", *TINY, "device=cpu", "warmup=0", "threads=1",
            "limit=1", "decode.max_new_tokens=4", "on_long_prompt=truncate"]


def test_gammatune_experiment_from_the_command_line_on_the_toy_pair(tmp_path):
    """CI's reduced case: `python run.py -m experiment=gammatune_table2` on the shrunk toy pair, γ in {1, 24}."""
    sweep = tmp_path / "sweep"
    toy = toy_overrides(tmp_path)
    p = subprocess.run([sys.executable, "run.py", "-m", "experiment=gammatune_table2", *toy,
                        "method.gamma=1,24", f"paths.results={sweep}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "SPECBENCH_DATA_DIR": str(SYNTHETIC)})
    assert p.returncode == 0, p.stderr[-3000:]
    seen = set()
    for f in sweep.rglob("summary.json"):
        s = json.loads(f.read_text())
        row, g0 = s["choices"]["method"], s["config"]["method"]["gamma"]
        seen.add((row, g0))
        assert s["config"]["method"]["name"] == row and s["n_examples"] == 1
        assert s["config"]["decode"]["temperature"] == 0.0 and s["config"]["decode"]["max_new_tokens"] == 4
        assert f.parent.relative_to(sweep).parts[:4] == ("toy", "spec_bench", row, "greedy")
        # the folder of the same setting run alone, without -m and the experiment (the toy overrides name it too)
        alone = compose_cfg(*toy, "dataset=spec_bench", f"method={row}", f"method.gamma={g0}", f"paths.results={sweep}")
        assert f.parent == job_dir(alone) and f.parent.name.startswith("decode.max_new_tokens=4,device=cpu,method.gamma=")
    assert seen == set(product(GAMMATUNE_ROWS, [1, 24]))
    # output to a pipe (not a terminal) carries no progress bar: no bar redraws, no rates
    for text in (p.stdout, p.stderr):
        assert "\r" not in text and "ex/s" not in text and "job/s" not in text and "%|" not in text


# ---------------------------------------------------------------- slow: everything, end to end

OFFLINE = {"mmlu": ["dataset.split=test"], "xsum": ["dataset.split=test_1000"]}  # local copies' splits
HUB_ONLY = {"ultrachat"}  # no local copy (../shared/data/README.md): these jobs need the hub


def run_experiment(name: str, tmp: Path, sweep: Path, *extra: str) -> list[dict]:
    """Every offline-runnable job of `name` on the shrunk toy pair, each into the folder Hydra's sweep would use."""
    toy = toy_overrides(tmp)
    jobs = sweep_jobs(compose_cfg(f"experiment={name}", *toy, *extra))
    summaries = []
    for job in jobs:
        dataset = dict(x.split("=", 1) for x in job)["dataset"]
        if dataset in HUB_ONLY:
            continue
        cfg = compose_cfg(*job, *OFFLINE.get(dataset, []), f"paths.results={sweep}")
        summaries.append(run(cfg, job_dir(cfg)))  # the folder a sweep's job writes (its hydra.run.dir)
    return summaries


def rebuilt(sweep: Path, *names: str) -> dict:
    """The papers' tables as specbench.analysis.report rebuilds them from the sweep's run folders."""
    from specbench.analysis import load, report

    return {t.name: t for t in report.build_tables(load.load_runs(sweep), list(names))}


def filled(table, column: str | None = None) -> bool:
    """Every row of the table has its numbers (in `column` of each dataset, or every printed cell)."""
    if column is None:
        return bool((table.cells != "").all().all())
    return bool(table.values.xs(column, axis=1, level=1).notna().all().all())


@pytest.mark.slow
def test_every_job_of_every_experiment_composes():
    for name in EXPERIMENTS:
        paths = ["paths.drafters.distilled=/a", "paths.drafters.sd2=/b"] if name.startswith("sd2") else []
        for job in sweep_jobs(compose_cfg(f"experiment={name}", "pair=qwen3_8b_0p6b", *paths)):
            row, dataset, seed, gamma0, decode, max_new, limit, gamma = job_settings(job)
            c = compose_cfg(*job)
            assert (c.method.name, c.dataset.name, c.decode.max_new_tokens) == (row, dataset, max_new)
            assert c.decode.temperature == {"t1": 1.0, "greedy": 0.0}[decode]
            if gamma0 is not None:
                assert c.method.gamma == gamma0
            if gamma is not None:
                assert c.method.gamma == 8 and c.limit == 96
                if row == "eagle3":  # the pair's published EAGLE-3 head (conf/pair: heads.eagle3)
                    assert c.method.head == "Tengyunw/qwen3_8b_eagle3" and "drafter" not in c.method
                else:
                    assert c.method.get("drafter") == {"vanilla": None, "distilled": "/a", "sd2": "/b"}[row]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adasd", "gammatune_table2"])
def test_experiment_runs_end_to_end_on_the_toy_pair(tmp_path, monkeypatch, name):
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(SYNTHETIC))  # one example of each set: the synthetic fixtures
    sweep = tmp_path / "sweep"
    if name == "adasd":  # Tables 3-5 reuse Table 1's runs: only the variants' runs are new
        first = run_experiment("adasd_table1", tmp_path, sweep)
        assert len(first) == 21 and all(s["n_examples"] == 1 for s in first)
        rows_before = {f: f.read_bytes() for f in sweep.rglob("rows.jsonl")}
        second = run_experiment("adasd_tables3_5", tmp_path, sweep)
        assert len(second) == 30 and len(list(sweep.rglob("rows.jsonl"))) == 30
        assert all(f.read_bytes() == b for f, b in rows_before.items())
        assert {s["method"] for s in second} == set(GRIDS["adasd_tables3_5"]["rows"])
        t = rebuilt(sweep, "adasd_table1_2", "adasd_tables3_5")
        assert sorted(t) == [f"adasd_table{i}" for i in range(1, 6)]
        rows = ["Draft", "Target", "Vanilla", "AssistedGen", "Gen-Only", "Verify-Only", "AdaSD"]
        assert [r for _, r in t["adasd_table1"].values.index] == rows and filled(t["adasd_table1"], "tk/sec")
        assert [c for c, _ in t["adasd_table1"].values.columns][::4] == ["GSM8K", "HumanEval", "MMLU"]
        assert (t["adasd_table1"].values.xs("speedup", axis=1, level=1).loc[("toy", "Vanilla")] == 1.0).all()
        assert [r for _, r in t["adasd_table3"].values.index] == rows + ["Variant A", "Variant B", "Variant C"]
        assert filled(t["adasd_table3"], "tk/sec") and filled(t["adasd_table5"], "tk/sec")
    else:
        done = run_experiment(name, tmp_path, sweep)
        assert len(done) == 60 and {(s["method"], s["config"]["method"]["gamma"]) for s in done} == \
            set(product(GAMMATUNE_ROWS, GAMMA_GRID))
        t = rebuilt(sweep, "gammatune_table2")["gammatune_table2"]
        assert [r for _, r in t.values.index] == ["SpecDecode", "HFHeuristic", "AssistantThreshold", "GammaTune",
                                                  "GammaTune+"] and filled(t)


@pytest.mark.slow
def test_sd2_experiments_run_end_to_end_on_the_toy_pair(tmp_path, monkeypatch):
    """Train both drafters on the shrunk toy pair (task=synth, task=distill), then Tables 1 and 5 without UltraChat."""
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(SYNTHETIC))  # one example of each set: the synthetic fixtures
    toy = [x for x in toy_overrides(tmp_path) if not x.startswith(("dataset.", "decode.", "on_long"))]
    run(compose_cfg(*toy, "task=synth", "task.n=24", "task.max_new_tokens=16", "task.batch_size=8"), tmp_path / "synth")
    for kind in ("distilled", "sd2"):
        run(compose_cfg(*toy, "task=distill", f"task.kind={kind}", f"task.data={tmp_path / 'synth'}", "task.val_n=4",
                        "task.max_steps=4", "task.batch_size=4"), tmp_path / kind)
    drafters = [f"paths.drafters.distilled={tmp_path / 'distilled'}", f"paths.drafters.sd2={tmp_path / 'sd2'}"]
    sweep = tmp_path / "sweep"
    t1 = run_experiment("sd2_table1", tmp_path, sweep, *drafters)
    t5 = run_experiment("sd2_table5", tmp_path, sweep, *drafters)
    assert len(t1) == 36 and len(t5) == 12  # UltraChat (hub only) left out
    assert {(s["method"], s["dataset"], s["config"]["decode"]["seed"]) for s in t1} == \
        set(product(["vanilla", "distilled", "sd2"], SD2_DATASETS[1:], [0, 1, 2]))
    assert all(s["config"]["method"]["gamma"] == 8 for s in t1 + t5)
    assert {s["config"]["method"].get("drafter") for s in t5} == {None, str(tmp_path / "distilled"), str(tmp_path / "sd2")}
    t = rebuilt(sweep, "sd2_table1", "sd2_table5", "sd2_table3")
    for name in ("sd2_table1", "sd2_table5"):
        assert [r for _, r in t[name].values.index] == ["Pretrained", "Distilled", "SD²"] and filled(t[name]), \
            t[name].markdown()
    # Welch's t over the 3 seeds: empty where a toy run's τ did not vary across seeds (t undefined)
    assert [r for _, r in t["sd2_table3"].values.index] == ["Distilled", "SD²"]
    assert (t["sd2_table3"].cells != "").any().any()
