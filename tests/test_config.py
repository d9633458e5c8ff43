"""Every config composes, and bad input fails early with a message naming what is valid."""


import os
import re
from pathlib import Path
from typing import Any

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf

from helpers import CONF, compose_cfg, small
from specbench.runs.layout import job_dir, leaf, unsharded
from specbench.common.configs import differences, flatten
from specbench.common.options import OptionError
from specbench.data.dataset import DATASETS, build_dataset, select
from specbench.decoding.compose import PART_KEYS, part_classes, part_names
from specbench.decoding.policy import POLICIES
from specbench.models.pairs import check_vocab, load_model
from specbench.common.registry import UnknownNameError
from specbench.runs import runner, validation
from specbench.runs.identity import RESUMABLE_KEYS, TASK_RESUMABLE, names_folder
from specbench.runs.identity import identity as run_identity
from specbench.runs.runner import build_method, run
from specbench.runs.slurm import sweep_jobs
from specbench.runs import merge
from specbench.analysis import load
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
    for m in options("method"):  # a method's parts (its policy, drafter, shape and rule) are registered names
        cfg = OmegaConf.to_container(compose_cfg(f"method={m}").method)
        assert cfg["name"] == m and set(part_names(cfg)) == set(PART_KEYS)
        assert m in POLICIES or set(part_classes(cfg)) in ({"policy", "drafter", "shape"}, {"loop"})
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
    with pytest.raises(UnknownNameError, match="unknown policy .speculate_harder.; valid names: .*ar, .*gammatune, .*vanilla"):
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
    ("shard=3/2", "shard"),
    ("limit=0", "limit"),
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
    with pytest.raises(RuntimeError, match="no-model-here.*copy its Hugging Face cache"):
        load_model({"path": missing}, __import__("torch").device("cpu"))


def test_prompt_longer_than_context(tmp_path):
    short_ctx = ("pair.target.max_position_embeddings=24", "limit=3", "decode.max_new_tokens=4")
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


# ---- run identity: a run folder holds one configuration ------------------------------------------------

IN_PATH = {"pair", "method", "dataset", "decode", "experiment"}  # named by the folder's path (experiment: its sweep values)
EVERY_KEY = ("logger=wandb", "local=example")  # the composition that holds every logger and slurm key


def folder(cfg: DictConfig) -> Path:
    """The run folder a composed config writes to (specbench.runs.layout.job_dir), below its results root."""
    return job_dir(cfg).relative_to(cfg.paths.results)


def identity(cfg: DictConfig) -> dict:
    """What the resume check compares: the resolved config without the resumable keys."""
    return run_identity(validation.resolved(cfg))


def other(value: Any) -> str:
    """A command-line value unlike `value`."""
    if isinstance(value, bool):
        return str(not value).lower()
    if isinstance(value, (int, float)):
        return str(value + 1)
    if isinstance(value, list):
        return "[]" if value else "[x]"
    if isinstance(value, dict):
        return "null"  # an empty mapping (a struct: no new keys)
    return "1" if value is None else "other"


def typed(value: Any) -> str:
    """A value as a command-line override writes it (strings quoted)."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list):
        return "[" + ",".join(map(typed, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{typed(v)}" for k, v in value.items()) + "}"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)


def test_a_key_changes_the_run_folder_exactly_when_it_changes_the_run_identity():
    """Every key of the composed config, overridden alone with another value: a new folder if and only if the
    resume check sees another configuration (a resumable key such as threads, trace or logger.project keeps the
    folder; a key whose new value the folder name took for its default would keep it too, and fail here)."""
    base = compose_cfg(*EVERY_KEY)
    keys = flatten({k: v for k, v in OmegaConf.to_container(base).items() if k != "hydra"})
    assert {"threads", "trace", "logger.project", "slurm.partition", "paths.results", "method.gamma"} <= set(keys)
    wrong = []
    for key, value in keys.items():
        cfg = compose_cfg(*EVERY_KEY, f"{key}={other(value)}")
        new_folder, new_identity = folder(cfg) != folder(base), identity(cfg) != identity(base)
        if new_folder != new_identity:
            wrong.append(f"{key}: new folder {new_folder}, new identity {new_identity}")
    assert not wrong, wrong


def test_every_key_typed_at_its_default_value_names_no_folder():
    """`python run.py` and the same command with every key of the composed config typed at the value it already
    has (batch_size=1, engine.compile=false, device=auto, method.gamma=5, ...) write one folder."""
    base = compose_cfg()
    keys = flatten(validation.resolved(base))
    assert {"batch_size", "engine.compile", "device", "method.gamma", "decode.seed", "threads"} <= set(keys)
    every = compose_cfg(*(f"{k}={typed(v)}" for k, v in keys.items()))
    assert len(every.hydra.overrides.task) == len(keys) and identity(every) == identity(base)
    assert folder(every) == folder(base) == Path("toy/toy_arith/vanilla/greedy/default")
    assert folder(compose_cfg("batch_size=1")) == folder(base) != folder(compose_cfg("batch_size=2"))


def test_a_default_is_the_value_the_config_has_without_the_override():
    """A method option is at its default at the chosen method's own value; an interpolated default is resolved
    as the config would resolve it; a group selection the path names never names the folder."""
    assert folder(compose_cfg("method=sd2", "method.gamma=8")) == Path("toy/toy_arith/sd2/greedy/default")
    assert folder(compose_cfg("method=vanilla", "method.gamma=8")).name == "method.gamma=8"  # vanilla's is 5
    assert folder(compose_cfg("method=sd2", "method.gamma=5")).name == "method.gamma=5"
    assert folder(compose_cfg("method=distilled", "paths.drafters.distilled=/d", "method.drafter=/d")).name == "default"
    assert folder(compose_cfg("method=distilled", "method.drafter=/d")).name == "method.drafter=--d"
    assert folder(compose_cfg("decode=greedy", "method=vanilla", "decode.max_new_tokens=null")).name == "default"
    assert folder(compose_cfg("local=example")).name == "local=example"  # another option than the default's (none)
    assert folder(compose_cfg("batch_size=true")).name == "batch_size=true"  # strictly: true is not 1


def test_a_sweep_job_at_a_default_value_writes_the_folder_of_the_command_without_it():
    """The SD² sweep's seed-0 jobs type decode.seed=0 and method.gamma=8 (each method's γ but vanilla's): they
    write the folders of the commands without the keys at their defaults, run alone."""
    jobs = {tuple(j) for j in sweep_jobs(compose_cfg("experiment=sd2_table5")) if "dataset=gsm8k" in j}
    by_method = {dict(o.split("=", 1) for o in j)["method"]: j for j in jobs}
    alone = ("dataset=gsm8k", "decode=greedy", "decode.max_new_tokens=128")
    assert folder(compose_cfg(*by_method["sd2"])) == folder(compose_cfg(*alone, "method=sd2"))
    assert folder(compose_cfg(*by_method["distilled"])) == folder(compose_cfg(*alone, "method=distilled"))
    assert folder(compose_cfg(*by_method["vanilla"])) == folder(compose_cfg(*alone, "method=vanilla", "method.gamma=8"))
    assert folder(compose_cfg(*by_method["vanilla"])).name == "decode.max_new_tokens=128,method.gamma=8"


def test_only_resumable_keys_and_the_paths_names_stay_out_of_the_folder_name():
    """The folder name comes from specbench.runs.identity alone (no config file lists keys to leave out); a
    training task's own keys name its folder but the one its path names and those its resume check ignores."""
    assert [p.relative_to(CONF) for p in CONF.rglob("*.yaml") if "exclude_keys" in p.read_text()] == []
    assert all(not names_folder(".".join(p)) and not names_folder(".".join(p) + ".x") for p in RESUMABLE_KEYS)
    assert not any(names_folder(g) for g in IN_PATH) and names_folder("method.gamma") and names_folder("pair.name")
    for task, path_key in (("synth", "prompts"), ("distill", "kind")):
        assert folder(compose_cfg(f"task={task}", "task.seed=7")).name == "task.seed=7"
        assert folder(compose_cfg(f"task={task}", "task.seed=0", f"task.{TASK_RESUMABLE[task][0]}=3")).name == "default"
        assert not names_folder(f"task.{path_key}", task) and not names_folder("task.name", task)
    assert folder(compose_cfg("task=distill", "task.kind=sd2")) == Path("distill/toy/sd2/default")
    assert not names_folder("task.seed", "bench")  # a benchmark run's task node is resumable


def test_the_resume_check_the_report_and_merge_share_one_identity():
    """specbench.runs.identity is the one definition: the report's setting is the identity less the method (with
    the budget that ran and the device), merge's shard group the identity less the shard with limit kept; a config
    from before batch_size and engine.compile existed is the run at their defaults for all three."""
    cfg = validation.resolved(compose_cfg())
    old = {k: v for k, v in cfg.items() if k not in ("batch_size", "engine")}
    assert run_identity(old) == run_identity(cfg) != run_identity({**cfg, "batch_size": 2})
    assert run_identity(cfg) != run_identity({**cfg, "engine": {"compile": True}})
    setting = {k: v for k, v in run_identity(cfg).items() if k != "method"}
    setting["decode"] = {**setting["decode"], "max_new_tokens": load.budget(cfg)}
    assert load.setting_of({"config": cfg, "device_info": {"device": "cpu"}}) == {**setting, "device_info": {"device": "cpu"}}
    assert load.setting_of({"config": old}) == load.setting_of({"config": cfg})
    shard = {k: v for k, v in run_identity(cfg).items() if k != "shard"}
    assert merge.identity({**cfg, "shard": "1/2", "limit": 5}) == {**shard, "limit": 5} == merge.identity({**old, "limit": 5})


def test_a_drafter_folder_stays_out_of_the_folder_name_and_in_the_identity():
    """paths are resumable (a long path makes no folder name), but the folder a method loads is its
    method.drafter: resuming with another drafter is refused, not mixed."""
    a = compose_cfg("method=distilled")
    b = compose_cfg("method=distilled", "paths.drafters.distilled=/elsewhere")
    assert folder(a) == folder(b)
    assert differences(identity(a), identity(b)) == ["method.drafter ('results/distill/toy/distilled/default' vs '/elsewhere')"]


# ---- config hygiene ----------------------------------------------------------------------------------

def test_experiments_are_a_config_group():
    names = options("experiment")
    assert names == ["adasd_table1", "adasd_tables3_5", "gammatune_table2", "sd2_fig5", "sd2_table1", "sd2_table5",
                     "spec_bench_table"]
    assert compose_cfg().hydra.runtime.choices.experiment is None
    for name in names:
        cfg = compose_cfg(f"experiment={name}")
        assert cfg.hydra.runtime.choices.experiment == name and "method" in cfg.hydra.sweeper.params
    with pytest.raises(MissingConfigException) as err:
        compose_cfg("experiment=no_such_thing")
    assert all(n in str(err.value) for n in names)


@pytest.mark.parametrize("overrides,key", [
    (("method.gamma=???",), "method.gamma"),
    (("method=distilled", "paths.drafters.distilled=???"), "paths.drafters.distilled"),  # reached through method.drafter
    (("task=distill", "task.data=???"), "task.data"),
])
def test_a_mandatory_value_left_unset_fails_naming_its_key(tmp_path, monkeypatch, overrides, key):
    def no_load(*args):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(runner, "load_pair", no_load)
    with pytest.raises(OptionError, match=rf"mandatory config values are not set: {re.escape(key)}; .* {key}=<value>"):
        run(small(*overrides), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_paths_name_every_results_and_drafter_folder():
    for line in (line.split("#")[0] for p in CONF.rglob("*.yaml") if p != CONF / "paths/default.yaml"
                 for line in p.read_text().splitlines()):
        assert not re.search(r"(?<!paths\.)results", line), line
    folders = {}
    try:
        for task in ("bench", "synth", "distill"):
            cfg = compose_cfg(f"task={task}", "paths.results=/r")
            HydraConfig.instance().set_config(cfg)  # resolves ${hydra:...} as Hydra does
            folders[task] = (cfg.hydra.run.dir, cfg.hydra.sweep.subdir)
            # each sweep's own folder (multirun.yaml, submitit logs), named by its start time
            assert re.fullmatch(r"/r/\.sweeps/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{6}", cfg.hydra.sweep.dir)
    finally:
        HydraConfig.instance().cfg = None
    # a sweep's job writes the folder of the same command without -m (sweep.subdir is run.dir made absolute)
    assert folders == {"bench": ("/r/toy/toy_arith/vanilla/greedy/default",) * 2,
                       "synth": ("/r/synth/toy/toy_train/default",) * 2,
                       "distill": ("/r/distill/toy/distilled/default",) * 2}
    assert compose_cfg("task=distill", "paths.results=/r").task.data == "/r/synth/toy/toy_train/default"
    for kind in ("distilled", "sd2"):
        assert compose_cfg(f"method={kind}", "paths.results=/r").method.drafter == f"/r/distill/toy/{kind}/default"


def test_every_run_folder_is_a_leaf_and_a_slash_in_a_value_nests_nothing():
    default, override = (job_dir(compose_cfg(*o)) for o in ([], ["decode.max_new_tokens=64"]))
    assert default.parent == override.parent and (default.name, override.name) == ("default", "decode.max_new_tokens=64")
    shard = job_dir(compose_cfg("shard=0/40", "decode.max_new_tokens=64"))
    assert shard.parent == default.parent and shard.name == "decode.max_new_tokens=64,shard=0of40"
    # specbench.runs.merge's merged folder: the shard's name without the shard
    assert (unsharded(shard.name), unsharded("shard=3of4"), unsharded(override.name)) == (override.name, "default", None)
    assert leaf("method.drafter=/d/sd2/task.seed=1,shard=1/4") == "method.drafter=--d--sd2--task.seed=1,shard=1of4"
    assert leaf("x=2024/05/01") == "x=2024--05--01"  # only a whole value i/n reads iofn


def test_a_sweep_job_writes_below_the_working_directory_for_a_relative_results_root():
    cfg = compose_cfg("decode.max_new_tokens=64")
    try:
        HydraConfig.instance().set_config(cfg)
        assert cfg.hydra.sweep.subdir == os.path.join(os.getcwd(), "results/toy/toy_arith/vanilla/greedy/"
                                                      "decode.max_new_tokens=64")
        assert cfg.hydra.sweep.dir.startswith("results/.sweeps/")
    finally:
        HydraConfig.instance().cfg = None


def test_a_long_override_list_gets_a_short_distinct_folder_name():
    """Over 200 bytes a leaf keeps the start of its overrides and a hash of all of them: file systems refuse
    names over 255 bytes; different overrides stay apart and a shard still merges into its unsharded folder."""
    many = ",".join(f"pair.target.key_{i}={i * 7}" for i in range(20))
    a, b = leaf(many), leaf(many.replace("=133", "=134"))
    assert len(a.encode()) <= 200 and a != b and a.startswith("pair.target.key_0=0,")
    sharded = leaf(many.replace("key_3=21", "key_3=21,shard=2/8"))
    assert sharded.endswith(",shard=2of8") and len(sharded.encode()) < 255 and unsharded(sharded) == a
    assert leaf("limit=3,shard=0/4") == "limit=3,shard=0of4"  # short names are as before
