"""`python -m specbench.bench gpu`: its CI form (--quick --device cpu) runs every section and writes the report as it
goes; a run cut short keeps what it measured; no GPU gives a clear error; the per-token α estimate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from specbench.bench import cli, gpu
from specbench.bench.engine import per_token
from specbench.common.files import ROOT
from specbench.decoding.method import IterationRecord


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
    assert report.count("Token ids identical to transformers' for every engine and prompt.") == len(gpu.PAIRS)
    for heading in ("- machine: CPU", "- torch ", "## Test lane", "## Goals", "| target tree 32 |"):
        assert heading in report, heading
    figures = [json.loads(line) for line in (out / "figures.jsonl").read_text().splitlines()]
    lane = next(f for f in figures if f["what"] == "lane")
    assert lane["exit"] == 0 and lane["counts"]["passed"] > 0 and "failed" not in lane["counts"]
    for pair in gpu.PAIRS:
        mine = {f["what"]: f for f in figures if f.get("pair") == pair}
        assert set(mine) == {"build", "calls", "engines", "batch"}
        assert abs(mine["build"]["alpha"] - 0.88) <= 0.03  # the configs' pair.acceptance, calibrated
        assert 0 < mine["engines"]["acceptance"] < mine["engines"]["alpha"] < 1
        rows = mine["batch"]["rows"]
        assert {(r["B"], r["method"]) for r in rows} == {(1, "ar"), (1, "vanilla"), (1, "spec_tree"), (1, "dyn_tree"),
                                                         (4, "ar"), (4, "vanilla")}
        assert all(r["speedup_vs_ar"] == pytest.approx(1.0) for r in rows if r["method"] == "ar")
        assert all(r["tokens_per_s"] > 0 for r in rows)


def test_a_run_cut_short_keeps_what_it_measured(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(gpu, "batch_figures", fail)
    with pytest.raises(RuntimeError, match="out of memory"):
        cli.main(["gpu", "--quick", "--device", "cpu", "--no-lane", "--out", str(tmp_path), "--pairs",
                  "llama31_8b_1b_shaped"])
    report = (tmp_path / "report.md").read_text()
    assert "| target 1 |" in report and "| vanilla eager |" in report  # the sections measured before the failure
    assert [json.loads(x)["what"] for x in (tmp_path / "figures.jsonl").read_text().splitlines()] == \
        ["build", "calls", "engines"]


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
