"""`python -m specbench.bench gpu`: its CI form (--quick --device cpu) runs every section and writes the report as it
goes; a run cut short keeps what it measured; no GPU gives a clear error; the per-token α estimate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from specbench.bench import cli, gpu, gpu_sections
from specbench.bench.schedule import Budget, Model, OutOfTime, Pace
from specbench.bench.engine import per_token
from specbench.common.files import ROOT
from specbench.decoding.records import IterationRecord


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One quick run on the CPU, as CI runs it: its folder and exit status."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("gpu_quick")
    return out, cli.main(["gpu", "--quick", "--device", "cpu", "--out", str(out)])


def test_the_quick_run_writes_every_section(quick):
    out, status = quick
    assert status == 0
    report = (out / "report.md").read_text()
    for pair in gpu.PAIRS:
        assert f"## {pair}" in report
        for png in (f"{pair}_throughput.png", f"{pair}_calls.png"):
            assert (out / png).stat().st_size > 1000 and f"![{png}]({png})" in report
    assert report.count("Token ids identical to transformers' for every engine and prompt (vanilla against assisted "
                        "generation, ar against greedy generation).") == len(gpu.PAIRS)
    for heading in ("- machine: CPU", "- torch ", "## Test lane", "## Goals", "## Schedule", "Trees at B = 1",
                    "| B | target 1 tok/row |"):
        assert heading in report, heading
    figures = [json.loads(line) for line in (out / "figures.jsonl").read_text().splitlines()]
    lane = next(f for f in figures if f["what"] == "lane")
    assert lane["exit"] == 0 and lane["counts"]["passed"] > 0 and "failed" not in lane["counts"]
    schedule = next(f for f in figures if f["what"] == "schedule")["rows"]
    assert [r[1] for r in schedule] == ["build", "engines", "lane", "costs", "batch", "trees", "split"] * 1 + \
        ["build", "engines", "costs", "batch", "trees", "split"] and all(r[4] == "done" for r in schedule)
    for pair in gpu.PAIRS:
        mine = {f["what"]: f for f in figures if f.get("pair") == pair}
        assert set(mine) == {"build", "engines", "profile", "bandwidth", "batch", "trees", "split"}
        split = mine["split"]  # the target over the CPU and disk offload: the same tokens as on one device
        assert split["differ"] == [] and set(split["placement"]) == {"cpu", "disk"}, split
        assert set(split["tps"]) == {"ar eager", "vanilla eager"}
        bw = mine["bandwidth"]
        assert "by a copy probe" in bw["source"] and bw["bandwidth"] > 0 and f"![{pair}_eager_bandwidth.png]" in report
        assert (out / f"{pair}_eager_bandwidth.png").stat().st_size > 1000
        assert abs(mine["build"]["alpha"] - 0.88) <= 0.03  # the configs' pair.acceptance, calibrated
        assert 0 < mine["engines"]["acceptance"] < mine["engines"]["alpha"] < 1
        measured, textbook, predicted = mine["engines"]["speedups"]["eager"]
        assert measured > 0 and textbook > 0 and predicted > 0
        rows = mine["batch"]["rows"] + mine["trees"]["rows"]
        assert {(r["B"], r["method"]) for r in mine["trees"]["rows"]} == \
            {(b, m) for b in (1, 4) for m in ("ar", "vanilla", "spec_tree", "dyn_tree")}  # trees beside a chain
        assert all(r["speedup_vs_ar"] == pytest.approx(1.0) for r in rows if r["method"] == "ar")
        assert all(r["tokens_per_s"] > 0 for r in rows)
    profile = json.loads((out / "profile.json").read_text())
    assert profile["format"] == 1 and profile["command"].startswith("python -m specbench.bench gpu --quick")
    for pair in gpu.PAIRS:
        entries = {e["batch_size"]: e for e in profile["entries"] if e["pair"] == pair}
        assert set(entries) == {1, 4}
        for b, e in entries.items():
            assert e["path"] == "eager" and e["dtype"] == "float32" and e["device"].startswith("cpu")
            assert sorted(map(int, e["target_chain_s"])) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64]
            assert all(v > 0 for v in e["target_chain_s"].values()) and e["draft_token_s"] > 0
            assert sorted(map(int, e["target_tree_s"])) == ([16, 32, 64] if b == 1 else [])
            assert sorted(map(int, e.get("target_hidden_s", {}))) == ([1, 2, 4, 8, 16] if b == 1 else [])
            assert sorted(map(int, e.get("draft_tree_s", {}))) == ([1, 2, 3, 4, 6, 8, 16] if b == 1 else [])
            assert e.get("long_tokens") == (e["prompt_tokens"] + 256 if b == 1 else None)  # a longer cache's costs
            assert set(e.get("target_chain_long_s", {})) == (set(e["target_chain_s"]) if b == 1 else set())
            assert e["shapes"]["target"]["hidden_size"] == 64 and e["shapes"]["target"]["model_type"]
    check_bandwidth_rows(figures, profile)


def check_bandwidth_rows(figures: list[dict], profile: dict) -> None:
    """Each bandwidth row by hand from its profile entry: the target's bytes, 4 x (W + B n 2 g d (P + w) + B w V),
    W = n (2 h a d + 2 h g d + 3 h i) + V h from its recorded shapes, over the entry's seconds and the probe's rate."""
    for f in (f for f in figures if f["what"] == "bandwidth"):
        for B, w, ms, weights_gbs, kv_gbs, frac, bound in f["rows"]:
            e = next(e for e in profile["entries"] if e["pair"] == f["pair"] and e["batch_size"] == int(B))
            s, t, P, w = e["target_chain_s"][w], e["shapes"]["target"], e["prompt_tokens"], int(w)
            h, a, g, i, n, V = (t[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                               "intermediate_size", "num_hidden_layers", "vocab_size"))
            d = h // a
            W = n * (2 * h * a * d + 2 * h * g * d + 3 * h * i) + V * h
            kv = int(B) * n * 2 * g * d * (P + w) + int(B) * w * V
            assert weights_gbs == f"{4 * W / s / 1e9:.1f}" and kv_gbs == f"{4 * kv / s / 1e9:.2f}"
            assert frac == f"{4 * (W + kv) / s / f['bandwidth']:.1%}"
            assert bound == f"{4e3 * (W + kv) / f['bandwidth']:.3f}"


def test_a_section_that_fails_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    """batch_figures raising (an out-of-memory, say): batch and trees fail with the error in the report, exit 1, and
    everything measured before and after is kept."""
    def fail(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(gpu_sections, "batch_figures", fail)
    assert cli.main(["gpu", "--quick", "--device", "cpu", "--no-lane", "--out", str(tmp_path), "--pairs",
                     "llama31_8b_1b_shaped"]) == 1
    report = (tmp_path / "report.md").read_text()
    assert "| vanilla eager |" in report and "| B | target 1 tok/row |" in report  # measured before the failure
    assert "**llama31_8b_1b_shaped batch failed:** `RuntimeError: out of memory`" in report
    figures = [json.loads(x) for x in (tmp_path / "figures.jsonl").read_text().splitlines()]
    assert [f["what"] for f in figures] == ["build", "engines", "profile", "bandwidth", "failure", "failure",
                                            "split", "schedule"]  # the sections after the failures still run
    assert [(r[1], r[4]) for r in figures[-1]["rows"]][-3:] == [("batch", "failed: RuntimeError"),
                                                                ("trees", "failed: RuntimeError"), ("split", "done")]
    assert "## Goals" in report and json.loads((tmp_path / "profile.json").read_text())["entries"]


def test_sections_choose_what_runs_per_pair(tmp_path):
    """--sections PAIR:SECTION and SECTION: the first pair's compiled path alone, the second's engines and trees;
    the lane follows the first engines planned."""
    args = gpu.argparse.Namespace(pairs=["a", "b"], compile=True, lane=True,
                                  sections=["a:compiled", "engines", "b:trees"])
    assert gpu.plan(args) == [("a", "build"), ("a", "engines"), ("", "lane"), ("a", "compiled"), ("b", "build"),
                              ("b", "engines"), ("b", "trees")]
    args.sections = ["a:compiled"]
    assert gpu.plan(args) == [("a", "build"), ("a", "compiled"), ("b", "build"), ("", "lane")]
    args.sections = None
    assert [s for p, s in gpu.plan(args) if p == "b"] == list(gpu.SECTIONS)


@pytest.mark.parametrize("sections, says", [
    ("trees,nope", "--sections: unknown section 'nope' in 'nope'; valid: engines, costs, compiled, batch, trees"),
    ("build", "unknown section 'build'"),
    ("other:trees", "'other:trees' names pair 'other', which is not in --pairs (llama31_8b_1b_shaped)")])
def test_bad_sections_are_refused_before_anything_is_written(tmp_path, capsys, sections, says):
    assert cli.main(["gpu", "--quick", "--device", "cpu", "--pairs", "llama31_8b_1b_shaped", "--sections", sections,
                     "--out", str(tmp_path / "r")]) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_append_adds_sections_to_the_report(tmp_path):
    """--append keeps what an earlier call measured ('' pairs and --no-lane: the header and goals alone)."""
    args = ["gpu", "--quick", "--device", "cpu", "--no-lane", "--pairs", "", "--out", str(tmp_path)]
    assert cli.main(args) == 0 and cli.main([*args, "--append"]) == 0
    assert (tmp_path / "report.md").read_text().count("# specbench GPU characterisation") == 2
    assert cli.main(args) == 0  # without it the report starts anew
    assert (tmp_path / "report.md").read_text().count("# specbench GPU characterisation") == 1


def test_no_gpu_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    done = subprocess.run([sys.executable, "-m", "specbench.bench", "gpu", "--out", str(tmp_path / "r")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "torch sees no CUDA device" in done.stderr and "--quick --device cpu" in done.stderr
    assert not (tmp_path / "r").exists()  # nothing half-written


@pytest.mark.parametrize("pairs, says", [("nope", "--pairs 'nope'"), ("toy", "shrinks builder shaped_random pairs only"),
                                         ("tiny_cross", "shrinks builder shaped_random pairs only")])
def test_bad_pairs_are_refused_before_anything_is_written(tmp_path, capsys, pairs, says):
    assert cli.main(["gpu", "--quick", "--device", "cpu", "--pairs", pairs, "--out", str(tmp_path / "r")]) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv", [["gpu", "--out", "/tmp/x", "--max-new-tokens", "0"], ["gpu", "--out", "/tmp/x", "--gamma", "-1"],
                                  ["overhead", "--batch-sizes", "1,x"], ["overhead", "--repeats", "0"]])
def test_bad_numbers_are_argparse_errors_naming_the_option(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parser().parse_args(argv)
    assert e.value.code == 2 and f"argument {argv[-2]}" in capsys.readouterr().err


def test_per_token_acceptance_counts_one_rejection_per_iteration():
    """α = accepted / (accepted + rejected): 3 + 5 + 0 accepted, two iterations with a rejection -> 8 / 10."""
    records = [IterationRecord(drafted=5, accepted=a, stop="window", draft_s=0.0, verify_s=0.0) for a in (3, 5, 0)]
    assert per_token(records) == pytest.approx(0.8)
    assert per_token([]) == 0.0


def test_a_section_that_does_not_fit_is_skipped_with_its_reason(tmp_path, monkeypatch):
    """Estimates faked: costs would take 1e9 s of a 1-minute budget, so it is skipped and said so; the rest run."""
    monkeypatch.setattr(gpu, "estimate", lambda section, run, ctx: 1e9 if section == "costs" else 0.0)
    assert cli.main(["gpu", "--quick", "--device", "cpu", "--no-lane", "--budget", "1", "--out", str(tmp_path),
                     "--pairs", "llama31_8b_1b_shaped"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "Skipped llama31_8b_1b_shaped costs: estimated 1000000000 s at the measured pace" in report
    rows = next(json.loads(x) for x in (tmp_path / "figures.jsonl").read_text().splitlines()
                if json.loads(x)["what"] == "schedule")["rows"]
    assert [(r[1], r[4].split(":")[0]) for r in rows] == [("build", "done"), ("engines", "done"), ("costs", "skipped"),
                                                          ("batch", "done"), ("trees", "done"), ("split", "done")]
    assert not (tmp_path / "profile.json").exists()


def test_a_section_past_the_deadline_is_cut_and_the_run_goes_on(tmp_path, monkeypatch):
    def late(ctx, run):
        raise OutOfTime("the budget of 1.0 min ran out")

    monkeypatch.setitem(gpu.SECTION_RUN, "batch", late)
    assert cli.main(["gpu", "--quick", "--device", "cpu", "--no-lane", "--out", str(tmp_path), "--pairs",
                     "llama31_8b_1b_shaped"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "llama31_8b_1b_shaped batch cut short: the budget of 1.0 min ran out." in report
    assert "| llama31_8b_1b_shaped | trees |" in report  # the next section still ran


def test_budget_check_raises_once_the_deadline_passed():
    assert Budget(None).left() == float("inf")
    Budget(None).check()
    with pytest.raises(OutOfTime, match="budget of 0.0 min"):
        Budget(0.0, start=0.0).check()


def test_estimates_follow_the_cost_model():
    """T(n) = t1 + (n - 1) slope; a batch section at B = 1, 4 is ar and vanilla at each B plus a warm-up, times the
    overhead factor: checked against the formula written out."""
    pace = Pace("cpu", Model(0.01, 0.001), Model(0.002, 0.0), 1.0, tau=4.0)
    assert pace.target(1) == 0.01 and pace.target(6) == pytest.approx(0.015)
    n, g = 16, 5
    vanilla = n / 4.0 * (g * 0.002 + (0.01 + (6 - 1) * 0.001))
    assert pace.vanilla(1, g, n) == pytest.approx(vanilla)
    args = cli.parser().parse_args(["gpu", "--quick", "--out", "x", "--device", "cpu"])
    gpu.fill_defaults(args)
    run = gpu_sections.PairRun("llama31_8b_1b_shaped", gpu_sections.config("llama31_8b_1b_shaped", torch.device("cpu"),
                                                                           True), pair=object())
    ctx = gpu_sections.Ctx(None, args, torch.device("cpu"), Budget(None), {}, pace=pace)
    ar = lambda b: n * (0.01 + (b - 1) * 0.001)  # noqa: E731
    van = lambda b: n / 4.0 * (g * 0.002 + 0.01 + (b * 6 - 1) * 0.001)  # noqa: E731
    want = 1.3 * (ar(1) + van(1) + ar(1) + van(1) + ar(4) + van(4))
    assert gpu.estimate("batch", run, ctx) == pytest.approx(want)
    assert gpu.estimate("lane", None, ctx) == 30.0


def test_default_budget_fits_one_command():
    args = cli.parser().parse_args(["gpu", "--out", "x"])
    gpu.fill_defaults(args)
    assert args.budget == gpu_sections.DEFAULT_BUDGET < 10
    quick = cli.parser().parse_args(["gpu", "--quick", "--out", "x"])
    gpu.fill_defaults(quick)
    assert quick.budget == 0.0
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["gpu", "--out", "x", "--budget", "-1"])


def test_estimates_learn_the_runs_own_ratio():
    """After sections that took 2x, 4x and 3x their model's estimates, later ones are estimated at 3x (the median);
    the build and the lane (priors) are never corrected."""
    ctx = gpu_sections.Ctx(None, None, torch.device("cpu"), Budget(None), {})
    assert gpu.corrected(10.0, "batch", ctx) == 10.0 and gpu.corrected(None, "batch", ctx) is None
    ctx.ratios += [2.0, 4.0, 3.0]
    assert gpu.corrected(10.0, "batch", ctx) == pytest.approx(30.0)
    assert gpu.corrected(10.0, "build", ctx) == gpu.corrected(10.0, "lane", ctx) == 10.0


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_the_lanes_outcomes_are_read_off_pytests_lines_with_or_without_workers(tmp_path, workers):
    """lane_outcomes on a real pytest -v run of a file with known outcomes (2 passed, 1 failed, 1 skipped, 1 error
    at set-up), in one process and under xdist's worker lines (the GPU lane runs with workers)."""
    (tmp_path / "test_known.py").write_text(
        "import pytest\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('set-up')\n"
        "def test_a():\n    assert True\n"
        "def test_b():\n    assert True\n"
        "def test_c():\n    assert 1 == 2\n"
        "def test_d():\n    pytest.skip('no')\n"
        "def test_e(broken):\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-rN", "-v", "-p", "no:cacheprovider", *workers,
                          "test_known.py"], cwd=tmp_path, capture_output=True, text=True).stdout
    counts, failed = gpu_sections.lane_outcomes(out)
    assert counts == {"passed": 2, "failed": 1, "skipped": 1, "error": 1}
    assert sorted(failed) == ["test_known.py::test_c", "test_known.py::test_e"]


def test_transformers_compiled_generation_decodes_its_eager_tokens():
    """The yardstick of the compiled path (run_theirs with a static cache, which transformers compiles on a GPU):
    greedy and assisted, the same new tokens as transformers' own greedy generate with its dynamic cache."""
    from helpers import SAME_VOCAB, compose_cfg
    from specbench.bench.common import run_theirs
    from specbench.common.configs import plain
    from specbench.models.pairs import load_pair

    tiny_pair = load_pair(plain(compose_cfg(*SAME_VOCAB).pair), torch.device("cpu"))
    prompt = [1, 5, 2, 9, 4]
    with torch.no_grad():
        want = tiny_pair.target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                                         do_sample=False, max_new_tokens=12,
                                         pad_token_id=tiny_pair.tokenizer.pad_token_id)[0, 5:].tolist()
    for assisted in (False, True):
        got, seconds, calls = run_theirs(tiny_pair, prompt, 12, assisted=assisted, static=True)
        assert got == want and seconds > 0 and calls[0] > 0 and (calls[1] > 0) == assisted


def test_a_compiled_generation_transformers_cannot_run_is_left_out(monkeypatch):
    """warm_theirs: a static-cache generation that raises (an older transformers) is dropped from the comparison,
    the others kept; an eager one that raises is an error."""
    from specbench.bench import engine

    def theirs(pair, ids, max_new, assisted=True, static=False):
        if static and assisted:
            raise ValueError("assisted generation does not support a static cache")
        return [1], 0.1, [1, 0]

    monkeypatch.setattr(engine, "run_theirs", theirs)
    assert list(engine.warm_theirs(None, [1], 4, dict(engine.THEIRS))) == [
        "transformers", "transformers greedy", "transformers compiled greedy"]
    monkeypatch.setattr(engine, "run_theirs", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    with pytest.raises(RuntimeError, match="no"):
        engine.warm_theirs(None, [1], 4, {"transformers": (True, False)})
