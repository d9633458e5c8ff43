"""`python -m specbench.bench batch`: its options, the table and verdicts computed from summaries (fake ones,
worked by hand), and one real run whose printed numbers are checked against the summary.json of each run."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from specbench.bench import batch as bench
from specbench.bench import cli


def summary(tps: float, acc: float | None = 0.5, tau: float = 2.0, rss: float = 400.0, n: int = 32) -> dict:
    """The summary.json fields the batch table reads."""
    return {"tokens_per_s": tps, "acceptance_rate": acc, "block_efficiency": tau, "peak_rss_mb": rss, "n_examples": n,
            "device_info": {"device": "cpu"}}


# ar speeds up with the batch (10 -> 40 -> 70 tok/s), vanilla less (25 -> 50 -> 56): vanilla falls behind at B=8
FAKE = {("ar", 1): summary(10.0, None, 1.0), ("vanilla", 1): summary(25.0), ("ar", 4): summary(40.0, None, 1.0),
        ("vanilla", 4): summary(50.0), ("ar", 8): summary(70.0, None, 1.0), ("vanilla", 8): summary(56.0, rss=900.0)}


def test_options_and_their_defaults():
    args = cli.parser().parse_args(["batch"])
    assert (args.pair, args.methods, args.batch_sizes) == ("toy", "ar,vanilla,gammatune,adasd,spec_tree,dyn_tree", [1, 2, 4, 8, 16, 32])
    assert (args.limit, args.threads, args.device, args.out, args.dataset) == (None, 1, None, None, "toy_arith")
    args = cli.parser().parse_args(["batch", "--batch-sizes", "8,1,2,2", "--limit", "5", "--threads", "2",
                                      "--device", "cpu", "--out", "x", "--methods", "ar", "warmup=0"])
    assert (args.batch_sizes, args.limit, args.threads, args.device, args.out) == ([1, 2, 8], 5, 2, "cpu", "x")
    assert args.overrides == ["warmup=0"]


@pytest.mark.parametrize("bad", ["0,2", "a", "", "2,-1"])
def test_bad_batch_sizes_are_refused_by_name(bad, capsys):
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["batch", "--batch-sizes", bad])
    assert "--batch-sizes" in capsys.readouterr().err


def test_overrides_name_batch_size_only_above_one():
    args = cli.parser().parse_args(["batch", "--limit", "4", "--out", "/r"])
    one, four = bench.batch_overrides(args, "vanilla", 1), bench.batch_overrides(args, "vanilla", 4)
    assert four == [*one, "batch_size=4"] and not any(o.startswith("batch_size") for o in one)
    assert {"pair=toy", "method=vanilla", "limit=4", "threads=1", "paths.results=/r"} <= set(one)


def test_table_speedups_verdicts_and_ratio_by_hand():
    t = bench.batch_table(FAKE)
    assert list(zip(t["B"], t["method"])) == [(1, "ar"), (1, "vanilla"), (4, "ar"), (4, "vanilla"), (8, "ar"),
                                             (8, "vanilla")]
    by = t.set_index(["B", "method"])
    assert by.loc[(1, "vanilla"), "speedup_vs_ar"] == pytest.approx(2.5)  # 25 / 10, ar at the same B
    assert by.loc[(4, "vanilla"), "speedup_vs_ar"] == pytest.approx(1.25)  # 50 / 40
    assert by.loc[(8, "vanilla"), "speedup_vs_ar"] == pytest.approx(0.8)  # 56 / 70
    assert (by.xs("ar", level="method")["speedup_vs_ar"] == 1.0).all()
    assert by.loc[(8, "vanilla"), "peak_rss_mb"] == 900.0 and math.isnan(by.loc[(1, "ar"), "acceptance_rate"])
    assert bench.stops_beating(t) == 8
    assert bench.ar_ratio(t) == pytest.approx(7.0)  # 70 / 10
    lines = bench.batch_lines(t)
    assert lines[1:] == ["vanilla stops beating ar at: B=8", "ar tokens_per_s B=8 / B=1: 7.000"]


def test_vanilla_ahead_everywhere_and_missing_runs():
    ahead = {k: v for k, v in FAKE.items() if k != ("vanilla", 8)}
    t = bench.batch_table(ahead)
    assert bench.stops_beating(t) is None
    assert bench.batch_lines(t)[1] == "vanilla stops beating ar at: none up to B=4"
    no_ar = bench.batch_table({k: v for k, v in FAKE.items() if k[0] != "ar"})
    assert no_ar["speedup_vs_ar"].isna().all() and bench.ar_ratio(no_ar) is None
    assert bench.batch_lines(no_ar)[1:] == ["vanilla stops beating ar at: n/a (needs ar and vanilla at one batch size)",
                                            "ar tokens_per_s B=8 / B=1: n/a (needs ar at B=1 and B=8)"]
    cuda = bench.batch_table({k: {**v, "peak_cuda_mb": 12.5} for k, v in FAKE.items()})
    assert "peak_cuda_mb" in cuda and "peak_rss_mb" not in cuda


def test_every_method_and_batch_size_is_its_own_run(tmp_path, monkeypatch, capsys):
    """cmd_batch with run.py replaced by fake runs: one run per (method, B) with the default limit, then the table."""
    calls = []

    def fake_child(overrides: list[str]):
        calls.append(overrides)
        size = next((int(o.split("=")[1]) for o in overrides if o.startswith("batch_size=")), 1)
        method = next(o.split("=")[1] for o in overrides if o.startswith("method="))
        folder = tmp_path / f"{method}{size}"
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps(FAKE[(method, size)]))
        return subprocess.CompletedProcess(["run.py", *overrides], 0, "", ""), folder

    monkeypatch.setattr(bench, "run_child", fake_child)
    assert cli.main(["batch", "--methods", "ar,vanilla", "--batch-sizes", "1,4,8", "--out", str(tmp_path)]) == 0
    assert len(calls) == 6 and all("limit=8" in c for c in calls)  # enough examples to fill the largest batch
    out = capsys.readouterr().out
    assert "python -m specbench.bench batch --methods ar,vanilla --batch-sizes 1,4,8" in out
    assert "vanilla stops beating ar at: B=8" in out and "peak_rss_mb: peak resident memory" in out


def test_a_failed_run_stops_the_command_with_its_error(tmp_path, monkeypatch, capsys):
    def failing(overrides: list[str]):
        return subprocess.CompletedProcess(["run.py", *overrides], 1, "", "OptionError: method.gamma=0"), tmp_path

    monkeypatch.setattr(bench, "run_child", failing)
    assert cli.main(["batch", "--methods", "vanilla", "--batch-sizes", "2", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "run failed (exit status 1): vanilla at batch_size=2" in err and "OptionError: method.gamma=0" in err


def printed_table(out: str) -> list[dict[str, str]]:
    """The rows of the batch table in the command's output, as {column: printed text}."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["B", "method"])
    head = lines[start].split()
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("vanilla stops beating"):
            return rows
        rows.append(dict(zip(head, line.split(), strict=True)))
    raise AssertionError(f"no end of the table in {out}")


def check_printed(text: str, value: float | None) -> None:
    """The printed number is the value to its printed digits ('-' for none)."""
    if value is None:
        assert text == "-"
        return
    digits = len(text.partition(".")[2])
    assert abs(float(text) - value) <= 0.5 * 10 ** -digits + 1e-12, (text, value)


def test_a_real_run_prints_its_summaries(tmp_path, capsys):
    args = ["batch", "--batch-sizes", "1", "--methods", "ar,vanilla", "--limit", "2", "--max-new-tokens", "8",
            "--out", str(tmp_path)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert out.count("$ python run.py pair=toy method=") == 2
    rows = printed_table(out)
    assert [(r["B"], r["method"]) for r in rows] == [("1", "ar"), ("1", "vanilla")]
    found = {m: list(tmp_path.glob(f"toy/toy_arith/{m}/greedy/*/summary.json")) for m in ("ar", "vanilla")}
    assert all(len(f) == 1 for f in found.values()), found
    s = {m: json.loads(f[0].read_text()) for m, f in found.items()}
    mem = "peak_cuda_mb" if "peak_cuda_mb" in rows[0] else "peak_rss_mb"
    for r in rows:
        mine = s[r["method"]]
        assert int(r["n_examples"]) == mine["n_examples"] == 2
        for k in ("tokens_per_s", "acceptance_rate", "block_efficiency", mem):
            check_printed(r[k], mine[k])
        check_printed(r["speedup_vs_ar"], mine["tokens_per_s"] / s["ar"]["tokens_per_s"])
    assert rows[0]["acceptance_rate"] == "-" and s["vanilla"]["acceptance_rate"] is not None
