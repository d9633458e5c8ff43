"""The target's features cached once (specbench.training.features): each cached row equals the target's own forward
of that row alone; a run on the cache trains what a run on the live target trains; the cache is reused, completed
after a partial write, and refused for another target."""

import copy
import json

import pytest
import torch
from omegaconf import OmegaConf

from helpers import compose_cfg, small
from specbench.common.errors import InputError
from specbench.models.pairs import load_pair
from specbench.runs.runner import run
from specbench.training import features as F

SYNTH = ("task=synth", "task.n=14", "task.max_new_tokens=12", "task.batch_size=7")
TRAIN = ("task=distill", "task.val_n=2", "task.batch_size=4", "task.max_steps=3", "task.warmup_steps=1",
         "task.eval_every=3", "task.save_every=100", "threads=1", "task.ttt_steps=2", "task.draft_vocab=64")


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    run(small(*SYNTH), out)
    return out


@pytest.fixture(scope="module")
def target():
    cfg = compose_cfg("pair=tiny_random", "device=cpu")
    return load_pair(OmegaConf.to_container(cfg.pair, resolve=True), torch.device("cpu")).target


def seqs(n: int = 9) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(3, 200, (int(L),), generator=g).tolist(), 2) for L in torch.randint(4, 12, (n,), generator=g)]


def write(folder, target, rows, layers=(1, 2), process=0, processes=1):
    who = F.target_identity(target)
    F.write_cache(folder, target, who, rows, layers, pad=0, bs=4, process=process, processes=processes)
    return who


def test_each_cached_row_is_the_targets_forward_of_that_row_alone(tmp_path, target, monkeypatch):
    monkeypatch.setattr(F, "SHARD_ROWS", 4)  # 3 shards
    rows = seqs()
    who = write(tmp_path, target, rows)
    meta = F.finish_cache(tmp_path, who, rows, (1, 2), 0.5)
    assert meta["rows"] == 9 and meta["tokens"] == sum(len(s) for s, _ in rows) and meta["bytes"] > 0
    cache = F.Cached(tmp_path, target, 256, who)
    ids, mask, _, _ = F.make_batch(rows[2:7], 0)
    got = cache(ids, mask, torch.arange(2, 7))
    for b, (s, _) in enumerate(rows[2:7]):
        with torch.no_grad():
            hs = target(input_ids=torch.tensor([s]), output_hidden_states=True).hidden_states
        n = len(s)
        torch.testing.assert_close(got.states[b, :n, 0], hs[1][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.states[b, :n, 1], hs[2][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.final[b, :n], hs[-1][0], rtol=1e-5, atol=1e-5)
        assert not got.final[b, n:].any()  # padding: zeros
    with torch.no_grad():  # π_V's logits from the final state are the model's
        want = target(input_ids=torch.tensor([rows[0][0]])).logits[0, :, :256]
    torch.testing.assert_close(cache.logits(cache(*F.make_batch(rows[:1], 0)[:2], torch.tensor([0])).final[0]), want,
                               rtol=1e-5, atol=1e-5)


def test_a_partly_written_cache_is_completed_to_what_one_write_gives(tmp_path, target, monkeypatch):
    monkeypatch.setattr(F, "SHARD_ROWS", 4)
    rows = seqs()
    write(tmp_path / "half", target, rows, process=0, processes=2)  # shards 0 and 2 of 3, as a killed run leaves
    assert sorted(p.name for p in (tmp_path / "half").iterdir()) == ["shard-00000.safetensors",
                                                                     "shard-00002.safetensors"]
    who = write(tmp_path / "half", target, rows)
    write(tmp_path / "whole", target, rows)
    for name in ("shard-00000", "shard-00001", "shard-00002"):
        a = (tmp_path / "half" / f"{name}.safetensors").read_bytes()
        assert a == (tmp_path / "whole" / f"{name}.safetensors").read_bytes()
    assert who["weights_sha256"] == F.tensors_sha256(target.state_dict())


def test_a_cache_of_more_layers_serves_a_run_of_fewer(tmp_path, target, monkeypatch):
    """A complete cache of layers (1, 2) serves a run of layer 2 alone and a run of none, with the live target's
    states, and nothing new is written; one from another target does not serve, and the run writes its own."""
    from accelerate import Accelerator

    from specbench.models.pairs import Pair

    rows, pair = seqs(), Pair("tiny", target, None, None, 256)  # type: ignore[arg-type]
    acc = Accelerator(cpu=True)
    F.target_features(acc, pair, str(tmp_path), rows, (1, 2), 0, 4, False)
    ids, mask, _, _ = F.make_batch(rows[:3], 0)
    for layers in ((2,), ()):
        got = F.target_features(acc, pair, str(tmp_path), rows, layers, 0, 4, False)
        want = F.Live(target, 256, layers)(ids, mask, torch.arange(3))
        keep = mask.bool()[..., None, None]  # the rows' own positions (the cache pads with zeros)
        torch.testing.assert_close(got(ids, mask, torch.arange(3)).states * keep, want.states * keep, rtol=1e-5,
                                   atol=1e-5)
    assert [p.name.split("-")[:3] for p in tmp_path.iterdir()] == [["layers", "1", "2"]]
    other = copy.deepcopy(target)
    with torch.no_grad():
        next(other.parameters()).view(-1)[0] += 1e-3
    F.target_features(acc, Pair("tiny", other, None, None, 256), str(tmp_path), rows, (2,), 0, 4, False)  # type: ignore[arg-type]
    assert sorted(p.name.split("-")[1] for p in tmp_path.iterdir()) == ["1", "2"]  # its own cache of layer 2


def test_a_cache_of_another_target_is_refused(tmp_path, target, monkeypatch):
    rows = seqs()
    who = write(tmp_path, target, rows)
    F.finish_cache(tmp_path, who, rows, (1, 2), 0.1)
    other = copy.deepcopy(target)
    with torch.no_grad():
        next(other.parameters()).view(-1)[0] += 1e-3  # one weight differs
    with pytest.raises(InputError, match="features cache .* was computed by target .* not this run's"):
        F.Cached(tmp_path, other, 256, F.target_identity(other))
    (tmp_path / F.META).unlink()  # shards only, as a killed write leaves them
    with pytest.raises(InputError, match="shard .* was computed by another target"):
        write(tmp_path, other, rows)


@pytest.mark.parametrize("kind", ["sd2", "eagle3", "medusa"])
def test_training_on_the_cache_equals_training_on_the_live_target(tmp_path, synth_dir, kind):
    common = (*TRAIN, f"task.kind={kind}", f"task.data={synth_dir}")
    live = run(small(*common, "task.features=null"), tmp_path / "live")
    cached = run(small(*common, f"task.features={tmp_path / 'cache'}"), tmp_path / "cached")
    assert live["features"] is None and cached["features"]["rows"] == 14
    logs = [[json.loads(x) for x in (tmp_path / d / "train_log.jsonl").read_text().splitlines()]
            for d in ("live", "cached")]
    for a, b in zip(*logs, strict=True):
        for key in a.keys() - {"step"}:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (key, a, b)
    again = run(small(*common, f"task.features={tmp_path / 'cache'}", "task.seed=1"), tmp_path / "again")
    assert again["features"] == cached["features"]  # reused, not written again (same meta, same seconds)


@pytest.mark.parametrize("where, said", [("file", "a file, not a folder"), ("file/below", "Not a directory"),
                                         ("missing/below", None)])
def test_a_features_folder_that_cannot_hold_the_cache_is_refused_by_name(tmp_path, synth_dir, where, said):
    (tmp_path / "file").write_text("")
    folder = tmp_path / where
    if said is None:  # a folder that does not exist yet is made
        info = run(small(*TRAIN, "task.kind=distilled", f"task.data={synth_dir}", f"task.features={folder}"),
                   tmp_path / "ok")
        assert info["features"]["rows"] == 14 and any(folder.glob("*/meta.json"))
        return
    with pytest.raises(InputError, match=rf"task.features {folder}: cannot hold the target's features \({said}\)"):
        run(small(*TRAIN, f"task.data={synth_dir}", f"task.features={folder}"), tmp_path / "d")
    assert not (tmp_path / "d").exists()
