"""State a method carries across examples (persist options) is saved with each row: a resumed run and a
warmed-up run give the rows of one uninterrupted run without warm-up."""

import json

import pytest

import specbench.runs.runner as runner
import helpers
from helpers import small
from specbench.runs.results import ROWS, read_rows
from specbench.runs.runner import build_method
from specbench.runs.traces import read_traces

TIMING = helpers.TIMING | {"draft_s", "verify_s", "verify_forward_s", "draft_forward_s", "host_s"}
COMMON = ("limit=6", "decode.max_new_tokens=32", "trace=true")
HF_SAME_VOCAB = ("pair.target.vocab_size=259", "pair.draft.vocab_size=259")  # hf_assisted needs equal sizes

# every method option that keeps state from one example to the next
PERSISTING = {
    "heuristic": ("method=heuristic", "method.persist=true"),
    "gammatune": ("method=gammatune", "method.persist=true"),
    "gammatune_plus": ("method=gammatune_plus", "method.persist=true", "decode=t1"),
    "adasd": ("method=adasd", "method.persist=true"),
    "adasd_variant_c": ("method=adasd_variant_c", "method.persist=true", "decode=t1"),
    "adasd_verify_only": ("method=adasd_verify_only", "method.persist=true"),
    "suffix": ("method=suffix", "decode=t1"),  # the run's tree of earlier outputs (on by default)
    "hf_assisted": ("method=hf_assisted", "method.persist=true", "method.gamma=3",
                    "method.num_assistant_tokens_schedule=heuristic", *HF_SAME_VOCAB),
}


def untimed(rows: list[dict]) -> list[dict]:
    """Rows without wall-clock fields: everything else is fixed by the config."""
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def state_trace(run_dir) -> list[dict]:
    """Every iteration's record (drafted, accepted, stop, policy state after the update), timings dropped."""
    t = read_traces(run_dir)
    return json.loads(t.drop(columns=sorted(TIMING & set(t.columns))).to_json(orient="records"))


class Crash(RuntimeError):
    pass


def crash_after(monkeypatch, k: int) -> None:
    """Make runner.decode_batch raise when asked for batch k + 1 (example k + 1 at batch_size 1: a job killed
    after k rows)."""
    real, calls = runner.decode_batch, {"n": 0}

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > k:
            raise Crash(f"killed after {k} rows")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "decode_batch", crashing)


@pytest.mark.parametrize("name", sorted(PERSISTING))
def test_resumed_and_warmed_up_runs_give_the_uninterrupted_rows(tmp_path, monkeypatch, name):
    job = (*PERSISTING[name], *COMMON)
    runner.run(small(*job), tmp_path / "whole")
    whole = read_rows(tmp_path / "whole" / ROWS)
    states = [r["carried_state"] for r in whole]
    assert len(whole) == 6 and len({json.dumps(s, sort_keys=True) for s in states}) > 1, "the state must move"

    with monkeypatch.context() as m:
        crash_after(m, 3)
        with pytest.raises(Crash):
            runner.run(small(*job), tmp_path / "resumed")
    assert len(read_rows(tmp_path / "resumed" / ROWS)) == 3
    runner.run(small(*job), tmp_path / "resumed")
    assert untimed(read_rows(tmp_path / "resumed" / ROWS)) == untimed(whole)
    assert state_trace(tmp_path / "resumed") == state_trace(tmp_path / "whole")

    runner.run(small(*job, "warmup=2"), tmp_path / "warm")  # two unrecorded examples first
    assert untimed(read_rows(tmp_path / "warm" / ROWS)) == untimed(whole)
    assert state_trace(tmp_path / "warm") == state_trace(tmp_path / "whole")


@pytest.mark.parametrize("job", [("method=confidence",), ("method=heuristic",), ("method=adasd",)])
def test_methods_that_restart_every_example_save_no_state(tmp_path, job):
    """confidence refits its threshold per call (as transformers 5.24 does); persist=false restarts too."""
    runner.run(small(*job, "limit=3", "decode.max_new_tokens=16", "warmup=1"), tmp_path / "warm")
    runner.run(small(*job, "limit=3", "decode.max_new_tokens=16"), tmp_path / "cold")
    warm, cold = read_rows(tmp_path / "warm" / ROWS), read_rows(tmp_path / "cold" / ROWS)
    assert untimed(warm) == untimed(cold) and not any("carried_state" in r for r in warm)


def test_rows_without_the_state_are_not_resumed(tmp_path):
    """A persisting run whose rows an older version wrote (no carried_state) is refused, not resumed afresh."""
    job = (*PERSISTING["heuristic"], "decode.max_new_tokens=16")
    runner.run(small(*job, "limit=2"), tmp_path)
    rows = read_rows(tmp_path / ROWS)
    (tmp_path / ROWS).write_text("".join(json.dumps({k: v for k, v in r.items() if k != "carried_state"}) + "\n"
                                         for r in rows))
    with pytest.raises(ValueError, match=r"'heuristic' carries state .* 'smoke-01' has no 'carried_state'"):
        runner.run(small(*job, "limit=4"), tmp_path)
    assert len(read_rows(tmp_path / ROWS)) == 2
    runner.run(small(*job, "limit=2"), tmp_path)  # nothing left to decode: nothing to continue


@pytest.mark.parametrize("cfg,bad", [
    ({"name": "heuristic", "persist": True}, {"gama": 3}),
    ({"name": "gammatune", "persist": True}, {"gamma": 3}),
    ({"name": "adasd", "persist": True}, {"t_g": 1.0, "t_v": 0.1}),
])
def test_a_malformed_state_names_the_keys(cfg, bad):
    m = build_method(cfg)
    keys = ", ".join(m.carried_state())
    with pytest.raises(ValueError, match=f"{cfg['name']}.*exactly the keys {keys}"):
        m.restore_state(bad)


def test_a_method_without_carried_state_refuses_one():
    with pytest.raises(ValueError, match="'vanilla' carries no state"):
        build_method({"name": "vanilla"}).restore_state({"gamma": 5})


@pytest.mark.parametrize("job", [(*PERSISTING["heuristic"], "limit=6"), ("method=vanilla", "limit=5", "batch_size=2")])
def test_trace_true_on_rows_without_traces_decodes_them_again_for_their_traces(tmp_path, caplog, job):
    """A folder whose rows a run without trace=true wrote gets the traces of an uninterrupted trace=true run (the
    carried state restored before each batch decoded again) and keeps its rows; a row whose tokens the new decode
    does not give is named."""
    job = (*job, "decode.max_new_tokens=32")
    runner.run(small(*job, "trace=true"), tmp_path / "whole")
    first = [j if not j.startswith("limit=") else "limit=2" for j in job]
    runner.run(small(*first, "trace=true"), tmp_path / "part")  # traced rows, then rows without traces
    runner.run(small(*job), tmp_path / "part")
    runner.run(small(*job), tmp_path / "none")
    assert len(read_traces(tmp_path / "part")["id"].unique()) == 2 and not (tmp_path / "none" / "traces").exists()
    rows = {d: (tmp_path / d / ROWS).read_text() for d in ("part", "none")}
    n = len(read_rows(tmp_path / "whole" / ROWS))
    for d, retraced in (("part", n - 2), ("none", n)):
        caplog.clear()
        summary = runner.run(small(*job, "trace=true"), tmp_path / d)
        assert f"trace=true: {retraced} rows in the folder have no trace" in caplog.text
        assert summary["decoded"] == 0 and (tmp_path / d / ROWS).read_text() == rows[d]  # the rows are kept
        assert state_trace(tmp_path / d) == state_trace(tmp_path / "whole")
    caplog.clear()
    runner.run(small(*job, "trace=true"), tmp_path / "none")  # every trace there: nothing decoded again
    assert "have no trace" not in caplog.text

    rows = read_rows(tmp_path / "none" / ROWS)  # a row the new decode does not give (edited here) is named
    rows[1]["token_ids"] = rows[1]["token_ids"][:-1]
    (tmp_path / "none" / ROWS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "none" / "traces" / f"{rows[1]['id']}.parquet").unlink()
    runner.run(small(*job, "trace=true"), tmp_path / "none")
    assert f"example {rows[1]['id']!r} (repeat 0) decoded again for its trace gave other tokens than its row" in caplog.text
