"""What every registered dataset keeps, checked for each one so a new dataset is tested without writing a test.

Each evaluator in DATASETS has a conf/dataset YAML; each YAML has the runner's keys from
conf/dataset_base; its examples load through the composed config from the local copy when the set has one (a
config with a data_dir: from the synthetic fixtures SYNTHETIC, and from the real copies DATA, tests/helpers.py);
and wherever an example is scored, the evaluator's reference answer for it scores full marks and the scored row
keeps `reference` and `extracted`.
"""

import pytest
from omegaconf import OmegaConf

import helpers
from helpers import CONF, ROOT, SOURCES, compose_cfg, data_folder, require_data
from specbench.data.dataset import DATASETS, PROMPT_KEYS, SELECTION_KEYS, NoLocalCopyError, build_dataset, select

LIMIT = 3
LOCAL_SPLITS = {"mmlu": ["dataset.split=test"], "xsum": ["dataset.split=test_1000"]}  # default splits: hub only
# sets the real data folder has no copy of (their synthetic fixtures are read instead)
NOT_SHARED = {"speed_bench": "../shared/data holds no SPEED-Bench copy (its prompts need the hub and prepare_data.py)"}


def dataset_files() -> dict[str, list[str]]:
    """Registered evaluator -> the conf/dataset files that run it (their `evaluator:` key, else their `name:`)."""
    found: dict[str, list[str]] = {name: [] for name in DATASETS.names()}
    for path in sorted((CONF / "dataset").glob("*.yaml")):
        node = OmegaConf.load(path)
        found.setdefault(node.get("evaluator") or node.name, []).append(path.stem)
    return found


FILES = dataset_files()
CASES = [(evaluator, file) for evaluator, files in FILES.items() for file in files]
# each config reading a data folder (its data_dir key) once per source (SOURCES), the others once
LOADS = [(evaluator, file, source) for evaluator, file in CASES
         for source in (SOURCES if "data_dir" in compose_cfg(f"dataset={file}").dataset else [None])]


@pytest.mark.parametrize("evaluator", DATASETS.names())
def test_every_registered_dataset_has_a_config(evaluator):
    assert FILES[evaluator], f"dataset {evaluator!r} is registered but no conf/dataset/*.yaml runs it"


@pytest.mark.parametrize("evaluator,file", CASES, ids=[file for _, file in CASES])
def test_every_dataset_config_has_the_prompt_keys_and_no_selection_keys(evaluator, file):
    cfg = compose_cfg(f"dataset={file}", "limit=2", "shard=1/2", "dataset.system_prompt=Be brief.")
    assert set(PROMPT_KEYS) <= set(cfg.dataset) and not set(SELECTION_KEYS) & set(cfg.dataset)
    assert (cfg.limit, cfg.shard, cfg.dataset.system_prompt) == (2, "1/2", "Be brief.")


@pytest.mark.parametrize("evaluator,file,source", LOADS, ids=[f"{f}-{s}" if s else f for _, f, s in LOADS])
def test_examples_load_and_reference_answers_score_full_marks(monkeypatch, evaluator, file, source):
    monkeypatch.chdir(ROOT)  # a dataset file named by a relative path
    cfg = compose_cfg(f"dataset={file}", f"limit={LIMIT}", *LOCAL_SPLITS.get(evaluator, []))
    node = OmegaConf.to_container(cfg.dataset, resolve=True)
    assert ("data_dir" in node) == (source is not None)
    if source == "real" and evaluator in NOT_SHARED:
        pytest.skip(NOT_SHARED[evaluator])
    if source is not None:
        node["data_dir"] = str(data_folder(source))
    ev = build_dataset(node)
    try:
        examples = select(ev.examples(), cfg.limit, cfg.shard)
    except NoLocalCopyError as err:  # a set that exists only online (tests run offline)
        pytest.skip(str(err))
    assert len(examples) == LIMIT and all(isinstance(e.id, str) and e.prompt for e in examples)
    for ex in examples:
        reference = ev.reference(ex)
        if reference is None:  # an example without a reference answer is not scored
            assert ev.score(ex, "")["score"] is None, f"{ex.id}: scored, but the evaluator gives no reference answer"
        else:
            got = ev.score(ex, reference)
            assert got["score"] == pytest.approx(1.0), (ex.id, reference)
            # a scored row is read alone: the answer it was compared with and what was taken from the output
            assert {"reference", "extracted"} <= set(got), f"{ex.id}: a scored row needs `reference` and `extracted`"


def test_missing_test_data_skips_and_fails_under_ci(monkeypatch, tmp_path):
    monkeypatch.setattr(helpers, "DATA", tmp_path / "absent")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="SPECBENCH_TEST_DATA"):
        require_data()
    for value in ("true", "1"):
        monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.fail.Exception, match=r"absent not found.*\(CI runs every test that reads it\)"):
            require_data()
    (tmp_path / "absent" / "gsm8k").mkdir(parents=True)
    assert require_data("gsm8k") == tmp_path / "absent" / "gsm8k"

