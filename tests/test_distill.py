"""Synthetic data and drafter training (task=synth, task=distill) against independent truth: scipy's
KL and chi-square, hand-computed schedules, an uninterrupted run for resume, `ar` for losslessness."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import rel_entr
from scipy.stats import chisquare
from omegaconf import OmegaConf
from safetensors.torch import load_file

from helpers import TINY, compose_cfg, small
from specbench.common.errors import InputError
from specbench.training import distill
from specbench.data.dataset import DataSourceError
from specbench.training.distill import kl_per_position, lr_factor, make_batch, sequences
from specbench.runs.runner import run
from specbench.training.synth import sample_batch

SYNTH = ("task=synth", "task.n=10", "task.max_new_tokens=12", "task.batch_size=4")


def rows(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "rows.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    run(small(*SYNTH), out)
    return out


def test_synth_rows_hold_prompts_and_verifier_continuations(synth_dir, tiny_pair):
    got = rows(synth_dir)
    assert [r["id"] for r in got] == [f"toy_train-{i:05d}" for i in range(10)]
    from specbench.data.toy_task import problems

    questions = [p.question for p in problems(0, "train").take(10)]
    for r, q in zip(got, questions):
        assert r["source"] == "toy_train" and r["prompt"] == q
        assert r["prompt_ids"] == tiny_pair.tokenizer(q)["input_ids"]  # plain-text prompt, as the benchmark encodes it
        assert 1 <= len(r["token_ids"]) <= 12 and r["stop_reason"] in ("eos", "length")
    summary = json.loads((synth_dir / "summary.json").read_text())
    assert summary["n_rows"] == 10 and summary["source"] == "toy_train" and summary["config"]["task"]["n"] == 10


def test_synth_resumes_extends_and_refuses_other_settings(tmp_path, synth_dir):
    out = tmp_path / "s"
    shutil.copytree(synth_dir, out)
    lines = (out / "rows.jsonl").read_text().splitlines(keepends=True)
    (out / "rows.jsonl").write_text("".join(lines[:5]) + lines[5][:20])  # a crash inside batch 1, mid-row
    run(small(*SYNTH), out)
    assert rows(out) == rows(synth_dir)  # batch 1 re-sampled with its own seed: the same tokens
    run(small(*SYNTH, "task.n=13"), out)
    assert rows(out)[:10] == rows(synth_dir) and len(rows(out)) == 13
    with pytest.raises(ValueError, match=r"different configuration \(saved vs now: "
                                         r"task\.temperature \(1\.0 vs 0\.5\)\)"):
        run(small(*SYNTH, "task.temperature=0.5"), out)


def test_generate_samples_at_temperature_one_without_truncation(tiny_pair):
    """First sampled token of 4000 copies of one prompt vs the target's softmax over the tokenizer's 259
    ids (chi-square). The tail outside the top 50 tokens holds enough mass that generate's default
    top-k = 50 would fail it, and sampling a padding id (259..263) fails the bincount length check."""
    model, prompt = tiny_pair.target, tiny_pair.tokenizer("Once upon a time")["input_ids"]
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt])).logits[0, -1, : tiny_pair.vocab_size].double(), -1).numpy()
    assert np.sort(p)[::-1][50:].sum() > 0.2
    out = sample_batch(model, [prompt] * 4000, 1, 1.0, tiny_pair.tokenizer.pad_token_id, [10_000], 3,
                       tiny_pair.vocab_size)  # 259 tokens of the target's 264 logits
    counts = np.bincount([ids[0] for ids, _ in out], minlength=len(p))
    assert len(counts) == len(p) == 259
    big = p * 4000 >= 5  # pool rare tokens so every expected count is >= 5
    f_obs = np.append(counts[big], counts[~big].sum())
    f_exp = np.append(p[big], p[~big].sum()) * 4000
    assert chisquare(f_obs, f_exp).pvalue > 1e-3


def test_prompt_sets_name_their_source_when_missing(tmp_path):
    with pytest.raises(DataSourceError, match="UltraChat_200k train_sft.*ultrachat/train_sft.jsonl"):
        run(small("task=synth", "task.prompts=ultrachat", f"task.data_dir={tmp_path}"), tmp_path / "out")
    with pytest.raises(Exception, match="prompt set 'nope'; valid names: gsm8k_train, toy_train, ultrachat"):
        run(small("task=synth", "task.prompts=nope"), tmp_path / "out2")


@pytest.mark.parametrize("task", ["bench", "synth", "distill"])
def test_task_options_compose(task):
    cfg = compose_cfg(f"task={task}")
    assert OmegaConf.to_container(cfg.task, resolve=True)["name"] == task
    assert cfg.hydra.runtime.choices.task == task


def test_kl_matches_scipy():
    g = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(5, 30, generator=g) * 3, torch.randn(5, 30, generator=g) * 3
    p, q = torch.softmax(p_logits.double(), -1).numpy(), torch.softmax(q_logits.double(), -1).numpy()
    want = rel_entr(p, q).sum(-1)
    np.testing.assert_allclose(kl_per_position(p_logits, q_logits).numpy(), want, rtol=1e-4)


def test_lr_schedule_hand_values():
    steps, warmup = 110, 10  # warm-up lr/10 -> lr, cosine lr -> lr/10 (SD² A.3)
    assert lr_factor(0, steps, warmup) == pytest.approx(0.1)
    assert lr_factor(5, steps, warmup) == pytest.approx(0.55)
    assert lr_factor(10, steps, warmup) == pytest.approx(1.0)
    assert lr_factor(60, steps, warmup) == pytest.approx(0.55)  # cosine midpoint: 0.1 + 0.9 * 0.5
    assert lr_factor(110, steps, warmup) == pytest.approx(0.1)


def test_batches_mask_the_continuation_positions():
    seqs = sequences([{"prompt_ids": [1, 2, 3], "token_ids": [4, 5]}, {"prompt_ids": [1, 2], "token_ids": [6] * 9},
                      {"prompt_ids": [7] * 6, "token_ids": [8]}], max_length=6)
    assert seqs == [([1, 2, 3, 4, 5], 3), ([1, 2, 6, 6, 6, 6], 2)]  # the third has no continuation left
    ids, mask, where, P = make_batch(seqs, pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 4, 5, 0], [1, 2, 6, 6, 6, 6]] and mask.sum().item() == 11
    assert where.tolist() == [[False, False, True, True, False, False], [False, True, True, True, True, False]]
    assert P.tolist() == [3, 2]


DISTILL = ("task=distill", "task.val_n=2", "task.max_steps=6", "task.batch_size=3", "task.save_every=2",
           "task.eval_every=3", "task.warmup_steps=2")


@pytest.mark.parametrize("kind", ["distilled", "sd2"])
def test_training_resumes_from_a_checkpoint_to_the_same_state(tmp_path, synth_dir, monkeypatch, kind):
    args = (*DISTILL, f"task.kind={kind}", f"task.data={synth_dir}")
    straight = run(small(*args), tmp_path / "straight")
    real = distill.save_atomic

    def crash_after_second_checkpoint(obj, path):
        real(obj, path)
        if obj["step"] == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(distill, "save_atomic", crash_after_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        run(small(*args), tmp_path / "resumed")
    assert not (tmp_path / "resumed" / "distill.json").exists()
    monkeypatch.setattr(distill, "save_atomic", real)
    resumed = run(small(*args), tmp_path / "resumed")
    files = ["drafter/model.safetensors"] + (["steering.safetensors"] if kind == "sd2" else [])
    for f in files:
        a, b = load_file(tmp_path / "straight" / f), load_file(tmp_path / "resumed" / f)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f
    logs = [(tmp_path / d / "train_log.jsonl").read_text() for d in ("straight", "resumed")]
    assert logs[0] == logs[1]
    assert straight["steps"] == resumed["steps"] == 6 and not (tmp_path / "resumed" / "checkpoint.pt").exists()
    # the weights moved: the trained drafter is not the pair's draft
    from specbench.models.pairs import load_pair

    draft = load_pair(OmegaConf.to_container(small().pair, resolve=True), torch.device("cpu")).draft
    trained = load_file(tmp_path / "straight" / "drafter" / "model.safetensors")
    assert not torch.equal(trained["model.layers.0.mlp.up_proj.weight"], draft.model.layers[0].mlp.up_proj.weight)


def test_distilled_greedy_equals_ar(tmp_path, synth_dir):
    run(small(*DISTILL, "task.kind=distilled", f"task.data={synth_dir}"), tmp_path / "d")
    common = ("decode.max_new_tokens=32", "limit=8")
    run(small("method=ar", *common), tmp_path / "ar")
    s = run(small("method=distilled", f"method.drafter={tmp_path / 'd'}", *common), tmp_path / "run")
    for a, b in zip(rows(tmp_path / "ar"), rows(tmp_path / "run")):
        assert a["id"] == b["id"] and a["token_ids"] == b["token_ids"], a["id"]
    assert s["lossless"] and 0.05 < s["acceptance_rate"] < 0.95 and s["choices"]["method"] == "distilled"


def test_bad_distill_settings_fail_before_training(tmp_path, synth_dir):
    with pytest.raises(ValueError, match="unknown task.kind 'eagle'; valid: distilled, sd2"):
        run(small("task=distill", "task.kind=eagle", f"task.data={synth_dir}"), tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="no finished synth run"):
        run(small("task=distill", f"task.data={tmp_path / 'nothing'}"), tmp_path / "b")
    with pytest.raises(ValueError, match="val_n must be in 1..9"):
        run(small("task=distill", f"task.data={synth_dir}", "task.val_n=10"), tmp_path / "c")
    with pytest.raises(ValueError, match="sampled from pair 'tiny_random' with another configuration"):
        run(small("task=distill", f"task.data={synth_dir}", "pair.seed=1"), tmp_path / "d")
    assert not any((tmp_path / x).exists() for x in "abcd")


@pytest.mark.parametrize("kind", ["distilled", "sd2"])
def test_short_training_on_the_toy_pair_lowers_the_held_out_kl(tmp_path, kind):
    """The toy pair shrunk as in test_toy (trained in about a second into tmp_path), 48 verifier
    samples, 40 steps: the KL on 8 held-out samples goes down."""
    toy = ("pair=toy", f"pair.cache_dir={tmp_path / 'toy'}", *TINY, "device=cpu", "progress=false")
    run(compose_cfg(*toy, "task=synth", "task.n=48", "task.max_new_tokens=24", "task.batch_size=16"), tmp_path / "s")
    info = run(compose_cfg(*toy, "task=distill", f"task.kind={kind}", f"task.data={tmp_path / 's'}", "task.val_n=8",
                           "task.max_steps=40", "task.batch_size=8", "task.lr=3e-3", "task.warmup_steps=4"),
               tmp_path / "d")
    assert info["val_kl_final"] < 0.8 * info["val_kl_initial"], info
    log = [json.loads(x) for x in (tmp_path / "d" / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["val_kl"] == info["val_kl_initial"] and log[-1]["step"] == 40
    assert log[-1]["val_top1"] == info["val_top1_final"] and (tmp_path / "d" / "curve.png").stat().st_size > 1000
    if kind == "distilled":  # the held-out greedy agreement, from cache-free forwards of the target and the drafter
        assert info["val_top1_final"] == [pytest.approx(held_out_agreement(compose_cfg(*toy), tmp_path, 8))]


def held_out_agreement(cfg, tmp_path: Path, val_n: int) -> float:
    """The share of the last val_n synth rows' loss positions (P - 1 .. len - 2) where the trained drafter's argmax
    (tmp_path/d/drafter) is the target's."""
    from transformers import AutoModelForCausalLM

    from specbench.common.configs import plain
    from specbench.models.pairs import load_pair
    from specbench.training.synth import read_synth

    target = load_pair(plain(cfg.pair), torch.device("cpu")).target
    drafter = AutoModelForCausalLM.from_pretrained(tmp_path / "d" / "drafter").eval()
    agree = seen = 0
    for ids, P in sequences(read_synth(tmp_path / "s")[0], 256)[-val_n:]:
        x = torch.tensor([ids])
        with torch.no_grad():
            a, b = target(x).logits[0, P - 1 : -1].argmax(-1), drafter(x).logits[0, P - 1 : -1].argmax(-1)
        agree, seen = agree + int((a == b).sum()), seen + len(a)
    return agree / seen


def test_a_drafter_follows_its_verifier_by_weights_hash_across_checkouts(tmp_path):
    """A drafter trained against a verifier whose weights' sha256 was checked at load (the toy pairs) is accepted
    where the same weights load from another folder (another checkout or machine) and refused where the hash or the
    pair differs; without a hash the verifier's hub id or folder must match."""
    from types import SimpleNamespace

    from specbench.common.files import write_json_atomic
    from specbench.models.drafters import INFO, trained_folder

    def verifier(path: str, sha: str | None) -> SimpleNamespace:
        return SimpleNamespace(name_or_path=path, config=SimpleNamespace(**({"weights_sha256": sha} if sha else {})))

    write_json_atomic(tmp_path / INFO, {"kind": "distilled", "pair": "toy", "verifier": "/clone-a/toy/target",
                                        "verifier_identity": "sha256:abc"})
    assert trained_folder(tmp_path, SimpleNamespace(name="toy", target=verifier("/clone-b/toy/target", "abc")),
                          "distilled")["pair"] == "toy"
    for name, target in (("toy", verifier("/clone-b/toy/target", "abd")), ("toy", verifier("/clone-b/t", None)),
                         ("other", verifier("/clone-b/toy/target", "abc"))):
        with pytest.raises(ValueError, match="was trained for pair 'toy' \\(verifier '/clone-a/toy/target'\\)"):
            trained_folder(tmp_path, SimpleNamespace(name=name, target=target), "distilled")
    write_json_atomic(tmp_path / INFO, {"kind": "distilled", "pair": "p", "verifier": "org/model"})  # no identity
    assert trained_folder(tmp_path, SimpleNamespace(name="p", target=verifier("org/model", None)), "distilled")
    with pytest.raises(ValueError, match="trained for pair 'p'"):
        trained_folder(tmp_path, SimpleNamespace(name="p", target=verifier("org/other", None)), "distilled")


def test_gradient_checkpointing_trains_what_storing_the_activations_trains(tmp_path, synth_dir):
    """task.checkpointing recomputes the drafter's activations (with sd2's steering) in the backward: the same losses,
    gradient norms and held-out KL as a run that stores them; a head refuses it."""
    args = ("task=distill", "task.kind=sd2", f"task.data={synth_dir}", "task.val_n=2", "task.batch_size=4",
            "task.max_steps=3", "task.warmup_steps=1", "task.eval_every=3", "threads=1")
    run(small(*args), tmp_path / "stored")
    run(small(*args, "task.checkpointing=true"), tmp_path / "recomputed")
    logs = [[json.loads(x) for x in (tmp_path / d / "train_log.jsonl").read_text().splitlines()]
            for d in ("stored", "recomputed")]
    for a, b in zip(*logs, strict=True):
        for key in a.keys() - {"step"}:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (key, a, b)
    with pytest.raises(InputError, match="task.checkpointing applies to drafters"):
        run(small(*args, "task.kind=medusa", "task.checkpointing=true"), tmp_path / "head")
    from specbench.models.pairs import load_pair
    from specbench.training.features import Live

    pair = load_pair(OmegaConf.to_container(small().pair, resolve=True), torch.device("cpu"))
    task = {"k": 4, "lr": 1e-3, "checkpointing": True}
    d = distill.Distiller(pair, "sd2", task, Live(pair.target, pair.vocab_size, (1, 2, 2)), (1, 2, 2))
    assert d.student.is_activation_checkpointing and d.steered is not None  # what the first run trained with
