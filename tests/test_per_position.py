"""Acceptance per draft position in the report (tables per_position and accepted_length, the figure), by hand from
constructed call_stats; zeros of positions verified and never accepted are kept."""

from __future__ import annotations

import pytest

from helpers import add_fields, write_run
from specbench.analysis import load, report, selection
from specbench.analysis.figures import plot_positions
from specbench.common.aggregate import positions
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
    runs = load.load_runs(tmp_path / "res").assign(label=lambda r: selection.labels(r))
    path = plot_positions(runs, tmp_path / "figs", "p · gsm8k · greedy", "p__gsm8k")
    assert path.name == "fig_per_position__p__gsm8k.png" and path.stat().st_size > 1000
    assert plot_positions(runs[runs["method"] == "ar"], tmp_path / "figs", "t", "none") is None


def test_the_summary_carries_positions_overall_and_per_category(tmp_path):
    """A traced vanilla run on Spec-Bench-format rows (categories): summary.json's accepted_length_hist and
    reach_by_depth equal the histogram counted from the traces' iterations (each generation's first left out), also
    per category."""
    import json
    from collections import Counter

    import pandas as pd

    from helpers import SYNTHETIC, small
    from specbench.runs.runner import run
    from specbench.runs.traces import read_traces

    s = run(small("dataset=spec_bench", f"dataset.data_dir={SYNTHETIC}", "method=vanilla", "method.gamma=3",
                  "decode.max_new_tokens=12", "trace=true"), tmp_path)
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "rows.jsonl").read_text().splitlines())}
    t = read_traces(tmp_path)
    t = t[t["iteration"] > 0]  # call_stats leave each generation's first iteration out (one turn per trace here)
    multi = {i for i, r in rows.items() if r.get("turn_outputs")}

    def hist(frame: pd.DataFrame) -> list[float]:
        drafting = frame[frame["drafted"] > 0]
        n = Counter(drafting["accepted"])
        return [n.get(k, 0) / len(drafting) for k in range(int(drafting["drafted"].max()) + 1)]

    single = t[~t["id"].isin(multi)]  # a multi-turn trace holds its turns' first iterations: left out here
    assert multi and len(single)  # the test holds both kinds
    cats = {}
    for cat in sorted({rows[i]["category"] for i in single["id"]}):
        ids = [i for i, r in rows.items() if r["category"] == cat]
        if not set(ids) & multi:
            cats[cat] = hist(single[single["id"].isin(ids)])
    assert cats  # some category without multi-turn rows
    for cat, want in cats.items():
        got = s["positions_by_category"][cat]["hist"]
        assert got[: len(want)] == pytest.approx(want) and sum(got) == pytest.approx(1.0)
    assert sum(s["accepted_length_hist"]) == pytest.approx(1.0)
    at_least = [sum(s["accepted_length_hist"][i:]) for i in range(1, len(s["accepted_length_hist"]))]
    assert s["reach_by_depth"] == pytest.approx(at_least)


def test_runs_the_config_does_not_tell_apart_get_a_row_each(tmp_path):
    """Two SPEED-Bench buckets (runs differing only in dataset.config, which never names a run) keep a row each in
    the per-position, histogram and per-category tables, named by their folders as in the overview, each compared with
    its own bucket's ar."""
    import json

    def bucket(folder: str, method: str, seconds: float, config: str, **kw) -> None:
        rows = [{"new": 9, "s": seconds, "calls": 5, "drafted": 12, "accepted": 4, "k": 4, "category": "mixed"}
                if method == "vanilla" else {"new": 9, "s": seconds, "category": "mixed"}]
        run = write_run(tmp_path / "res", folder, method, rows, dataset="speed_bench", **kw)
        for name in ("config.json", "summary.json"):
            data = json.loads((run / name).read_text())
            data["config"]["dataset"]["config"] = config
            (run / name).write_text(json.dumps(data))
        if method == "vanilla":
            add_fields(run, {}, [{"call_stats": STATS, "call_seconds": SECONDS}])

    bucket("1k/v", "vanilla", 1.0, "throughput_1k", gamma=3)
    bucket("2k/v", "vanilla", 1.0, "throughput_2k", gamma=3)
    bucket("1k/ar", "ar", 2.0, "throughput_1k")
    bucket("2k/ar", "ar", 4.0, "throughput_2k")
    rep = report.build_report(load.load_runs(tmp_path / "res"))
    tables = {t.name: t for t in rep.tables}
    for name in ("per_position", "accepted_length"):
        labels = [r for _, r in tables[name].values.index]
        assert labels == ["vanilla [1k/v]", "vanilla [2k/v]"], (name, labels)
    cats = tables["categories"].values.droplevel(0)
    assert sorted(cats.index) == ["ar [1k/ar] · mixed", "ar [2k/ar] · mixed", "vanilla [1k/v] · mixed",
                                  "vanilla [2k/v] · mixed"]
    assert cats.loc["vanilla [1k/v] · mixed", ("", "speedup vs ar")] == pytest.approx(2.0)
    assert cats.loc["vanilla [2k/v] · mixed", ("", "speedup vs ar")] == pytest.approx(4.0)
