"""specbench.analysis.figures: the per-draft and per-position numbers behind the figures, worked by hand, and one
valid, non-trivial PNG per figure type from real traced tiny_random runs."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest

from specbench.analysis import figures
from specbench.analysis import load
from specbench.analysis.selection import ReportError
from helpers import at_batch_size, small, write_run

PNG = b"\x89PNG\r\n\x1a\n"


def check_png(path: Path) -> None:
    """A PNG file (signature), decodable, at least 300x200 pixels, more than 8 KB (not a blank canvas)."""
    data = path.read_bytes()
    assert data[:8] == PNG, path
    h, w = matplotlib.image.imread(path).shape[:2]
    assert w >= 300 and h >= 200, (path, w, h)
    assert len(data) > 8_000, (path, len(data))


def trace(rows: list[tuple[int, int, list[float] | None]]) -> pd.DataFrame:
    """Iterations (drafted, accepted, js) of one example of one run."""
    return pd.DataFrame([{"run_dir": "r", "label": "m", "pair": "p", "dataset": "d", "method": "m", "id": "e",
                          "iteration": i, "drafted": w, "accepted": n, "js": js,
                          "entropy": None if js is None else [10 * x for x in js]}
                         for i, (w, n, js) in enumerate(rows)])


def test_token_stats_by_hand():
    t = trace([(4, 2, [0.1, 0.2, 0.3, 0.4]), (2, 2, [0.5, 0.6]), (0, 0, None)])
    s = figures.token_stats(t)
    # iteration 0: drafts 1-2 accepted, draft 3 the first rejection, draft 4 never judged; iteration 1: both accepted
    assert s["js"].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.5, 0.6])
    assert s["accepted"].tolist() == [True, True, False, True, True]
    assert s["entropy"].tolist() == pytest.approx([1.0, 2.0, 3.0, 5.0, 6.0])


def test_accepted_by_position_by_hand():
    # blocks commit accepted + 1 tokens: last-token positions 3, 5, 6, 9 (0-based); bins of 4 around x = 2, 6, 10
    t = trace([(4, 3, None), (2, 1, None), (1, 0, None), (3, 2, None)])
    d = figures.accepted_by_position(t, half_width=2)
    assert d["x"].tolist() == [2, 6, 10]
    assert d["mean_accepted"].tolist() == pytest.approx([3.0, 0.5, 2.0])
    assert d["blocks"].tolist() == [1, 2, 1]


def test_every_figure_is_a_png(tmp_path):
    from specbench.runs.runner import run

    for m in ("adasd", "gammatune"):
        run(small(f"method={m}", "limit=2", "decode.max_new_tokens=24", "trace=true", "threads=1"),
            tmp_path / "res" / m)
    # GammaTune Figure 1 needs per-task rows over an initial-γ grid (written by hand: Spec-Bench is not offline here)
    for g in (2, 4):
        for m in ("vanilla", "gammatune"):
            write_run(tmp_path / "tasks", f"{m}{g}", m, [
                {"new": 10 * g, "s": 1.0, "category": "writing"}, {"new": 12 * g, "s": 2.0, "category": "math"}],
                dataset="spec_bench", gamma=g)
    runs = load.load_runs(tmp_path / "res", tmp_path / "tasks")
    paths = figures.make_figures(runs, tmp_path / "fig")
    kinds = {p.name.split("__")[0] for p in paths}
    assert kinds == {"fig_accept_hist", "fig_position", "fig_thresholds", "fig_gamma", "fig_token_means",
                     "fig_js_hist", "fig_task_throughput", "fig_per_position"}
    for p in paths:
        check_png(p)
    assert (tmp_path / "fig" / "fig_thresholds__tiny_random__smoke__adasd.png") in paths
    # task throughput numbers: vanilla writing 20, 40 tok/s over γ = 2, 4 -> mean 30 ± 10 (ddof 0)
    from specbench.analysis.gammatune_tables import task_throughput

    data = task_throughput(runs, load.load_examples(runs))
    w = data[(data["row"] == "SpecDecode") & (data["task"] == "writing")].iloc[0]
    assert (w["mean"], w["std"], w["n"]) == (pytest.approx(30.0), pytest.approx(10.0), 2)
    traces = load.load_traces(runs)
    with pytest.raises(ReportError, match="no t_g / t_v"):
        figures.plot_thresholds(traces[traces["method"] == "gammatune"].drop(columns=["t_g", "t_v"]), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_labels_leave_out_runtime_keys_and_no_traces_is_said(tmp_path, caplog):
    write_run(tmp_path, "a", "vanilla", [{"new": 5, "s": 1.0}], gamma=5)
    b = write_run(tmp_path, "b", "vanilla", [{"new": 5, "s": 1.0}], gamma=8)
    record = json.loads((b / "config.json").read_text())
    record["config"].update(threads=2, trace=True, limit=3)  # runtime keys: never part of a label
    (b / "config.json").write_text(json.dumps(record))
    runs = load.load_runs(tmp_path)
    assert sorted(runs["label"]) == ["vanilla gamma=5", "vanilla gamma=8"]
    assert figures.make_figures(runs, tmp_path / "fig") == []
    assert figures.NO_TRACES in caplog.text


def test_speedup_against_batch_size(tmp_path, monkeypatch, caplog):
    """Real runs at batch size 1 and copies at 2 and 4 with other throughputs; a vanilla at 8 has no ar run there.
    The figure plots tokens_per_s(method, B) / tokens_per_s(ar, B) from the summaries, never across batch sizes."""
    from specbench.runs.runner import run

    res = tmp_path / "res"
    for m in ("ar", "vanilla", "gammatune"):
        run(small(f"method={m}", "limit=2", "decode.max_new_tokens=8", "threads=1"), res / m / "b1")
    speed = {("ar", 2): 1.5, ("vanilla", 2): 1.2, ("gammatune", 2): 2.0, ("ar", 4): 3.0, ("vanilla", 4): 2.0,
             ("gammatune", 4): 2.5, ("vanilla", 8): 9.0}
    for (m, b), x in speed.items():
        at_batch_size(res / m / "b1", b, res / m / f"b{b}", x)
    tps = {(m, int(d.name[1:])): json.loads((d / "summary.json").read_text())["tokens_per_s"]
           for m in ("ar", "vanilla", "gammatune") for d in (res / m).iterdir()}
    drawn = []

    def plot(data, path, title=None):
        drawn.append((data, path, title))
        return plot_batch_speedup(data, path, title)

    plot_batch_speedup = figures.plot_batch_speedup
    monkeypatch.setattr(figures, "plot_batch_speedup", plot)
    caplog.set_level("INFO")
    paths = figures.make_figures(load.load_runs(res), tmp_path / "fig")
    (data, path, title), = drawn
    assert path == tmp_path / "fig" / "fig_batch_speedup__tiny_random__smoke.png" and path in paths
    assert title == "tiny_random · smoke · greedy"
    check_png(path)
    got = {(r.label, r.batch_size): r.speedup for r in data.itertuples()}
    assert got == pytest.approx({(m, b): tps[(m, b)] / tps[("ar", b)] for m in ("vanilla", "gammatune") for b in (1, 2, 4)})
    assert "vanilla at batch_size=8 left out" in caplog.text  # no ar at 8: not divided by another batch size's ar
    # ar at one batch size only: no figure, a log line
    caplog.clear()
    runs = load.load_runs(res)
    figures.make_figures(runs[(runs["method"] != "ar") | (runs["batch_size"] == 1)], tmp_path / "fig1")
    assert len(drawn) == 1 and "no batch-size figure for tiny_random · smoke" in caplog.text
