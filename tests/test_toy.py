"""The toy pair and its task: data checked against Python arithmetic, tiny training runs end to end."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from helpers import ROOT, TINY, compose_cfg
from specbench.evaluators.toy_arith import ToyArith, extract_answer
from specbench.models import toy
from specbench.models.pairs import load_pair
from specbench.data.prompting import encode
from specbench.runs.runner import run
from specbench.runs import provenance
from specbench.data.toy_task import answer_text, heldout_set, is_heldout, problems

STEP = re.compile(r"(\d+) ([-+*]) (\d+) = (\d+)")


def tiny_cfg(cache: Path, *extra: str) -> dict:
    """conf/pair/toy.yaml shrunk to a few steps of tiny models, cached under `cache`."""
    cfg = compose_cfg("pair=toy", f"pair.cache_dir={cache}", *TINY, *extra)
    return OmegaConf.to_container(cfg.pair, resolve=True)


def test_problems_are_deterministic_and_their_arithmetic_is_right():
    a, b = problems(7, "train").take(300), problems(7, "train").take(300)
    assert a == b and a != problems(8, "train").take(300)
    for p in a:
        q_numbers = {int(x) for x in re.findall(r"\d+", p.question)}
        steps = STEP.findall(p.solution)
        assert len(steps) >= 2, p.solution
        results = set()
        for x, op, y, z in steps:
            assert eval(f"{x} {op} {y}") == int(z), p.solution  # recomputed by Python, not the generator
            assert {int(x), int(y)} <= q_numbers | results, f"operand not from the question: {p.solution}"
            results.add(int(z))
        assert p.solution.endswith(f"\n#### {steps[-1][3]}") and int(steps[-1][3]) == p.answer >= 0


def test_heldout_problems_never_appear_in_training():
    test = heldout_set(1234, 200)
    assert len({p.key for p in test}) == 200 and all(is_heldout(p.key) for p in test)
    assert heldout_set(1234, 200) == test
    train = problems(0, "train").take(5000)
    assert not {p.key for p in train} & {p.key for p in test}
    assert not {p.question for p in train} & {p.question for p in test}


def test_toy_arith_scoring():
    ds = ToyArith(n=3)
    ex = ds.examples()[0]
    right = answer_text(heldout_set(1234, 1)[0])
    assert ex.prompt == heldout_set(1234, 1)[0].question
    assert ds.score(ex, right)["score"] == 1.0
    assert ds.score(ex, right.replace(f"#### {ex.reference}", f"#### {ex.reference + 1}"))["score"] == 0.0
    assert ds.score(ex, right.split("####")[0])["score"] == 0.0  # no answer line
    assert ds.score(ex, f"{ex.reference} apples")["score"] == 0.0
    assert extract_answer("x = 3\n#### 1,204\n#### 7") == 1204 and extract_answer("#### ") is None


def test_prompt_encoding_matches_the_training_format(tmp_path):
    """The runner's plain-text prompt ids are exactly the prompt part of a training sequence."""
    tok = toy.train_tokenizer(0, 300, 200)
    p = heldout_set(1234, 1)[0]
    ids, mask, labels = toy.encode_batch(tok, [p])
    prompt = encode(tok, ToyArith(n=1).examples()[0])
    assert prompt[0] == tok.bos_token_id and ids[0, : len(prompt)].tolist() == prompt
    assert (labels[0, : len(prompt)] == -100).all() and labels[0, len(prompt)] == ids[0, len(prompt)]
    assert tok.decode(ids[0, mask[0].bool()], skip_special_tokens=True) == p.question + answer_text(p)


def test_tiny_training_loads_through_load_pair_and_decodes(tmp_path):
    cfg = tiny_cfg(tmp_path)
    pair = load_pair(cfg, torch.device("cpu"))
    folder = tmp_path / toy.config_hash(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]  # no temp folder left behind
    assert json.loads((folder / "toy.json").read_text())["config_hash"] == folder.name
    assert pair.target.config.num_hidden_layers == 2 and pair.draft.config.hidden_size == 16
    assert pair.vocab_size == len(pair.tokenizer) and pair.target.name_or_path == str(folder / "target")
    out = tmp_path / "run"
    overrides = ["dataset=toy_arith", "limit=2", "decode.max_new_tokens=6", "device=cpu", "warmup=0",
                 "progress=false", "pair=toy", f"pair.cache_dir={tmp_path}", *TINY]
    s = run(compose_cfg(*overrides), out)
    rows = [json.loads(r) for r in (out / "rows.jsonl").read_text().splitlines()]
    assert s["n_examples"] == 2 and all(r["score"] in (0.0, 1.0) and r["new_tokens"] >= 1 for r in rows)


def test_second_use_loads_without_training(tmp_path, monkeypatch):
    cfg = tiny_cfg(tmp_path)
    first = toy.ensure_trained(cfg)
    monkeypatch.setattr(toy, "train_isolated", lambda *a: pytest.fail("trained again"))
    assert toy.ensure_trained(cfg) == first
    monkeypatch.setenv(toy.ENV_CACHE, str(tmp_path))
    assert toy.ensure_trained({**cfg, "cache_dir": None}) == first  # the env var names the same cache
    assert toy.config_hash({**cfg, "seed": 1}) != first.name


def test_interrupted_training_leaves_no_folder(tmp_path, monkeypatch):
    cfg = tiny_cfg(tmp_path)

    def boom(role, *a):
        if role == "draft":
            raise KeyboardInterrupt
        return real(role, *a)

    real = toy.train_model
    monkeypatch.setattr(toy, "train_model", boom)
    monkeypatch.setattr(toy, "train_isolated", toy.train_pair)  # in this process, so the patch applies
    with pytest.raises(KeyboardInterrupt):
        toy.ensure_trained(cfg)
    assert list(tmp_path.iterdir()) == []


def test_training_twice_with_one_seed_gives_identical_weights(tmp_path):
    a = toy.ensure_trained(tiny_cfg(tmp_path / "a"))
    b = toy.ensure_trained(tiny_cfg(tmp_path / "b"))
    assert (a / "target" / "tokenizer.json").read_text() == (b / "target" / "tokenizer.json").read_text()
    for role in ("target", "draft"):
        wa, wb = load_file(a / role / "model.safetensors"), load_file(b / role / "model.safetensors")
        assert wa.keys() == wb.keys()
        for k in wa:
            assert torch.equal(wa[k], wb[k]), f"{role} {k} differs"
    c = toy.ensure_trained(tiny_cfg(tmp_path / "c", "pair.seed=1"))
    emb = "model.embed_tokens.weight"
    assert not torch.equal(load_file(a / "draft" / "model.safetensors")[emb],
                           load_file(c / "draft" / "model.safetensors")[emb])


def test_loaded_models_carry_the_recorded_weights_hash(tmp_path):
    cfg = tiny_cfg(tmp_path)
    pair = load_pair(cfg, torch.device("cpu"))
    folder = tmp_path / toy.config_hash(cfg)
    recorded = json.loads((folder / "toy.json").read_text())["weights_sha256"]
    assert recorded == toy.weights_sha256(folder) and len(set(recorded.values())) == 4
    assert pair.target.config.weights_sha256 == recorded["target"] != pair.draft.config.weights_sha256
    record = provenance.model_record(pair.draft)  # what a run's config.json records as runtime.models.draft
    assert record["weights_sha256"] == recorded["draft"] and record["path"] == str(folder / "draft")
    tied = {k: v for k, v in pair.draft.state_dict().items() if k != "lm_head.weight"}
    assert toy.tensors_sha256(tied) == recorded["draft"]  # the hash is of the tensors that were loaded
    weights = load_file(folder / "draft" / "model.safetensors")
    weights["model.norm.weight"][0] += 1e-6
    save_file(weights, folder / "draft" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="does not match the weights_sha256"):
        toy.build_toy(cfg, torch.device("cpu"))


TRAIN_AND_HASH = """
import json, sys, torch
from omegaconf import OmegaConf
sys.path.insert(0, "tests")
from helpers import TINY, compose_cfg
from specbench.models import toy
torch.set_num_threads(int(sys.argv[2]))
cfg = OmegaConf.to_container(compose_cfg("pair=toy", "pair.cache_dir=" + sys.argv[1], *TINY).pair, resolve=True)
print(json.loads((toy.ensure_trained(cfg) / "toy.json").read_text())["weights_sha256"]["pair"])
"""


def test_training_gives_the_same_hash_for_any_thread_count_and_tokenizer_parallelism(tmp_path):
    """Two processes that differ in torch threads, OpenMP/rayon threads, tokenizer parallelism and MKL's
    instruction set (as on an AVX2-only CPU) train bitwise identical weights."""
    settings = [("1", {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}),
                ("2", {"OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "true", "RAYON_NUM_THREADS": "2",
                       "MKL_ENABLE_INSTRUCTIONS": "AVX2"})]
    hashes = []
    for i, (threads, env) in enumerate(settings):
        out = subprocess.run([sys.executable, "-c", TRAIN_AND_HASH, str(tmp_path / str(i)), threads], cwd=ROOT,
                             env={**os.environ, **env}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        hashes.append(out.stdout.strip().splitlines()[-1])
    assert hashes[0] == hashes[1] and len(hashes[0]) == 64


def default_cfg() -> dict:
    """conf/pair/toy.yaml as the default run composes it."""
    return OmegaConf.to_container(compose_cfg("pair=toy").pair, resolve=True)


def test_the_default_pair_is_shipped_with_its_recorded_hash_and_loaded_without_training(monkeypatch):
    cfg = default_cfg()
    shipped = toy.SHIPPED / toy.config_hash(cfg)
    record = json.loads((shipped / "toy.json").read_text())
    assert record["config_hash"] == shipped.name and record["config"] == {k: cfg[k] for k in toy.TRAINED_KEYS}
    assert toy.weights_sha256(shipped) == record["weights_sha256"]
    monkeypatch.setattr(toy, "train_isolated", lambda *a: pytest.fail("the shipped pair was trained again"))
    assert toy.ensure_trained({**cfg, "cache_dir": "/nonexistent"}) == shipped
    pair = toy.build_toy(cfg, torch.device("cpu"))
    assert pair.target.name_or_path == str(shipped / "target")
    assert pair.draft.config.weights_sha256 == record["weights_sha256"]["draft"]


@pytest.mark.slow
def test_retraining_the_default_pair_reproduces_the_shipped_weights(tmp_path):
    """About 6 minutes of one core: the default config trained from scratch hashes to the shipped pair."""
    cfg = default_cfg()
    toy.train_isolated(cfg, tmp_path)
    shipped = json.loads((toy.SHIPPED / toy.config_hash(cfg) / "toy.json").read_text())
    assert toy.weights_sha256(tmp_path) == shipped["weights_sha256"]
