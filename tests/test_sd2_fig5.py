"""SD² Figure 5 (`--table sd2_fig5`): τ per pair, method and temperature, averaged over datasets and seeds, checked
by hand on hand-written run folders (no decoding); missing and ambiguous cells; the grouped bars; the CLI; and the
Spec-Bench leaderboard's rows for the head methods."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from helpers import write_run
from specbench.analysis import catalog, figures, load, report, sd2_fig5, selection
from specbench.analysis.selection import ReportError
from specbench.analysis.spec_bench_table import spec_bench_table

PNG = b"\x89PNG\r\n\x1a\n"
METHODS = {"eagle3": "EAGLE-3*", "vanilla": "Pretrained", "distilled": "Distilled", "sd2": "SD²"}
DATASETS = ["gsm8k", "humaneval"]


def tau(pair: str, method: str, temperature: float, dataset: str) -> float:
    """The τ of each run: distinct per pair, method, temperature and dataset."""
    return ({"p": 2.0, "q": 3.0}[pair] + list(METHODS).index(method) + 0.5 * temperature
            + 0.25 * DATASETS.index(dataset))


def fig5_run(root: Path, pair: str, method: str, temperature: float, dataset: str, value: float, seed: int = 0,
             **options) -> Path:
    """A run of one 10-target-call example taking 1 s: τ = value (new tokens / target calls)."""
    folder = f"{pair}/{dataset}/{method}/T{temperature:g}/s{seed}" + "".join(f"_{k}{v}" for k, v in options.items())
    opts = {"gamma": 8, **options}
    return write_run(root, folder, method, [{"new": 10 * value, "s": 1.0, "calls": 10}], pair=pair, dataset=dataset,
                     temperature=temperature, seed=seed, **opts)


@pytest.fixture(scope="module")
def fig5_dir(tmp_path_factory) -> Path:
    """2 pairs x 4 methods x 2 temperatures x 2 datasets, plus a second seed of p's sd2 at T = 1 on gsm8k (τ + 1)."""
    root = tmp_path_factory.mktemp("fig5")
    for pair in ("p", "q"):
        for method in METHODS:
            for t in (0.0, 1.0):
                for d in DATASETS:
                    fig5_run(root, pair, method, t, d, tau(pair, method, t, d))
    fig5_run(root, "p", "sd2", 1.0, "gsm8k", tau("p", "sd2", 1.0, "gsm8k") + 1.0, seed=1)
    return root


@pytest.fixture(scope="module")
def fig5_runs(fig5_dir) -> pd.DataFrame:
    return load.load_runs(fig5_dir)


def test_the_cells_are_the_mean_over_datasets_of_the_mean_over_seeds(fig5_runs):
    (t,) = catalog.build("sd2_fig5", fig5_runs)
    v = t.values
    assert t.name == "sd2_fig5" and list(v.index) == [("", "p"), ("", "q")]
    assert list(v.columns) == [(m, c) for m in METHODS.values() for c in ("T = 0", "T = 1")]
    for pair in ("p", "q"):
        for method, label in METHODS.items():
            for col, temp in (("T = 0", 0.0), ("T = 1", 1.0)):
                want = sum(tau(pair, method, temp, d) for d in DATASETS) / 2
                if (pair, method, temp) == ("p", "sd2", 1.0):
                    want += 0.5 / 2  # gsm8k: seeds 0 and 1 (τ and τ + 1) average to τ + 0.5
                assert v.loc[("", pair), (label, col)] == pytest.approx(want), (pair, method, col)
    # written out: p's EAGLE-3* at T = 0: (2.0 + 2.25) / 2; q's SD² at T = 1: (3 + 3 + 0.5 + 3.5 + 0.25) / 2
    assert v.loc[("", "p"), ("EAGLE-3*", "T = 0")] == pytest.approx(2.125)
    assert v.loc[("", "q"), ("SD²", "T = 1")] == pytest.approx(6.625)
    assert t.cells.loc[("", "p"), ("SD²", "T = 1")] == f"{(5.5 + 5.75 + 0.5) / 2:.2f}"
    assert "| pair | EAGLE-3* T = 0 | EAGLE-3* T = 1 | Pretrained T = 0 |" in t.markdown()


def test_missing_runs_leave_empty_cells_and_duplicates_are_refused(fig5_runs, fig5_dir, tmp_path, caplog):
    q = fig5_runs["pair"] == "q"
    method, temp = fig5_runs["method"], fig5_runs["temperature"]
    gone = (q & (method == "eagle3") & (temp == 0.0)) | (
        q & (method == "distilled") & (temp == 1.0) & (fig5_runs["dataset"] == "gsm8k"))
    (t,) = sd2_fig5.sd2_fig5_table(fig5_runs[~gone])
    assert math.isnan(t.values.loc[("", "q"), ("EAGLE-3*", "T = 0")])
    assert t.cells.loc[("", "q"), ("EAGLE-3*", "T = 0")] == ""
    # a method lacking one of the pair's datasets: empty too (not a mean over other datasets), and logged
    assert math.isnan(t.values.loc[("", "q"), ("Distilled", "T = 1")])
    assert "Distilled on q at T=1 has no run on gsm8k" in caplog.text
    assert t.values.loc[("", "p")].notna().all() and t.values.loc[("", "q")].notna().sum() == 6
    # Pretrained alone, or no run: no table; runs at another temperature are not in it
    assert sd2_fig5.sd2_fig5_table(fig5_runs[fig5_runs["method"] == "vanilla"]) == []
    assert sd2_fig5.sd2_fig5_table(fig5_runs[fig5_runs["temperature"] == 0.5]) == []
    # two runs fit one cell (another head, same seed): refused naming the key they differ in, a note in the report
    extra = fig5_run(tmp_path, "p", "eagle3", 0.0, "gsm8k", 9.0, head="other")
    both = pd.concat([fig5_runs, load.load_runs(extra)], ignore_index=True)
    with pytest.raises(ReportError, match=r"sd2_fig5: 2 runs fit EAGLE-3\* \(eagle3\) with seed 0 on p/gsm8k"
                                          r".*differ in method\.head"):
        sd2_fig5.sd2_fig5_table(both)
    rep = report.build_report(both, ["sd2_fig5"])
    assert not [x for x in rep.tables if x.name.startswith("sd2_fig5")] and rep.left_out == 1
    assert any("sd2_fig5 [greedy, t1]: left out: sd2_fig5: 2 runs fit" in n for n in rep.notes)


def test_the_report_builds_it_across_the_temperature_groups(fig5_runs):
    assert [g.title for g in selection.groups(fig5_runs)] == ["t1", "greedy"]  # per group, one temperature each
    rep = report.build_report(fig5_runs, ["sd2_fig5"])
    (t,) = [x for x in rep.tables if x.name.startswith("sd2_fig5")]
    assert t.name == "sd2_fig5" and t.values.notna().all().all()
    assert [x.name for x in rep.tables].count("overview__t1") == 1  # the groups' overviews are still there


def test_the_bars_two_groups_of_eight(fig5_runs, tmp_path):
    (t,) = catalog.build("sd2_fig5", fig5_runs)
    bars = figures.sd2_fig5_bars(t.values)
    assert len(bars) == 16 and list(bars["method"][:8]) == [m for m in METHODS.values() for _ in (0, 1)]
    assert list(bars["temperature"][:2]) == ["T = 1", "T = 0"] and list(bars["hatch"][:2]) == ["", "//"]
    assert (bars["x"][:8] < 0.5).all() and (bars["x"][8:] > 0.5).all()  # pair p's group around 0, q's around 1
    fig, (ax,) = figures._figure()
    figures.draw_sd2_fig5(ax, t.values)
    patches = ax.patches
    assert len(patches) == 16 and sum(p.get_hatch() == "//" for p in patches) == 8
    heights = sorted(round(p.get_height(), 6) for p in patches)
    assert heights == sorted(round(x, 6) for x in t.values.to_numpy().ravel())
    assert [x.get_text() for x in ax.get_xticklabels()] == ["p", "q"]
    # a cell without a number draws no bar
    v = t.values.copy()
    v.loc[("", "q"), ("EAGLE-3*", "T = 0")] = float("nan")
    fig, (ax,) = figures._figure()
    figures.draw_sd2_fig5(ax, v)
    assert len(ax.patches) == 15
    path = figures.plot_sd2_fig5(t.values, tmp_path / "fig.png", t.title)
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 8_000


def test_the_cli_writes_the_table_and_the_figure(fig5_dir, tmp_path):
    out = tmp_path / "out"
    assert report.main([str(fig5_dir), "--table", "sd2_fig5", "--out", str(out), "--format", "csv", "--strict"]) == 0
    assert (out / "sd2_fig5.csv").exists()
    back = pd.read_csv(out / "sd2_fig5.csv").set_index("pair")
    assert back.loc["p", "EAGLE-3* T = 0"] == pytest.approx(2.125)
    png = (out / "fig_sd2_fig5.png").read_bytes()
    assert png[:8] == PNG and len(png) > 8_000


def spec_run(root: Path, folder: str, method: str, seconds: float, **options) -> Path:
    """A spec_bench run of two rows (mt_bench, qa) of 20 tokens in `seconds` each, 10 target calls each."""
    rows = [{"new": 20, "s": seconds, "calls": 10, "task": t} for t in ("mt_bench", "qa")]
    return write_run(root, folder, method, rows, dataset="spec_bench", **options)


def test_the_spec_bench_table_has_rows_for_the_head_methods(tmp_path):
    spec_run(tmp_path, "ar", "ar", 2.0)
    spec_run(tmp_path, "vanilla", "vanilla", 1.0, gamma=5)
    spec_run(tmp_path, "eagle3", "eagle3", 0.5)
    spec_run(tmp_path, "eagle3_tree", "eagle3_tree", 0.4)
    spec_run(tmp_path, "medusa", "medusa", 0.8)
    spec_run(tmp_path, "dyn_tree", "dyn_tree", 0.9)
    (t,) = spec_bench_table(load.load_runs(tmp_path))
    rows = [r for _, r in t.values.index]
    assert rows == ["ar", "EAGLE-3 (tree)", "EAGLE-3", "Medusa", "dyn_tree", "vanilla"]  # ar, then by Overall
    assert t.values.loc[("p", "EAGLE-3"), ("Overall", "")] == pytest.approx(4.0)
    assert t.cells.loc[("p", "EAGLE-3 (tree)"), ("Overall", "")].startswith("5.00x [")
    # two eagle3 runs with other heads: each a row, told apart by the option
    spec_run(tmp_path, "eagle3_b", "eagle3", 1.0, head="b")
    (t,) = spec_bench_table(load.load_runs(tmp_path))
    assert {r for _, r in t.values.index if r.startswith("EAGLE-3 head")} == {"EAGLE-3 head=None", "EAGLE-3 head=b"}
