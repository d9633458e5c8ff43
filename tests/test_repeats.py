"""repeats=N decodes every example N times (rows by id and repeat); a rerun resumes, remeasure=true
measures a new set of repeats without deleting anything; the summary says what was decoded and reused."""

import json
import logging

import pytest

import specbench.runs.runner as runner
from helpers import small
from specbench.runs.results import CONFIG, ROWS, read_measured, read_rows

JOB = ("method=vanilla", "limit=3", "decode.max_new_tokens=12")
KEYS = ("id", "repeat", "token_ids", "output", "new_tokens", "iterations", "drafted", "accepted", "stop_reason",
        "call_stats")


def stable(rows: list[dict]) -> list[dict]:
    """The row fields that do not depend on timing."""
    return [{k: r[k] for k in KEYS} for r in rows]


@pytest.mark.parametrize("decode", ["greedy", "t1"])
def test_repeats_give_identical_tokens_and_the_spread(tmp_path, decode):
    s = runner.run(small(*JOB, f"decode={decode}", "repeats=2"), tmp_path)
    rows = read_rows(tmp_path / ROWS)
    assert [(r["id"], r["repeat"]) for r in rows] == [(i, k) for k in (0, 1) for i in ("smoke-00", "smoke-01", "smoke-02")]
    assert [r["token_ids"] for r in rows[:3]] == [r["token_ids"] for r in rows[3:]]  # same seed per example
    assert s["repeats"] == 2 and s["n_examples"] == 6 and (s["decoded"], s["resumed"]) == (6, 0)
    rates = [sum(r["new_tokens"] for r in rows[k:k + 3]) / sum(r["decode_s"] for r in rows[k:k + 3]) for k in (0, 3)]
    assert s["tokens_per_s_spread"] == pytest.approx({"min": min(rates), "max": max(rates)})
    assert s["tokens_per_s_median"] == pytest.approx(sum(rates) / 2)
    assert s["measure_from"] == 0 and s["score"] is None  # smoke prompts are not scored


def test_a_rerun_resumes_and_says_so(tmp_path, caplog):
    runner.run(small(*JOB), tmp_path)
    before = (tmp_path / ROWS).read_text()
    with caplog.at_level(logging.WARNING, logger="specbench.runs.runner"):
        s = runner.run(small(*JOB), tmp_path)
    assert (tmp_path / ROWS).read_text() == before
    assert (s["decoded"], s["resumed"], s["repeats"]) == (0, 3, 1)
    assert s["tokens_per_s_spread"]["min"] == s["tokens_per_s_spread"]["max"] == pytest.approx(s["tokens_per_s"])
    assert "reusing 3 rows" in caplog.text and "remeasure=true" in caplog.text


def test_remeasure_appends_a_new_set_that_the_summary_uses(tmp_path):
    runner.run(small(*JOB, "repeats=2"), tmp_path)
    old = read_rows(tmp_path / ROWS)
    s = runner.run(small(*JOB, "repeats=2", "remeasure=true"), tmp_path)
    rows = read_rows(tmp_path / ROWS)
    assert rows[:6] == old  # nothing deleted or rewritten
    assert sorted({r["repeat"] for r in rows[6:]}) == [2, 3] and len(rows) == 12
    assert (s["decoded"], s["resumed"], s["measure_from"], s["n_examples"]) == (6, 0, 2, 6)
    assert json.loads((tmp_path / CONFIG).read_text())["measure_from"] == 2
    assert read_measured(tmp_path) == rows[6:]  # what the report reads
    # a plain rerun resumes the newest set
    again = runner.run(small(*JOB, "repeats=2"), tmp_path)
    assert (again["decoded"], again["resumed"], again["measure_from"]) == (0, 6, 2)
    assert len(read_rows(tmp_path / ROWS)) == 12


def test_a_crash_mid_repeat_then_resume_gives_the_uninterrupted_rows(tmp_path, monkeypatch):
    job = (*JOB, "repeats=2", "decode=t1")
    runner.run(small(*job), tmp_path / "whole")
    real, calls = runner.decode_batch, {"n": 0}

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # in the second repeat
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(runner, "decode_batch", crashing)
        with pytest.raises(RuntimeError, match="killed"):
            runner.run(small(*job), tmp_path / "resumed")
    assert len(read_rows(tmp_path / "resumed" / ROWS)) == 4
    s = runner.run(small(*job), tmp_path / "resumed")
    assert (s["decoded"], s["resumed"]) == (2, 4)
    assert stable(read_rows(tmp_path / "resumed" / ROWS)) == stable(read_rows(tmp_path / "whole" / ROWS))


def test_a_persisting_method_starts_every_repeat_afresh(tmp_path):
    """A method that carries state across examples gives each repeat the rows of one uninterrupted pass."""
    rows = runner.run(small("method=gammatune", "method.persist=true", "limit=4", "decode.max_new_tokens=24",
                            "repeats=2"), tmp_path) and read_rows(tmp_path / ROWS)
    first, second = rows[:4], rows[4:]
    assert [r["carried_state"] for r in first] == [r["carried_state"] for r in second]
    assert stable(first) == [{**r, "repeat": 0} for r in stable(second)]


def test_a_remeasure_refused_for_another_code_version_leaves_the_folder_as_it_was(tmp_path):
    runner.run(small(*JOB), tmp_path)
    record = json.loads((tmp_path / CONFIG).read_text())
    (tmp_path / CONFIG).write_text(json.dumps({**record, "git_hash": "0" * 40}))  # rows of another version
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match="refusing to mix rows of different code versions"):
        runner.run(small(*JOB, "remeasure=true"), tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p.name != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"}  # config.json gained no measure_from


def test_a_smaller_selection_of_a_fuller_folder_summarizes_its_own_rows(tmp_path, caplog):
    """limit=2 (then repeats=1) after limit=3 repeats=2: the folder keeps every row, the summary covers the 2 selected
    examples of repeat 0 only, names them in `selected_ids`, says so in the log, and equals the summary of a folder
    holding just those rows."""
    runner.run(small(*JOB, "repeats=2"), tmp_path / "full")
    with caplog.at_level(logging.WARNING, logger="specbench.runs.runner"):
        s = runner.run(small("method=vanilla", "limit=2", "decode.max_new_tokens=12"), tmp_path / "full")
    assert len(read_rows(tmp_path / "full" / ROWS)) == 6  # nothing deleted
    assert s["selected_ids"] == ["smoke-00", "smoke-01"] and s["n_examples"] == 2 and (s["decoded"], s["resumed"]) == (0, 2)
    assert "the folder holds 6 rows; this run's settings (limit=, shard=, repeats=) select 2 of them" in caplog.text
    alone = runner.run(small("method=vanilla", "limit=2", "decode.max_new_tokens=12"), tmp_path / "alone")
    assert "selected_ids" not in alone
    for key in ("n_examples", "mean_accepted", "acceptance_rate", "block_efficiency", "total_new_tokens"):
        assert s[key] == alone[key], key  # greedy: the same rows, hence the same pooled numbers
