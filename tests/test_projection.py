"""Projection (`python -m specbench.report DIR --profile PROFILE`): a run's own recorded iterations at a cost
profile's costs, by predicted_speedup's formula; which profile entry costs a run, and the refusals. Every expected
number is computed here by hand from the constructed rows and profile; nothing depends on timing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import add_fields, at_batch_size, write_run
from specbench.analysis import load, report
from specbench.bench.common import load_cfg
from specbench.common.files import ROOT, write_json_atomic
from specbench.decoding import profiles

TOY = {"target": {"model_type": "llama", "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 8,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512},
       "draft": {"model_type": "llama", "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 1,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}}
BIG = {"target": {**TOY["target"], "hidden_size": 4096, "num_hidden_layers": 32},
       "draft": {**TOY["draft"], "hidden_size": 2048, "num_hidden_layers": 16}}


def entry(pair: str = "p", shapes: dict = TOY, batch_size: int = 1, dtype: str = "float32", path: str = "eager",
          scale: float = 1.0, trees: dict | None = None, drafts: bool = False) -> dict:
    """A profile entry: target 1.0 s for one token, +0.2 s per further token (measured at 1, 2, 4 and 8 tokens),
    draft 0.1 s for one token (with `drafts` also measured at 2 and 4 tokens: 0.16 s, 0.28 s); every cost times
    `scale`."""
    chain = {"1": 1.0, "2": 1.2, "4": 1.6, "8": 2.4}
    out = {"pair": pair, "shapes": shapes, "dtype": dtype, "device": "cpu (1 threads)", "path": path,
           "batch_size": batch_size, "prompt_tokens": 20, "target_chain_s": {k: v * scale for k, v in chain.items()},
           "target_tree_s": {k: v * scale for k, v in (trees or {}).items()}, "draft_token_s": 0.1 * scale}
    if drafts:
        out["draft_chain_s"] = {k: v * scale for k, v in {"1": 0.1, "2": 0.16, "4": 0.28}.items()}
    return out


def write_profile(path: Path, *entries: dict, name: str = "test box") -> Path:
    write_json_atomic(path, {"format": 1, "name": name, "machine": [], "versions": {}, "command": "by hand",
                             "entries": list(entries)})
    return path


# A chain run: the generation's first iteration is left out of call_stats; then w=2 twice (accepted 2, 0) and w=1
# once (accepted 1): alpha_1 = 2/3 (3 reached, 2 accepted), alpha_2 = 1/1 (test_speedup's hand case)
CHAIN = {"call_stats": {"iterations": {"2": 2, "1": 1}, "depths": {"2": 2, "1": 1}, "reached": [3, 1],
                        "accepted": [2, 1]},
         "call_seconds": {"verify_s": {"2": 2.0, "1": 1.0}, "draft_s": {"2": 0.4, "1": 0.1}}}
# E[T|2] = 1 + 2/3 + 2/3 = 7/3, E[T|1] = 1 + 2/3 = 5/3; at entry(): target(3 tokens) = 1.4, target(2) = 1.2,
# target(1) = 1.0, draft 0.1 s per forward, one forward per drafted token (draft_calls = drafted = 7 with the
# first iteration's 2)
CHAIN_TRUTH = (2 * 7 / 3 + 5 / 3) / (2 * (2 * 0.1 + 1.4) + (1 * 0.1 + 1.2)) * 1.0


def chain_run(root: Path, folder: str = "vanilla", method: str = "vanilla", shapes: dict | None = TOY,
              dtype: str | None = "float32", s: float = 0.5, draft_calls: int = 7, **options) -> Path:
    run = write_run(root, folder, method, [{"new": 12, "s": s, "calls": 5, "drafted": 7, "accepted": 4, "k": 4}],
                    **options)
    add_fields(run, {"predicted_speedup": 2.0}, [{**CHAIN, "draft_calls": draft_calls}])
    if shapes is not None or dtype is not None:
        record = json.loads((run / "config.json").read_text())
        record["runtime"] = {"device": "cpu", "dtype": dtype, "threads": 1, "models": {},
                             **({"shapes": shapes} if shapes is not None else {})}
        write_json_atomic(run / "config.json", record)
    return run


def overview_of(root: Path, profile: Path, pair: str | None = None):
    rep = report.build_report(load.load_runs(root), projection=report.Projection(profiles.read(profile), pair))
    return next(t for t in rep.tables if t.name.startswith("overview")), [n for n in rep.notes if "projection" in n]


def test_a_run_is_priced_at_its_own_context_where_the_profile_measured_a_longer_cache(tmp_path):
    """An entry measured after P = 20 and after L = 120 cached tokens (target chains x 1.5, draft forwards x 1.2 at
    L): a run of prompts of 30 tokens and 12 new ones attends over kv = 30 + 12 / 2 = 36 on average, so each target
    forward costs 1 + (36 - 20) / 100 x 0.5 = 1.08 times its cost after P, each draft forward 1.032 times: CHAIN's
    hand formula at those costs. Without prompt lengths (older rows) nothing is scaled."""
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    add_fields(chain_run(tmp_path / "res"), None, [{"prompt_tokens": 30}])
    e = entry(drafts=True)
    e.update(long_tokens=120, target_chain_long_s={k: 1.5 * v for k, v in e["target_chain_s"].items()},
             draft_chain_long_s={k: 1.2 * v for k, v in e["draft_chain_s"].items()})
    assert profiles.kv_scale(e, "target", 3, 36) == pytest.approx(1.08)
    assert profiles.kv_scale(e, "draft", 1, 36) == pytest.approx(1.032) and profiles.kv_scale(e, "draft", 1, None) == 1
    ov, _ = overview_of(tmp_path / "res", write_profile(tmp_path / "profile.json", e))
    t, d = 1.08, 0.1 * 1.032
    truth = (2 * 7 / 3 + 5 / 3) / (2 * (2 * d + 1.4 * t) + (d + 1.2 * t)) * 1.0 * t
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "at test box")] == pytest.approx(truth)
    chain_run(tmp_path / "old")  # no prompt_tokens: the costs after P
    write_run(tmp_path / "old", "ar", "ar", [{"new": 12, "s": 1.0}])
    ov, _ = overview_of(tmp_path / "old", tmp_path / "profile.json")
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "at test box")] == pytest.approx(
        (2 * 7 / 3 + 5 / 3) / (2 * (2 * 0.1 + 1.4) + (0.1 + 1.2)))


def test_a_chain_run_projected_by_hand(tmp_path):
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    chain_run(tmp_path / "res")  # 12 tokens in 0.5 s: measured speedup 2.0 over ar's 12 in 1.0 s
    prof = write_profile(tmp_path / "profile.json", entry(), entry("other", BIG, scale=3.0))
    ov, notes = overview_of(tmp_path / "res", prof)
    col = "at test box"
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", col)] == pytest.approx(CHAIN_TRUTH)
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "projected / measured - 1")] == pytest.approx(CHAIN_TRUTH / 2 - 1)
    assert ov.cells.loc[("p · gsm8k", "vanilla"), ("", col)] == f"{CHAIN_TRUTH:.2f}"
    assert ov.cells.loc[("p · gsm8k", "ar"), ("", col)] == ""  # ar has no iterations to project
    assert list(ov.values.columns.get_level_values(1)[:6]) == ["tok/s", "speedup vs ar", "mean ratio", "predicted",
                                                              col, "projected / measured - 1"]
    assert "test box" in ov.title and not notes
    # the costs scale out: every cost times 3 gives the same speedup (a ratio of seconds)
    prof3 = write_profile(tmp_path / "p3.json", entry(scale=3.0))
    assert overview_of(tmp_path / "res", prof3)[0].values.loc[("p · gsm8k", "vanilla"), ("", col)] == pytest.approx(
        CHAIN_TRUTH)


def test_draft_forwards_priced_at_the_tokens_they_fed(tmp_path):
    """The iterations of width 2 ran 4 draft forwards feeding 5 tokens (one after a fully accepted block feeds the
    bonus token too), those of width 1 one forward of one token. With draft widths in the profile (0.1 s at 1 token,
    0.16 s at 2): width 2's forwards cost 4 * draft(1.25) = 4 * (0.1 + 0.06 / 4) = 0.46 s, width 1's 0.1 s; 5 drafted
    nodes: 0.112 s per node. Without draft widths every forward is the one-token one: 5 * 0.1 / 5 nodes."""
    run = chain_run(tmp_path / "res")
    rows = [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]
    rows[0]["call_seconds"].update(draft_steps={"2": 4, "1": 1}, draft_tokens={"2": 5, "1": 1})
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokens = 2 * 7 / 3 + 5 / 3
    with_widths = write_profile(tmp_path / "w.json", entry(drafts=True))
    at = overview_of(tmp_path / "res", with_widths)[0].values.loc[("p · gsm8k", "vanilla"), ("", "at test box")]
    assert at == pytest.approx(tokens / (2 * (2 * 0.112 + 1.4) + (0.112 + 1.2)))
    without = write_profile(tmp_path / "wo.json", entry())
    at = overview_of(tmp_path / "res", without)[0].values.loc[("p · gsm8k", "vanilla"), ("", "at test box")]
    assert at == pytest.approx(CHAIN_TRUTH)


def test_older_rows_price_their_draft_calls_per_drafted_node(tmp_path):
    """Rows without draft_steps: Σ draft_calls / Σ drafted one-token forwards per node; a row that took part in more
    draft forwards than it drafted (a batch's longest window) pays for them; drafts from no model (pld) cost no
    draft forward; a head's measured cost is scaled as the target's verifies scale."""
    chain_run(tmp_path / "res", "more", draft_calls=14, gamma=6)  # 2 forwards per drafted token
    chain_run(tmp_path / "res", "pld", "pld", draft_calls=0)
    chain_run(tmp_path / "res", "eagle3", "eagle3")
    prof = write_profile(tmp_path / "profile.json", entry())
    ov, notes = overview_of(tmp_path / "res", prof)
    at = ov.values[("", "at test box")]
    tokens = 2 * 7 / 3 + 5 / 3
    assert at[("p · gsm8k", "vanilla")] == pytest.approx(tokens / (2 * (2 * 0.2 + 1.4) + (0.2 + 1.2)))
    assert at[("p · gsm8k", "pld")] == pytest.approx(tokens / (2 * 1.4 + 1.2))
    # a head: its measured 0.5 s over 5 drafted nodes, times the profile's verify seconds of the run's iterations
    # (2 x 1.4 + 1.2 = 4.0) over the run's own (2.0 + 1.0 = 3.0)
    head = 0.5 / 5 * 4.0 / 3.0
    assert at[("p · gsm8k", "eagle3")] == pytest.approx(tokens / (2 * (2 * head + 1.4) + (head + 1.2)))
    assert not notes


def tree_run(root: Path) -> Path:
    """A dyn_tree run: two iterations of 4 nodes, depth 2, whose draft ran 4 forwards feeding 10 tokens."""
    run = write_run(root, "tree", "dyn_tree", [{"new": 9, "s": 1.0, "calls": 3, "drafted": 12, "accepted": 3, "k": 3}])
    return add_fields(run, {}, [{"call_stats": {"iterations": {"4": 2}, "depths": {"2": 2}, "reached": [2, 1],
                                                "accepted": [1, 1]},
                                 "call_seconds": {"verify_s": {"4": 2.0}, "draft_s": {"4": 0.4},
                                                  "draft_steps": {"4": 4}, "draft_tokens": {"4": 10}},
                                 "draft_calls": 6}])


def test_a_tree_run_uses_the_tree_costs(tmp_path):
    """Two iterations of 4 nodes, depth 2 (first accepted path 2 nodes, then none): alpha_1 = 1/2, alpha_2 = 1/1, so
    E[T|2] = 1 + 1/2 + 1/2 = 2 per iteration. Trees measured at 2 and 8 nodes (1.3 s, 1.9 s): 4 nodes 1.3 + 0.6 * 2/6
    = 1.5 s. The draft ran 4 forwards feeding 10 tokens (the root's, then a depth's nodes in one forward): 2.5 tokens
    each, 0.16 + 0.12 / 4 = 0.19 s at the profile's draft widths, 0.76 s for 8 nodes."""
    tree_run(tmp_path / "res")
    prof = write_profile(tmp_path / "profile.json", entry(trees={"2": 1.3, "8": 1.9}, drafts=True))
    ov, _ = overview_of(tmp_path / "res", prof)
    assert ov.values.loc[("p · gsm8k", "dyn_tree"), ("", "at test box")] == pytest.approx(
        (2 * 2) / (2 * 1.5 + 4 * 0.19) * 1.0)
    # below the smallest tree measured: from the one-token forward (a tree of 0 nodes), 1 node = 1.0 + 0.3 / 2
    assert profiles.tree_seconds(entry(trees={"2": 1.3, "8": 1.9}), 1) == pytest.approx(1.15)
    assert profiles.tree_seconds(entry(), 3) == pytest.approx(1.6) == profiles.chain_seconds(entry(), 4)  # no trees


def test_the_entry_of_the_runs_batch_size_dtype_and_path(tmp_path):
    """A run at batch_size 4 is costed by the B=4 entry; a batch size, dtype or path the profile lacks leaves
    the cell empty with a note naming what the profile has."""
    chain_run(tmp_path / "res")
    at_batch_size(chain_run(tmp_path / "tmp", "b4"), 4, to=tmp_path / "res" / "b4")
    at_batch_size(chain_run(tmp_path / "tmp", "b8"), 8, to=tmp_path / "res" / "b8")
    chain_run(tmp_path / "res", "half", dtype="bfloat16", gamma=9)
    b4 = entry(batch_size=4)
    b4["target_chain_s"] = {"1": 2.0, "2": 2.5, "4": 3.5, "8": 5.5}  # B=4: 2 s for one token, +0.5 s per token
    prof = write_profile(tmp_path / "profile.json", entry(), b4, entry(dtype="bfloat16", scale=2.0, path="compiled"))
    rep = report.build_report(load.load_runs(tmp_path / "res"),
                              projection=report.Projection(profiles.read(prof)))
    ov = next(t for t in rep.tables if t.name.startswith("overview"))
    at = ov.values[("", "at test box")]
    b4_truth = (2 * 7 / 3 + 5 / 3) / (2 * (2 * 0.1 + 3.0) + (0.1 + 2.5)) * 2.0
    assert at[("p · gsm8k · batch_size=4", "vanilla gamma=None")] == pytest.approx(b4_truth)
    assert at[("p · gsm8k · batch_size=1", "vanilla gamma=None")] == pytest.approx(CHAIN_TRUTH)
    assert at.isna()[("p · gsm8k · batch_size=8", "vanilla gamma=None")]
    notes = [n for n in rep.notes if "projection" in n]
    assert len(notes) == 2 and any("b8" in n and "no entry at path eager, batch_size 8" in n and "eager B=4 float32" in n
                               for n in notes)
    assert at.isna()[("p · gsm8k · batch_size=1", "vanilla gamma=9")]  # bfloat16: the profile's is compiled only
    assert any("half" in n and "no entry in the run's dtype bfloat16" in n and "eager, B=1: float32" in n
               for n in notes)


def test_a_profile_of_another_pair_is_refused_naming_both(tmp_path, capsys):
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    chain_run(tmp_path / "res", shapes=TOY)
    prof = write_profile(tmp_path / "gpu.json", entry("llama31_8b_1b_shaped", BIG, dtype="bfloat16", scale=0.01),
                         name="NVIDIA H200")
    with pytest.raises(profiles.ProfileError) as e:
        overview_of(tmp_path / "res", prof)
    said = str(e.value)
    assert "pair p (target llama 8 layers, hidden 128; draft llama 1 layer" in said  # the run's pair
    assert "llama31_8b_1b_shaped (target llama 32 layers, hidden 4096" in said  # the profile's
    assert str(prof) in said and "--profile-pair" in said
    # a profile entry named like the run's pair but of other shapes is another pair too
    prof2 = write_profile(tmp_path / "p2.json", entry("p", BIG))
    with pytest.raises(profiles.ProfileError, match="does not match the run's pair p"):
        overview_of(tmp_path / "res", prof2)
    # the CLI: an error, exit status 2
    assert report.main([str(tmp_path / "res"), "--no-figures", "--profile", str(prof)]) == 2
    err = capsys.readouterr().err
    assert "error: cost profile 'NVIDIA H200'" in err and "llama31_8b_1b_shaped" in err and "pair p " in err


def test_a_run_without_recorded_shapes_is_matched_by_pair_name(tmp_path):
    """Runs older than runtime.shapes: the entry of the run's pair name, at the entries' one dtype."""
    chain_run(tmp_path / "res", shapes=None, dtype=None)
    ok = write_profile(tmp_path / "ok.json", entry("p", BIG))
    assert overview_of(tmp_path / "res", ok)[0].values.loc[("p · gsm8k", "vanilla"), ("", "at test box")] == \
        pytest.approx(CHAIN_TRUTH)
    with pytest.raises(profiles.ProfileError, match="by pair name"):
        overview_of(tmp_path / "res", write_profile(tmp_path / "no.json", entry("q")))


def test_profile_pair_projects_onto_a_named_pair_whatever_the_shapes_and_dtype(tmp_path, capsys):
    """A toy run's iterations at the 8B pair's costs on a GPU: --profile-pair names the pair; its dtype is taken."""
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    chain_run(tmp_path / "res")
    gpu = entry("llama31_8b_1b_shaped", BIG, dtype="bfloat16")
    gpu["target_chain_s"] = {"1": 0.02, "2": 0.0202, "4": 0.0206, "8": 0.0214}  # +0.0002 s per token
    gpu["draft_token_s"] = 0.01
    prof = write_profile(tmp_path / "gpu.json", gpu, entry("qwen", {**BIG, "draft": TOY["draft"]}, dtype="bfloat16"),
                         name="NVIDIA H200")
    ov, notes = overview_of(tmp_path / "res", prof, "llama31_8b_1b_shaped")
    truth = (2 * 7 / 3 + 5 / 3) / (2 * (2 * 0.01 + 0.0204) + (0.01 + 0.0202)) * 0.02
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "at NVIDIA H200")] == pytest.approx(truth)
    assert "(pair llama31_8b_1b_shaped)" in ov.title and not notes
    out = tmp_path / "out"
    assert report.main([str(tmp_path / "res"), "--no-figures", "--out", str(out), "--profile", str(prof),
                        "--profile-pair", "llama31_8b_1b_shaped"]) == 0
    assert f"| {truth:.2f} |" in (out / "overview.md").read_text()
    capsys.readouterr()
    assert report.main([str(tmp_path / "res"), "--profile", str(prof), "--profile-pair", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "no pair 'nosuch'" in err and "llama31_8b_1b_shaped, qwen" in err
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "res"), "--profile-pair", "qwen"])  # without --profile: a usage error
    assert "--profile-pair needs --profile" in capsys.readouterr().err


@pytest.mark.parametrize("content,said", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ('{"format": 2, "entries": []}', "not a specbench cost profile"),
    ('{"format": 1, "name": "x", "entries": [{"pair": "p"}]}', "entry 0 lacks dtype, path, batch_size"),
])
def test_a_missing_or_invalid_profile_is_an_error_naming_the_file(tmp_path, capsys, content, said):
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    path = tmp_path / "bad profile.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(profiles.ProfileError, match=said) as e:
        profiles.read(path)
    assert str(path) in str(e.value)
    assert report.main([str(tmp_path / "res"), "--no-figures", "--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and str(path) in err and said in err


def test_a_run_records_its_pairs_shapes_as_a_profile_measures_them(tmp_path, capsys):
    """A real run and a real profile of one pair (tiny_random): the run's runtime.shapes are the profile entry's
    shapes, so the entry is found by them; a run of the pair with another target depth is refused by them."""
    from specbench.bench.cli import main as bench
    from specbench.runs.runner import run
    from helpers import small

    prof = tmp_path / "profile.json"
    assert bench(["verify", "--pair", "tiny_random", "--profile", str(prof), "--batch-sizes", "1", "--steps", "1",
                  "--threads", "1"]) == 0
    entry_shapes = json.loads(prof.read_text())["entries"][0]["shapes"]
    s = run(small("method=vanilla", "limit=1", "decode.max_new_tokens=8", "threads=1"), tmp_path / "res" / "v")
    assert s["runtime"]["shapes"] == entry_shapes and s["runtime"]["verify_hidden_layers"] == []
    runs = load.load_runs(tmp_path / "res")
    ov, notes = overview_of(tmp_path / "res", prof)
    value = ov.values.iloc[0][("", f"at {json.loads(prof.read_text())['name']}")]
    assert value > 0 and not notes, notes
    run(small("method=vanilla", "limit=1", "decode.max_new_tokens=8", "threads=1", "pair.target.num_hidden_layers=3"),
        tmp_path / "other" / "v")
    assert report.main([str(tmp_path / "other"), "--no-figures", "--profile", str(prof)]) == 2
    assert "does not match the run's pair tiny_random (target llama 3 layers" in capsys.readouterr().err
    assert runs["path"].tolist() == ["eager"] and runs["dtype"].tolist() == ["float32"]


def test_rows_record_the_draft_forwards_and_the_tokens_they_fed(tmp_path):
    """A chain at batch_size 1 runs one draft forward per drafted token, each of one token but the first of an
    iteration after a fully accepted block (the last draft and the bonus token: two); a dyn_tree iteration runs
    `depth` forwards, the root's and one per depth that feeds the depth's expanded nodes (up to top_k)."""
    from helpers import small
    from specbench.runs.runner import run

    run(small("method=vanilla", "limit=2", "decode.max_new_tokens=24", "threads=1"), tmp_path / "v")
    run(small("method=dyn_tree", "limit=2", "decode.max_new_tokens=24", "threads=1", "method.depth=3",
              "method.top_k=2", "method.total_nodes=6"), tmp_path / "t")
    for r in (json.loads(line) for line in (tmp_path / "v" / "rows.jsonl").read_text().splitlines()):
        steps, tokens, n = r["call_seconds"]["draft_steps"], r["call_seconds"]["draft_tokens"], r["call_stats"]["iterations"]
        assert steps == {w: int(w) * k for w, k in n.items()}  # one forward per drafted token
        assert all(int(w) * k <= tokens[w] <= (int(w) + 1) * k for w, k in n.items())
    for r in (json.loads(line) for line in (tmp_path / "t" / "rows.jsonl").read_text().splitlines()):
        steps, tokens, n = r["call_seconds"]["draft_steps"], r["call_seconds"]["draft_tokens"], r["call_stats"]["iterations"]
        assert all(steps[w] <= 3 * k for w, k in n.items()) and sum(steps.values()) < sum(int(w) * k for w, k in n.items())
        assert sum(tokens.values()) > sum(steps.values())  # a depth's nodes go through the draft in one forward
        assert all(tokens[w] <= (2 + 2 * 2) * k for w, k in n.items())  # root (at most 2) + 2 depths of top_k = 2


def test_the_costs_table_sets_the_runs_seconds_beside_the_profiles(tmp_path):
    """Per iteration: the run measured verify 3.0 s / 3 = 1.0 s and draft 0.5 s / 3; the profile charges the same
    iterations 2 x 1.4 + 1.2 = 4.0 s of verify (4/3 s each) and 5 one-token draft forwards of 0.1 s (0.5 s / 3)."""
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    chain_run(tmp_path / "res")
    prof = write_profile(tmp_path / "profile.json", entry())
    rep = report.build_report(load.load_runs(tmp_path / "res"), projection=report.Projection(profiles.read(prof)))
    table = next(t for t in rep.tables if t.name == "projection_costs")
    row = table.values.loc[("p · gsm8k · batch_size=1", "vanilla")].droplevel(0)
    assert row["iterations"] == 3
    assert row["verify ms (run)"] == pytest.approx(1e3) and row["verify ms (profile)"] == pytest.approx(4e3 / 3)
    assert row["verify run / profile - 1"] == pytest.approx(-0.25)
    assert row["draft ms (run)"] == pytest.approx(5e2 / 3) == pytest.approx(row["draft ms (profile)"])
    assert row["draft run / profile - 1"] == pytest.approx(0.0, abs=1e-12)
    assert table.cells.loc[("p · gsm8k · batch_size=1", "vanilla"), ("", "verify run / profile - 1")] == "-25.0%"
    assert table.values.loc[("p · gsm8k · batch_size=1", "ar")].isna().all()  # no call_stats in its rows
    assert "projection_costs" not in [t.name for t in report.build_report(load.load_runs(tmp_path / "res")).tables]


SPLIT = {"verify_forward_s": {"2": 1.6, "1": 0.8}, "draft_forward_s": {"2": 0.3, "1": 0.05},
         "host_s": {"2": 0.6, "1": 0.15}}  # per width: the iterations' forwards and host work (0.3 s + 0.15 s each)
AR_SPLIT = {"call_stats": {"iterations": {"0": 10}, "depths": {"0": 10}, "reached": [], "accepted": []},
            "call_seconds": {"verify_s": {"0": 0.9}, "draft_s": {"0": 0.0}, "verify_forward_s": {"0": 0.8},
                             "draft_forward_s": {"0": 0.0}, "host_s": {"0": 0.2}}}  # ar: 0.02 s of host a token


def test_host_work_is_kept_as_measured_on_both_sides(tmp_path):
    """A run whose rows split each iteration into forwards and host work: the profile prices the forwards, the host
    seconds stay as measured (0.3 s for each iteration of width 2, 0.15 s for width 1), and ar's step costs the
    profile's one-token forward plus ar's own host seconds per token (0.2 s / 10 = 0.02 s). Without an ar run that
    recorded its host work, or with a row older than the split, it is the forwards-only projection."""
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    add_fields(tmp_path / "res" / "ar", {}, [AR_SPLIT])
    run = chain_run(tmp_path / "res")
    add_fields(run, {}, [{**CHAIN, "call_seconds": {**CHAIN["call_seconds"], **SPLIT}, "draft_calls": 7}])
    prof = write_profile(tmp_path / "profile.json", entry())
    tokens = 2 * 7 / 3 + 5 / 3
    truth = tokens / (2 * (2 * 0.1 + 1.4 + 0.3) + (0.1 + 1.2 + 0.15)) * (1.0 + 0.02)
    ov, notes = overview_of(tmp_path / "res", prof)
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "at test box")] == pytest.approx(truth) and not notes
    rep = report.build_report(load.load_runs(tmp_path / "res"), projection=report.Projection(profiles.read(prof)))
    costs = next(t for t in rep.tables if t.name == "projection_costs").values.droplevel(0, axis=1)
    row = costs.loc[("p · gsm8k · batch_size=1", "vanilla")]
    assert row["host ms (run)"] == pytest.approx(1e3 * 0.75 / 3)
    assert row["verify ms (run)"] == pytest.approx(1e3 * 2.4 / 3)  # the forwards, not the phase's 3.0 s
    assert row["draft ms (run)"] == pytest.approx(1e3 * 0.35 / 3)
    assert costs.loc[("p · gsm8k · batch_size=1", "ar"), "host ms (run)"] == pytest.approx(20.0)
    # at the run's own forwards: verify 1.6 / 2 = 0.8 s (width 2) and 0.8 s (width 1), draft 0.35 s / 5 nodes, the
    # same host work; ar's forward 0.8 s / 10 and host 0.02 s a token
    own = tokens / (2 * (2 * 0.07 + 0.8 + 0.3) + (0.07 + 0.8 + 0.15)) * (0.08 + 0.02)
    assert row["projected at the run's own forwards"] == pytest.approx(own)
    assert np.isnan(costs.loc[("p · gsm8k · batch_size=1", "ar"), "projected at the run's own forwards"])
    # ar's rows without the split: forwards only, for the run too
    add_fields(tmp_path / "res" / "ar", {}, [{"call_stats": None, "call_seconds": None}])
    assert overview_of(tmp_path / "res", prof)[0].values.loc[("p · gsm8k", "vanilla"), ("", "at test box")] == \
        pytest.approx(CHAIN_TRUTH)


def test_a_run_with_some_rows_older_than_the_split_is_projected_on_forwards_only(tmp_path):
    """One row with the host split and one without: none of the split is used (a partial sum would charge the
    older row's iterations no host work)."""
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}] * 2)
    add_fields(tmp_path / "res" / "ar", {}, [AR_SPLIT, AR_SPLIT])
    run = write_run(tmp_path / "res", "vanilla", "vanilla", [{"new": 12, "s": 0.5, "calls": 5, "drafted": 7,
                                                             "accepted": 4, "k": 4}] * 2)
    split = {**CHAIN, "call_seconds": {**CHAIN["call_seconds"], **SPLIT}, "draft_calls": 7}
    add_fields(run, {}, [split, {**CHAIN, "draft_calls": 7}])
    prof = write_profile(tmp_path / "profile.json", entry("p", shapes={}))
    ov, _ = overview_of(tmp_path / "res", prof)
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "at test box")] == pytest.approx(CHAIN_TRUTH)


def test_a_tree_grown_by_the_pairs_draft_is_priced_at_the_drafts_tree_forwards(tmp_path):
    """The tree run of test_a_tree_run_uses_the_tree_costs with draft tree forwards in the profile (0.2 s at 1
    token, 0.3 s at 4): its 4 forwards of 2.5 tokens cost 0.2 + 0.1 * 1.5 / 3 = 0.25 s each, 1.0 s for 8 nodes."""
    tree_run(tmp_path / "res")
    prof = write_profile(tmp_path / "profile.json", {**entry(trees={"2": 1.3, "8": 1.9}, drafts=True),
                                                      "draft_tree_s": {"1": 0.2, "4": 0.3}})
    ov, _ = overview_of(tmp_path / "res", prof)
    assert ov.values.loc[("p · gsm8k", "dyn_tree"), ("", "at test box")] == pytest.approx((2 * 2) / (2 * 1.5 + 1.0))




def test_at_batch_size_3_a_rows_iterations_split_the_batchs_wall_time(tiny_pair):
    """At B > 1 a record holds the batch's seconds: over a row's iterations verify_forward_s + draft_forward_s +
    host_s sum to the wall time from the batch's start to the row's stop (its latency_s), and every row's records
    of one iteration are equal."""
    from helpers import pair_engine

    gens = pair_engine(tiny_pair, {"name": "vanilla"}).generate_batch([[1, 2, 3], [4, 5], [6, 7, 8, 9]], 10)
    for g in gens:
        total = sum(r.verify_forward_s + r.draft_forward_s + r.host_s for r in g.records)
        assert total == pytest.approx(g.latency_s, rel=1e-9)
        assert all(r.verify_forward_s > 0 and r.draft_forward_s >= 0 for r in g.records)
    first = [g.records[0] for g in gens]
    assert len({(r.verify_forward_s, r.draft_forward_s, r.host_s) for r in first}) == 1


def test_a_verify_that_returns_hidden_states_is_priced_at_the_profiles_such_forwards(tmp_path):
    """A run whose verifies returned hidden states (config.json runtime.verify_hidden_layers, as EAGLE-3's do) is
    priced at the entry's target_hidden_s (1.5 s at 1 token, 2.1 s at 4: 3 tokens 1.9 s, 2 tokens 1.7 s) where the
    entry has them, else at its plain forwards; its ar step stays the plain one-token forward."""
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    run = chain_run(tmp_path / "res")
    record = json.loads((run / "config.json").read_text())
    record["runtime"]["verify_hidden_layers"] = [2, 4, 5]
    write_json_atomic(run / "config.json", record)
    tokens = 2 * 7 / 3 + 5 / 3
    prof = write_profile(tmp_path / "h.json", {**entry(), "target_hidden_s": {"1": 1.5, "4": 2.1}})
    at = overview_of(tmp_path / "res", prof)[0].values.loc[("p · gsm8k", "vanilla"), ("", "at test box")]
    assert at == pytest.approx(tokens / (2 * (2 * 0.1 + 1.9) + (0.1 + 1.7)) * 1.0)
    plain = write_profile(tmp_path / "plain.json", entry())
    at = overview_of(tmp_path / "res", plain)[0].values.loc[("p · gsm8k", "vanilla"), ("", "at test box")]
    assert at == pytest.approx(CHAIN_TRUTH)


def test_the_profiles_forwards_compute_the_logits_the_loops_forwards_do(tiny_pair):
    """A verify computes the logits of every token it feeds (the rule reads each position) and a draft step those of
    its last token only: the profile's forward of a width must do the same work as the loop's forward of that width,
    else a large vocabulary's output layer is left out of its price (Qwen2.5-Coder's is 15% of a 6-token verify)."""
    from helpers import pair_engine
    from specbench.bench.profile import measure_entry

    def spy(model, seen):
        def hook(_module, _args, kwargs):
            seen.add((kwargs["input_ids"].shape[1], kwargs["logits_to_keep"]))
        return model.register_forward_pre_hook(hook, with_kwargs=True)

    target, draft = tiny_pair.model("target"), tiny_pair.model("draft")
    loop = {"target": set(), "draft": set()}
    hooks = [spy(target, loop["target"]), spy(draft, loop["draft"])]
    try:
        pair_engine(tiny_pair, {"name": "vanilla", "gamma": 4}).generate([1, 2, 3, 4, 5], 24)
    finally:
        for h in hooks:
            h.remove()
    verifies = {(w, k) for w, k in loop["target"] if w <= 5}  # the prompt's prefill aside
    assert {w for w, _ in verifies} >= {5} and all(k == w for w, k in verifies)
    drafts = {(w, k) for w, k in loop["draft"] if w <= 2}
    assert drafts and all(k == 1 for _, k in drafts)
    profile = {"target": set(), "draft": set()}
    hooks = [spy(target, profile["target"]), spy(draft, profile["draft"])]
    try:
        measure_entry(tiny_pair, "tiny_random", list(range(1, 40)), "eager", 1, 1, trees=())
    finally:
        for h in hooks:
            h.remove()
    assert verifies <= profile["target"] and drafts <= profile["draft"]  # each loop forward has its twin in the profile
    assert all(k == w for w, k in profile["target"] if w != 39) and all(k == 1 for _, k in profile["draft"])


def test_first_blocks_priced_at_the_profiles_prefills_by_hand(tmp_path):
    """With prefill costs the projection also prices every generation's first block, the measured speedup's own
    scope: the run's prompt of 20 tokens and first 2 drafts (w_1 = 7 drafted - 5 in call_stats) at the target's
    prefill of 22 tokens, the draft's prefill of 20 and one one-token draft forward; ar's prefill of 20 and its 11
    later one-token forwards."""
    ar = write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    add_fields(ar, rows=[{"prompt_tokens": 20, "call_stats": {"iterations": {"0": 11}, "depths": {"0": 11},
                                                             "reached": [], "accepted": []}}])
    run = chain_run(tmp_path / "res")
    add_fields(run, rows=[{"prompt_tokens": 20}])
    with_prefill = {**entry(), "target_prefill_s": {"16": 2.0, "32": 3.0}, "draft_prefill_s": {"16": 0.5, "32": 0.7}}
    later = 2 * (2 * 0.1 + 1.4) + (1 * 0.1 + 1.2)  # the iterations after the first, as in CHAIN_TRUTH
    first = (2.0 + 1.0 * 6 / 16) + (0.5 + 0.2 * 4 / 16) + 1 * 0.1  # target(22) + draft prefill(20) + 1 draft forward
    ar_s = (2.0 + 1.0 * 4 / 16) + 11 * 1.0
    truth = (12 / (later + first)) / (12 / ar_s)
    ov, notes = overview_of(tmp_path / "res", write_profile(tmp_path / "profile.json", with_prefill))
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "projected with 1st blocks")] == pytest.approx(truth)
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "that / measured - 1")] == pytest.approx(truth / 2.0 - 1)
    assert ov.values.loc[("p · gsm8k", "vanilla"), ("", "at test box")] == pytest.approx(CHAIN_TRUTH)  # unchanged
    assert not notes
    # a profile without prefills has no such column; a row of several turns is left out, said in a note
    ov, _ = overview_of(tmp_path / "res", write_profile(tmp_path / "plain.json", entry()))
    assert "projected with 1st blocks" not in ov.values.columns.get_level_values(1)
    add_fields(run, rows=[{"turn_outputs": ["a", "b"]}])
    ov, notes = overview_of(tmp_path / "res", write_profile(tmp_path / "profile.json", with_prefill))
    assert np.isnan(ov.values.loc[("p · gsm8k", "vanilla"), ("", "projected with 1st blocks")])
    assert any("first blocks left out" in n and "several turns" in n for n in notes)


def test_the_profile_measures_both_models_prefills_into_an_empty_cache(tiny_pair):
    """Eager B = 1 entries hold the target's and the draft's prefill of each PREFILL_TOKENS prompt length within the
    pair's context: a forward of that many tokens into an empty cache keeping the last token's logits, the forward a
    generation starts with."""
    from specbench.bench.profile import PREFILL_TOKENS, measure_entry

    seen: set = set()
    target = tiny_pair.model("target")
    hook = target.register_forward_pre_hook(
        lambda _m, _a, kw: seen.add((kw["input_ids"].shape[1], kw["logits_to_keep"], kw["cache"].get_seq_length())),
        with_kwargs=True)
    try:
        e = measure_entry(tiny_pair, "tiny_random", list(range(1, 40)), "eager", 1, 1, trees=(16,))
    finally:
        hook.remove()
    lengths = [n for n in PREFILL_TOKENS if n <= 512]  # tiny_random's context: 512 positions
    assert sorted(map(int, e["target_prefill_s"])) == lengths == sorted(map(int, e["draft_prefill_s"]))
    assert all(s > 0 for s in [*e["target_prefill_s"].values(), *e["draft_prefill_s"].values()])
    assert {(n, 1, 0) for n in lengths} <= seen


SHIPPED = sorted((ROOT / "profiles").glob("*/profile.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.parent.name)
def test_every_shipped_profile_reads_and_its_shaped_pairs_shapes_are_the_confs(path):
    """Each profiles/*/profile.json passes `read`, every cost in it is a positive finite number of seconds, and an
    entry of a shaped pair (conf/pair/*_shaped.yaml) records the shapes its conf gives each model."""
    data = profiles.read(path)
    assert data["entries"], path
    for e in data["entries"]:
        costs = [e["draft_token_s"]] + [s for key in ("target_chain_s", "target_tree_s", "draft_chain_s",
                                                         "draft_tree_s", "target_hidden_s", "target_prefill_s",
                                                         "draft_prefill_s") for s in (e.get(key) or {}).values()]
        assert all(np.isfinite(c) and c > 0 for c in costs), (path, e["pair"])
        if e["pair"].endswith("_shaped"):
            cfg = load_cfg(e["pair"])
            for role in ("target", "draft"):
                assert {k: cfg[role][k] for k in profiles.SHAPE_KEYS} == {k: e["shapes"][role][k] for k in
                                                                          profiles.SHAPE_KEYS}, (path, role)
    assert len(SHIPPED) >= 6


def with_cpu(run: Path, model: str, flags: list[str], gpu: str | None = None) -> None:
    """The machine a run's config.json records (runtime.cpu; device_info.gpu on CUDA)."""
    record = json.loads((run / "config.json").read_text())
    record["runtime"]["cpu"] = {"model": model, "flags": flags}
    record.setdefault("device_info", {}).update({"gpu": gpu} if gpu else {})
    write_json_atomic(run / "config.json", record)


@pytest.mark.parametrize("profile_hw, run_hw, said", [
    ({"cpu": {"model": "AMD EPYC", "flags": ["avx2"]}, "gpu": None}, ("AMD EPYC", ["avx2"], None), None),
    ({"cpu": {"model": "AMD EPYC", "flags": ["avx2"]}, "gpu": None}, ("Intel Xeon", ["avx2", "amx_bf16"], None),
     "the profile was measured on CPU AMD EPYC, the run on CPU Intel Xeon"),
    ({"cpu": {"model": "AMD EPYC", "flags": ["avx2"]}, "gpu": None}, ("AMD EPYC", ["avx2", "avx512f"], None),
     "the profile's CPU has avx2 of the speed-deciding features, the run's avx2 avx512f"),
    ({"cpu": {"model": "AMD EPYC", "flags": []}, "gpu": {"name": "NVIDIA H200", "driver": "580"}},
     ("AMD EPYC", [], None), "the profile was measured on NVIDIA H200, the run on CPU AMD EPYC"),
    (None, ("Intel Xeon", [], None), "the profile was measured on CPU AMD EPYC, the run on CPU Intel Xeon"),
])
def test_a_projection_onto_another_machines_profile_says_so_beside_the_figure(tmp_path, profile_hw, run_hw, said):
    """A profile records its CPU model and flags (or GPU); the overview marks a projection from another machine and
    names both in a note. A profile older than the record is read from its '- cpu: ' line."""
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    run = chain_run(tmp_path / "res")
    with_cpu(run, *run_hw)
    e = entry() if not (profile_hw or {}).get("gpu") else {**entry(), "device": profile_hw["gpu"]["name"]}
    prof = write_profile(tmp_path / "profile.json", e)
    data = json.loads(prof.read_text())
    if profile_hw is None:
        data["machine"] = ["- device: cpu (1 threads)", "- cpu: AMD EPYC, 2 CPU(s), Linux"]
    else:
        data["hardware"] = profile_hw
    write_json_atomic(prof, data)
    ov, notes = overview_of(tmp_path / "res", prof)
    cell = ov.cells.loc[("p · gsm8k", "vanilla"), ("", "at test box")]
    assert cell == f"{CHAIN_TRUTH:.2f}" + ("" if said is None else " (other machine)")
    assert [n for n in notes if "machine" in n or "CPU" in n] == ([] if said is None else [
        f"projection of {run} at 'test box': {said}"])


def test_a_written_profile_records_the_cpu_and_its_flags(tmp_path):
    from specbench.bench import profile as prof
    from specbench.runs.provenance import CPU_FLAGS, cpu_record

    prof.write(tmp_path / "p.json", "box", {"machine": []}, [entry()])
    hw = json.loads((tmp_path / "p.json").read_text())["hardware"]
    assert hw == {"cpu": cpu_record(), "gpu": None} and set(hw["cpu"]["flags"]) <= set(CPU_FLAGS)
    model = next(x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                 if x.startswith("model name"))  # Linux, as CI
    assert hw["cpu"]["model"] == model


def test_a_verify_that_fed_look_only_nodes_is_priced_at_what_it_fed(tmp_path):
    """Lookahead's verifies also feed its window's look-only nodes (call_seconds look_nodes): one iteration of 4
    candidates with 4 look nodes and one of 0 candidates with 6, both depth 2 or 0, are priced at trees of 8 and 6
    nodes, not of 4 and 0. Trees at 2 and 8 nodes (1.3 s, 1.9 s): 8 nodes 1.9 s, 6 nodes 1.3 + 0.6 * 4/6 = 1.7 s.
    alpha_1 = 1/1, alpha_2 = 0/1: E[T|2] = 2, E[T|0] = 1; one-hot drafts from the pool cost no draft forward."""
    run = write_run(tmp_path / "res", "lookahead", "lookahead",
                    [{"new": 3, "s": 1.0, "calls": 3, "drafted": 4, "accepted": 1, "k": 1}])
    add_fields(run, {}, [{"call_stats": {"iterations": {"4": 1, "0": 1}, "depths": {"2": 1, "0": 1},
                                         "reached": [1, 1], "accepted": [1]},
                          "call_seconds": {"verify_s": {"4": 2.0, "0": 1.5}, "draft_s": {"4": 0.0, "0": 0.0},
                                           "draft_steps": {"4": 0, "0": 0}, "draft_tokens": {"4": 0, "0": 0},
                                           "look_nodes": {"4": 4, "0": 6}}, "draft_calls": 0}])
    prof = write_profile(tmp_path / "profile.json", entry(trees={"2": 1.3, "8": 1.9}, drafts=True))
    ov, _ = overview_of(tmp_path / "res", prof)
    assert ov.values.loc[("p · gsm8k", "lookahead"), ("", "at test box")] == pytest.approx(
        (2 + 1) / (1.9 + (1.3 + 0.6 * 4 / 6)) * 1.0)
