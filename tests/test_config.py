"""Every config composes, and bad input fails early with a message naming what is valid."""


import pytest
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from helpers import CONF, compose_cfg, small
from specbench.data.dataset import DATASETS, build_dataset, select
from specbench.decoding.method import METHODS
from specbench.models.pairs import check_vocab, load_model
from specbench.common.registry import UnknownNameError
from specbench.runs.runner import build_method, run
from specbench.models.tiny import byte_tokenizer

GROUPS = ["pair", "method", "dataset", "decode"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    cfg = compose_cfg(f"{group}={option}")
    OmegaConf.to_container(cfg[group], resolve=True)  # no dangling interpolation
    assert cfg.hydra.runtime.choices[group] == option


def test_config_names_are_registered():
    for m in options("method"):
        assert compose_cfg(f"method={m}").method.name == m and m in METHODS
    for d in options("dataset"):  # a dataset runs the evaluator registered under its name, or its `evaluator`
        dataset = compose_cfg(f"dataset={d}").dataset
        assert dataset.name == d and dataset.get("evaluator", d) in DATASETS
    for p in options("pair"):
        assert compose_cfg(f"pair={p}").pair.name == p


def test_decode_groups_carry_the_sampling_keys():
    for d in ("greedy", "t1"):
        cfg = compose_cfg(f"decode={d}").decode
        assert set(cfg) >= {"temperature", "top_k", "top_p", "max_new_tokens", "seed"}
    assert compose_cfg("decode=greedy").decode.temperature == 0
    assert compose_cfg("decode=t1").decode.temperature == 1


@pytest.mark.parametrize("group", GROUPS)
def test_unknown_group_option_lists_valid_ones(group):
    with pytest.raises(MissingConfigException) as err:
        compose_cfg(f"{group}=no_such_thing")
    assert all(o in str(err.value) for o in options(group))


def test_unknown_method_and_dataset_names_list_valid_ones():
    with pytest.raises(UnknownNameError, match="valid names: .*ar, .*draft_only, .*vanilla"):
        build_method({"name": "speculate_harder"})
    with pytest.raises(UnknownNameError, match="smoke"):
        build_dataset({"name": "no_such_set"})
    with pytest.raises(ValueError, match="unknown options"):
        build_method({"name": "vanilla", "gama": 3})


@pytest.mark.parametrize("override,match", [
    ("decode.max_new_tokens=0", "decode.max_new_tokens must be an integer >= 1"),
    ("decode.max_new_tokens=-3", "decode.max_new_tokens must be an integer >= 1"),
    ("decode.temperature=-0.5", "decode.temperature must be a finite number >= 0"),
    ("method.gamma=0", "method.gamma must be an integer >= 1"),
    ("dataset.shard=3/2", "shard"),
    ("dataset.limit=0", "limit"),
    ("on_long_prompt=drop", "on_long_prompt"),
])
def test_bad_settings_fail_before_anything_is_written(tmp_path, override, match):
    with pytest.raises(ValueError, match=match):
        run(small("method=vanilla", override), tmp_path / "run")
    assert not (tmp_path / "run" / "rows.jsonl").exists()


def test_different_vocabularies_are_refused():
    a, b = byte_tokenizer(), byte_tokenizer()
    b.add_tokens(["<extra>"])
    with pytest.raises(ValueError, match=r"'t-model' \(vocabulary 259\).*'d-model' \(vocabulary 260\)"):
        check_vocab("t-model", a, "d-model", b)
    check_vocab("t-model", a, "d-model", byte_tokenizer())  # same vocabulary passes


def test_missing_local_model_names_it_and_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = str(tmp_path / "no-model-here")
    with pytest.raises(RuntimeError, match="no-model-here.*prepare-offline-models"):
        load_model({"path": missing}, __import__("torch").device("cpu"))


def test_prompt_longer_than_context(tmp_path):
    short_ctx = ("pair.target.max_position_embeddings=24", "dataset.limit=3", "decode.max_new_tokens=4")
    with pytest.raises(ValueError, match="prompt has .* tokens but the model context is 24"):
        run(small("method=vanilla", *short_ctx), tmp_path / "a")
    assert not (tmp_path / "a" / "rows.jsonl").exists() or not (tmp_path / "a" / "rows.jsonl").read_text()
    summary = run(small("method=vanilla", "on_long_prompt=truncate", *short_ctx), tmp_path / "b")
    rows = [__import__("json").loads(x) for x in (tmp_path / "b" / "rows.jsonl").read_text().splitlines()]
    assert summary["n_examples"] == 3 and all(r["prompt_truncated_from"] > 24 for r in rows)
    assert all(r["prompt_tokens"] + r["new_tokens"] <= 24 for r in rows)


def test_shard_and_limit_are_deterministic():
    ex = build_dataset({"name": "smoke"}).examples()
    parts = [select(ex, 10, f"{i}/3") for i in range(3)]
    assert sorted(e.id for p in parts for e in p) == sorted(e.id for e in ex[:10])
    assert [e.id for e in parts[1]] == [ex[i].id for i in (1, 4, 7)]
