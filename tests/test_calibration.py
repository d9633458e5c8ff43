"""The target_1 calibration: repeated passes, their median and range, the load recorded; the predicted speedup
printed with the range the passes give it (linear in target_1) and said to be a model, not a measurement."""

import logging
import statistics

import pytest

import specbench.runs.runner as runner
from helpers import small
from specbench.runs import calibration, measurements


def test_the_calibration_is_the_median_of_its_passes_and_the_prediction_carries_their_range(tmp_path, caplog,
                                                                                         monkeypatch):
    medians = []
    real = calibration.median

    def recording(values):  # each pass's median, then the median of the passes
        medians.append(list(values))
        return real(values)

    monkeypatch.setattr(calibration, "median", recording)
    with caplog.at_level(logging.INFO, logger="specbench.runs"):
        s = runner.run(small("method=vanilla", "limit=2", "batch_size=2", "decode.max_new_tokens=8"), tmp_path)
    record = measurements.target_1(tmp_path, 0, 2)
    passes = [real(v) for v in medians[: calibration.PASSES]]
    assert record["passes"] == calibration.PASSES == 3 and medians[-1] == passes  # the last median: of the passes
    assert record["seconds"] == statistics.median(passes) and record["spread"] == [min(passes), max(passes)]
    assert isinstance(record["load_average"], float) and record["load_average"] >= 0
    assert s["call_costs"]["target_1"] == record["seconds"] and s["call_costs"]["target_1_from"] == "calibration"
    lo, hi = s["predicted_speedup_spread"]
    assert lo / s["predicted_speedup"] == pytest.approx(record["spread"][0] / record["seconds"])  # linear in target_1
    assert hi / s["predicted_speedup"] == pytest.approx(record["spread"][1] / record["seconds"])
    assert f"{lo:.2f}-{hi:.2f} over the calibration passes; not a measurement" in caplog.text


def test_a_run_without_drafts_predicts_nothing(tmp_path):
    s = runner.run(small("method=ar", "limit=1", "decode.max_new_tokens=4"), tmp_path)
    assert s["predicted_speedup"] is None and s["predicted_speedup_spread"] is None


def test_the_overview_prints_the_prediction_with_its_calibration_range_also_on_fewer_examples(tmp_path):
    """The overview's predicted cell: 'p (lo–hi)' from summary.json's predicted_speedup_spread; compared on fewer
    examples than the run holds (ar ran 2 of its 3), the prediction is recomputed and its range keeps the ratios
    lo / p and hi / p (the prediction is linear in target_1)."""
    import json

    from specbench.analysis import load, report

    common = ("limit=3", "batch_size=3", "decode.max_new_tokens=8", f"paths.results={tmp_path}")
    runner.run(small("method=vanilla", *common), tmp_path / "res" / "vanilla")
    runner.run(small("method=ar", *common[1:], "limit=2"), tmp_path / "res" / "ar")
    summary = json.loads((tmp_path / "res" / "vanilla" / "summary.json").read_text())
    table = next(t for t in report.build_report(load.load_runs(tmp_path / "res")).tables if t.name == "overview")
    cell = table.cells.loc[table.cells.index[[i[1] == "vanilla" for i in table.cells.index]][0]]
    cell = cell[[c for c in cell.index if c[1] == "predicted"][0]]
    value, band = cell.split(" (")
    lo, hi = (float(x) for x in band.rstrip(")").split("–"))
    p, (s_lo, s_hi) = summary["predicted_speedup"], summary["predicted_speedup_spread"]
    assert float(value) != pytest.approx(p, abs=1e-9)  # recomputed on the 2 examples ar holds
    assert lo == pytest.approx(float(value) * s_lo / p, abs=0.02)
    assert hi == pytest.approx(float(value) * s_hi / p, abs=0.02)
