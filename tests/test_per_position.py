"""Acceptance per draft position in the report (tables per_position and accepted_length, the figure), by hand from
constructed call_stats; zeros of positions verified and never accepted are kept."""

from __future__ import annotations

import pytest

from helpers import add_fields, write_run
from specbench.analysis import load, report
from specbench.analysis.figures import plot_positions
from specbench.analysis.per_position import positions
from specbench.decoding.speedup import alphas

# first iterations left out; 4 drafting iterations of w = 3 accepting 3, 1, 0, 0 and one iteration drafting nothing:
# reached [4, 2, 1], accepted [2, 1, 1]: alpha 2/4, 1/2, 1/1; P(>= i) 2/4, 1/4, 1/4; h(0..3) 2/4, 1/4, 0, 1/4
STATS = {"iterations": {"3": 4, "0": 1}, "depths": {"3": 4, "0": 1}, "reached": [4, 2, 1], "accepted": [2, 1, 1]}
SECONDS = {"verify_s": {"3": 1.0, "0": 0.1}, "draft_s": {"3": 0.4, "0": 0.0}}


def test_positions_by_hand():
    p = positions(STATS, alphas(STATS))
    assert p["alpha"] == pytest.approx([0.5, 0.5, 1.0])
    assert p["at_least"] == pytest.approx([0.5, 0.25, 0.25])
    assert p["hist"] == pytest.approx([0.5, 0.25, 0.0, 0.25]) and sum(p["hist"]) == pytest.approx(1.0)
    no = {"iterations": {"2": 3}, "reached": [3], "accepted": []}  # position 1 verified, never accepted
    never = positions(no, alphas(no))
    assert never == {"alpha": [0.0], "at_least": [0.0], "hist": [1.0, 0.0]}
    assert positions({"iterations": {"0": 5}, "reached": [], "accepted": []}, []) == {}  # ar: nothing drafted


def test_the_report_tables_and_figure(tmp_path):
    run = write_run(tmp_path / "res", "v", "vanilla", [{"new": 9, "s": 1.0, "calls": 5, "drafted": 12, "accepted": 4,
                                                        "k": 4}], gamma=3)
    add_fields(run, {}, [{"call_stats": STATS, "call_seconds": SECONDS}])
    write_run(tmp_path / "res", "ar", "ar", [{"new": 9, "s": 2.0}])
    rep = report.build_report(load.load_runs(tmp_path / "res"))
    tables = {t.name: t for t in rep.tables}
    row = tables["per_position"].values.loc[("p · gsm8k", "vanilla")].droplevel(0)
    assert list(row.index) == ["α_1", "α_2", "α_3", "P(≥1)", "P(≥2)", "P(≥3)"]
    assert list(row) == pytest.approx([0.5, 0.5, 1.0, 0.5, 0.25, 0.25])
    hist = tables["accepted_length"].values.loc[("p · gsm8k", "vanilla")].droplevel(0)
    assert list(hist) == pytest.approx([0.5, 0.25, 0.0, 0.25])
    assert ("p · gsm8k", "ar") not in tables["per_position"].values.index  # ar drafted nothing
    runs = load.load_runs(tmp_path / "res").assign(label=lambda r: load.labels(r))
    path = plot_positions(runs, tmp_path / "figs", "p · gsm8k · greedy", "p__gsm8k")
    assert path.name == "fig_per_position__p__gsm8k.png" and path.stat().st_size > 1000
    assert plot_positions(runs[runs["method"] == "ar"], tmp_path / "figs", "t", "none") is None
