"""batch_size > 1: fixed chunks of each repeat's examples decoded together, a chunk's rows appended in one
write, resumed chunk by chunk; batch_size is part of the run identity and checked before models load."""

import json
import math

import pytest
from omegaconf import OmegaConf

import specbench.common.files as files
import specbench.runs.runner as runner
from helpers import SYNTHETIC, TIMING, compose_cfg, full_disk_on_append, small
from specbench.common.options import OptionError
from specbench.data.dataset import Evaluator, Example
from specbench.decoding.engine import Engine
from specbench.runs.layout import job_dir
from specbench.runs.results import CONFIG, PENDING, ROWS, RowWriter, read_rows
from specbench.runs.runner import Job, build_method, decode_batch, make_engine, sampling_params
from specbench.runs.traces import read_traces

JOB = ("method=vanilla", "limit=7", "decode.max_new_tokens=8", "threads=1")


class Crash(RuntimeError):
    pass


def untimed(rows: list[dict], drop: tuple[str, ...] = ()) -> list[dict]:
    """Rows without wall-clock fields (and the fields in `drop`): everything else is fixed by the config."""
    return [{k: v for k, v in r.items() if k not in TIMING and k not in drop} for r in rows]


def batch_sizes(monkeypatch) -> list[int]:
    """Record the rows of every Engine.generate_batch call of the run's method (the list fills as the run goes;
    the `ar` decodes of the summary's target_1 calibration, calibration.calibrate_target_1, are left out)."""
    real, sizes = Engine.generate_batch, []

    def counting(self, prompts, *args, **kwargs):
        if self.method.name != "ar":
            sizes.append(len(prompts))
        return real(self, prompts, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate_batch", counting)
    return sizes


def crash_on_call(monkeypatch, n: int) -> None:
    """Make the n-th Engine.generate_batch call raise (a job killed while decoding that batch)."""
    real, calls = Engine.generate_batch, {"n": 0}

    def crashing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise Crash(f"killed in generate_batch call {n}")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate_batch", crashing)


def test_a_batched_run_decodes_fixed_chunks_and_gives_the_one_at_a_time_tokens(tmp_path, monkeypatch, capsys):
    one = runner.run(small(*JOB), tmp_path / "b1")
    sizes = batch_sizes(monkeypatch)
    summary = runner.run(small(*JOB, "batch_size=3", "trace=true", "progress=true"), tmp_path / "b3")
    assert sizes == [3, 3, 1]  # the chunks, each decoded in one call
    assert "7/7" in capsys.readouterr().err  # the bar counts examples
    single, batched = read_rows(tmp_path / "b1" / ROWS), read_rows(tmp_path / "b3" / ROWS)
    assert [r["id"] for r in batched] == [r["id"] for r in single] and len(batched) == 7
    assert [r["batch"] for r in batched] == [0, 0, 0, 1, 1, 1, 2]
    assert [r["batch_size"] for r in batched] == [3, 3, 3, 3, 3, 3, 1]
    assert [r["batch"] for r in single] == list(range(7)) and {r["batch_size"] for r in single} == {1}
    assert [r["token_ids"] for r in batched] == [r["token_ids"] for r in single]  # greedy
    # a row also takes part in the batch's draft forwards after its own drafting stopped (the batch drafts to
    # its longest window): draft_calls can only grow
    assert untimed(batched, ("batch", "batch_size", "draft_calls")) == untimed(single, ("batch", "batch_size", "draft_calls"))
    assert all(b["draft_calls"] >= s["draft_calls"] for b, s in zip(batched, single))
    assert all(r["latency_s"] == pytest.approx(r["decode_s"], rel=1e-9) for r in single)  # one row: its wall time
    assert all(r["latency_s"] > 0 for r in batched)
    # tokens per second pools the rows: total new tokens over total decode seconds (each row's share of its batch)
    assert summary["tokens_per_s"] == pytest.approx(sum(r["new_tokens"] for r in batched) /
                                                    sum(r["decode_s"] for r in batched))
    assert (summary["batch_size"], one["batch_size"]) == (3, 1)
    assert (summary["decoded"], summary["resumed"]) == (7, 0)
    traces = read_traces(tmp_path / "b3")  # one trace per row, as at batch_size 1
    assert sorted(set(traces["id"])) == sorted(r["id"] for r in batched)
    assert len(traces) == sum(r["iterations"] for r in batched)


def test_warm_up_decodes_the_first_batches(tmp_path, monkeypatch):
    runner.run(small(*JOB, "batch_size=3"), tmp_path / "cold")
    sizes = batch_sizes(monkeypatch)
    runner.run(small(*JOB, "batch_size=3", "warmup=1"), tmp_path / "warm")
    assert sizes == [3, 3, 3, 1]  # the first batch once more, unrecorded
    assert untimed(read_rows(tmp_path / "warm" / ROWS)) == untimed(read_rows(tmp_path / "cold" / ROWS))


def test_a_crash_in_a_batch_leaves_the_whole_batches_and_resumes_to_the_uninterrupted_rows(tmp_path, monkeypatch):
    job = (*JOB, "batch_size=3", "decode=t1")  # sampled: each example's own generator must carry over
    runner.run(small(*job), tmp_path / "whole")
    whole = read_rows(tmp_path / "whole" / ROWS)
    with monkeypatch.context() as m:
        crash_on_call(m, 2)  # in the second batch, after the first one's rows were written
        with pytest.raises(Crash):
            runner.run(small(*job), tmp_path / "resumed")
    part = read_rows(tmp_path / "resumed" / ROWS)
    assert [r["id"] for r in part] == [r["id"] for r in whole[:3]] and untimed(part) == untimed(whole[:3])
    sizes = batch_sizes(monkeypatch)
    s = runner.run(small(*job), tmp_path / "resumed")
    assert sizes == [3, 1] and (s["decoded"], s["resumed"]) == (4, 3)
    assert untimed(read_rows(tmp_path / "resumed" / ROWS)) == untimed(whole)


def test_a_write_failing_part_way_leaves_no_row_of_its_batch(tmp_path, monkeypatch):
    job = (*JOB, "batch_size=3")
    runner.run(small(*job), tmp_path / "whole")
    with monkeypatch.context() as m:  # the rows append's open: the second batch's append writes 2/3, whole rows among it
        m.setattr(files, "open", full_disk_on_append(2, 2 / 3), raising=False)
        with pytest.raises(OSError, match="No space"):
            runner.run(small(*job), tmp_path / "resumed")
    rows_file = tmp_path / "resumed" / ROWS
    first = read_rows(rows_file)
    assert len(first) == 3 and len(rows_file.read_text().splitlines()) == 3  # the first batch, whole
    assert not (tmp_path / "resumed" / PENDING).exists()
    runner.run(small(*job), tmp_path / "resumed")
    assert untimed(read_rows(rows_file)) == untimed(read_rows(tmp_path / "whole" / ROWS))


def test_a_kill_during_a_write_leaves_a_marker_that_readers_and_the_next_run_respect(tmp_path):
    """A process killed inside append_many leaves .rows.pending: what follows that size is an unfinished batch."""
    job = (*JOB, "batch_size=3", "limit=3")
    runner.run(small(*job), tmp_path)
    rows_file = tmp_path / ROWS
    done = rows_file.read_bytes()
    (tmp_path / PENDING).write_text(json.dumps({"size": len(done)}))
    with open(rows_file, "ab") as f:  # a batch cut short: one whole row, then part of the next
        f.write(b'{"id": "smoke-03", "repeat": 0}\n{"id": "smoke-04", "tok')
    assert [r["id"] for r in read_rows(rows_file)] == ["smoke-00", "smoke-01", "smoke-02"]
    writer = RowWriter(tmp_path)
    assert rows_file.read_bytes() == done and not (tmp_path / PENDING).exists() and len(writer.rows) == 3
    with pytest.raises(ValueError, match=r"'smoke-00' \(repeat 0\) is already in"):
        writer.append_many([{"id": "smoke-09"}, {"id": "smoke-00"}])
    assert rows_file.read_bytes() == done  # refused before writing anything


@pytest.mark.parametrize("value", ["true", "0", "-1", "x", "2.5"])
def test_a_bad_batch_size_fails_before_models_load(tmp_path, monkeypatch, value):
    monkeypatch.setattr(runner, "load_pair", lambda *a: pytest.fail("models loaded before the check"))
    with pytest.raises(OptionError, match="batch_size must be an integer >= 1, got"):
        runner.run(small(*JOB, f"batch_size={value}"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_batch_size_names_its_own_folder_and_is_part_of_the_identity(tmp_path):
    folder = job_dir(compose_cfg("batch_size=4"))
    assert folder.name == "batch_size=4" and job_dir(compose_cfg()).name == "default"
    assert folder.parent == job_dir(compose_cfg()).parent  # .../<decode>/batch_size=4
    assert job_dir(compose_cfg("batch_size=1")) == job_dir(compose_cfg())  # the default names no folder
    runner.run(small(*JOB, "limit=2"), tmp_path)
    with pytest.raises(ValueError, match=r"different configuration .*batch_size \(1 vs 2\)"):
        runner.run(small(*JOB, "limit=2", "batch_size=2"), tmp_path)
    # a folder written before batch_size existed decoded one example at a time: it resumes at batch_size 1
    record = json.loads((tmp_path / CONFIG).read_text())
    del record["config"]["batch_size"]
    (tmp_path / CONFIG).write_text(json.dumps(record))
    assert runner.run(small(*JOB, "limit=3"), tmp_path)["decoded"] == 1


@pytest.mark.parametrize("job,match", [
    (("method=hf_assisted",), "'hf_assisted' .*batch size 1 only .*batch_size=2"),
    (("method=adasd", "method.persist=true"), "'adasd': method.persist=true .*batch_size=1 .*batch_size=2"),
])
def test_methods_that_need_batch_size_1_fail_before_models_load(tmp_path, monkeypatch, job, match):
    monkeypatch.setattr(runner, "load_pair", lambda *a: pytest.fail("models loaded before the check"))
    with pytest.raises(OptionError, match=match):
        runner.run(small(*job, "batch_size=2", "limit=2"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_mt_bench_batched_turn_by_turn_gives_the_one_at_a_time_rows(tmp_path, monkeypatch):
    # the synthetic fixtures' three questions: two turns each, as every MT-bench question
    job = (*JOB, "dataset=mt_bench", f"dataset.data_dir={SYNTHETIC}", "limit=3", "decode.max_new_tokens=6")
    runner.run(small(*job), tmp_path / "b1")
    sizes = batch_sizes(monkeypatch)
    runner.run(small(*job, "batch_size=2"), tmp_path / "b2")
    assert sizes == [2, 2, 1, 1]  # per chunk: turn 1 of its examples together, then turn 2
    single, batched = read_rows(tmp_path / "b1" / ROWS), read_rows(tmp_path / "b2" / ROWS)
    assert all(len(r["turn_outputs"]) == 2 for r in batched)
    drop = ("batch", "batch_size", "draft_calls")  # draft_calls: the batch drafts to its longest window
    assert untimed(batched, drop) == untimed(single, drop)
    assert all(b["draft_calls"] >= s["draft_calls"] for b, s in zip(batched, single))


class MixedTurns(Evaluator):
    name = "mixed_turns"

    def examples(self):
        return [Example(id="q1", prompt="Name a colour.", turns=["Name a colour.", "Now name another one."]),
                Example(id="q2", prompt="Count to three."),
                Example(id="q3", prompt="Say hi.", turns=["Say hi.", "Say bye."])]


def test_a_batch_decodes_each_turn_over_the_examples_that_have_it(tiny_pair, monkeypatch):
    c = OmegaConf.to_container(small("method=vanilla", "decode=t1", "decode.max_new_tokens=6"), resolve=False)
    method = build_method(c["method"])
    job = Job(make_engine(tiny_pair, method, sampling_params(c["decode"]), ()), method, tiny_pair, MixedTurns(),
              c["dataset"], 6, 0, "error", False)
    examples = MixedTurns().examples()
    alone = [decode_batch(job, [ex], False)[0] for ex in examples]
    sizes = batch_sizes(monkeypatch)
    together = decode_batch(job, examples, False)
    assert sizes == [3, 2]  # turn 1 of all three, turn 2 of the two that have one
    for (g1, info1), (g2, info2) in zip(alone, together):
        assert (g2.token_ids, g2.text, g2.stop_reasons) == (g1.token_ids, g1.text, g1.stop_reasons)
        assert untimed([info2]) == untimed([info1])  # turn_outputs, prompt_tokens, call_stats
    assert "turn_outputs" not in together[1][1] and len(together[0][1]["turn_outputs"]) == 2
    assert all(math.isfinite(g.latency_s) for g, _ in together)


@pytest.mark.parametrize("name", ["ar", "vanilla"])
def test_top_p_sampling_runs_end_to_end_at_batch_size_1_and_4(tmp_path, name):
    """decode.top_p < 1 with top-k and a temperature through the composed config and the runner (top-p once crashed
    every method: the verify forward's logits [B, positions, V] went to warpers that take [N, V]): every example
    decodes at batch_size 1 and 4, and gets the same tokens at both (its own generator; each row warped alone)."""
    job = (f"method={name}", "decode=t1", "decode.temperature=0.8", "decode.top_k=20", "decode.top_p=0.9", "limit=4",
           "decode.max_new_tokens=8", "threads=1")
    tokens = {}
    for B in (1, 4):
        summary = runner.run(small(*job, f"batch_size={B}"), tmp_path / f"b{B}")
        rows = read_rows(tmp_path / f"b{B}" / ROWS)
        assert (summary["decoded"], summary["batch_size"], len(rows)) == (4, B, 4)
        decode = summary["config"]["decode"]
        assert (decode["temperature"], decode["top_k"], decode["top_p"]) == (0.8, 20, 0.9)
        assert all(0 < len(r["token_ids"]) == r["new_tokens"] <= 8 for r in rows)
        tokens[B] = [r["token_ids"] for r in rows]
    assert tokens[4] == tokens[1]
