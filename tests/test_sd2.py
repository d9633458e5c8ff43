"""SD² steering against hand computation: W_s = 0 changes nothing, the hook is Eq. 2, the verifier's
states come from the verify forward at the last accepted position, and `sd2` is lossless."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import pair_engine, small
from specbench.decoding.engine import Engine
from specbench.decoding.compose import compose
from specbench.decoding.parts import Shape
from specbench.methods.draft_model import DraftModel
from specbench.methods.vanilla import Vanilla
from specbench.runs.runner import run
from specbench.models.steering import SteeredDrafter, Steering, check_layers, check_swiglu, default_layers, training_steering

H = 64  # tiny_random hidden size (target and draft)


def steering_for(draft, layers=(3, 2, 2)) -> Steering:
    return Steering(H, draft.config.num_hidden_layers, draft.config.intermediate_size, layers)


def test_zero_ws_leaves_the_drafter_unchanged(tiny_pair):
    draft, ids = tiny_pair.draft, torch.tensor([[5, 17, 99, 3, 42, 7]])
    st = steering_for(draft)
    with torch.no_grad():
        plain = draft(input_ids=ids).logits
        s = SteeredDrafter(draft, st)
        try:
            s.set_block(torch.randn(3, H) * 50)  # W_s = 0: b = 0 whatever g is
            block = draft(input_ids=ids).logits
            s.set_positions(torch.randn(1, 6, H) * 50)
            per_position = draft(input_ids=ids).logits
            st.w_s.weight.normal_()
            s.set_block(torch.randn(3, H))
            steered = draft(input_ids=ids).logits
        finally:
            s.remove()
        after = draft(input_ids=ids).logits
    assert torch.equal(plain, block) and torch.equal(plain, per_position) and torch.equal(plain, after)
    assert (plain - steered).abs().max() > 1e-2  # a non-zero W_s does steer


def test_init_gives_g_as_the_sum_of_the_three_states():
    st = Steering(H, 2, 128, (3, 2, 2))
    states = torch.randn(3, H)
    torch.testing.assert_close(st.vector(states), states.sum(0))
    assert st.w_s.weight.abs().sum() == 0


def test_hook_biases_the_up_projection_before_gating(tiny_pair):
    """MLP_l(a) = W_d((W_u a + W_s^(l) W_hml [h; m; l]) * silu(W_g a)), computed by hand for layer 1."""
    draft = tiny_pair.draft
    mlp, I = draft.model.layers[1].mlp, draft.config.intermediate_size
    st = steering_for(draft)
    with torch.no_grad():
        st.w_s.weight.normal_(std=0.1)
        st.w_hml.weight.normal_(std=0.1)
    states, a = torch.randn(3, H), torch.randn(4, H)
    g = st.w_hml.weight @ states.reshape(-1)
    b = st.w_s.weight[I : 2 * I] @ g  # layer 1's rows
    up, gate = a @ mlp.up_proj.weight.T, a @ mlp.gate_proj.weight.T
    expected = ((up + b) * torch.nn.functional.silu(gate)) @ mlp.down_proj.weight.T
    s = SteeredDrafter(draft, st)
    try:
        s.set_block(states)
        with torch.no_grad():
            got = mlp(a)
    finally:
        s.remove()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_training_offsets_pick_g_from_delta_positions_back():
    """Position j is steered by g_{j-δ} when j - δ >= P - 1, else not at all (hand-listed)."""
    st = Steering(2, 1, 4, (3, 2, 2))
    T = 8
    states = torch.arange(T, dtype=torch.float32).view(1, T, 1, 1).expand(2, T, 3, 2)  # g_t = 3t in each entry
    got = training_steering(st, states, delta=torch.tensor([1, 3]), prompt_len=torch.tensor([2, 4]))[..., 0]
    assert got[0].tolist() == [0, 0, 3, 6, 9, 12, 15, 18]  # j >= 2: g_{j-1}
    assert got[1].tolist() == [0, 0, 0, 0, 0, 0, 9, 12]  # j >= 6: g_{j-3}


def test_layers_and_architecture_checks():
    assert default_layers(32) == (3, 16, 30) and default_layers(8) == (3, 4, 6) and default_layers(2) == (2, 1, 1)
    with pytest.raises(ValueError, match=r"1\.\.8.*\[3, 4, 6\]"):
        check_layers((0, 4, 6), 8)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="llama, qwen2, qwen3.*'gpt2'"):
        check_swiglu(gpt2)


class SpyDrafter(DraftModel):
    """The pair's draft model, asking for the verifier's states at hidden_states indices 1, 2, 4."""

    layers = (1, 2, 4)


def test_engine_hands_over_the_states_of_the_committed_positions(tiny_pair, monkeypatch):
    """Against a fresh cache-free forward of the final sequence: after an iteration that accepted n of
    the drafts at buf[L..], the states are those of positions fed..L+n-1 (every position this verify
    committed, the last the one whose p gave the next token); and no extra target call is made."""
    target = tiny_pair.target
    calls: list[dict] = []
    hook = target.register_forward_pre_hook(lambda m, a, kw: calls.append(dict(kw)), with_kwargs=True)
    spy = compose(Vanilla(gamma=4), SpyDrafter(), Shape(), "greedy", "spy")  # its drafter asks for states
    spy_seen: list[torch.Tensor] = []  # those the engine hands it, one per verify
    real = Engine.committed_states  # what the engine hands the drafter with its next request

    def seen(*args):
        out = real(*args)
        spy_seen.extend(s.clone() for s in out)
        return out

    monkeypatch.setattr(Engine, "committed_states", staticmethod(seen))
    try:
        prompt = tiny_pair.tokenizer("The quick brown fox")["input_ids"]
        gen = pair_engine(tiny_pair, spy).generate(prompt, 40)
        n_spy = len(calls)
        pair_engine(tiny_pair, {"name": "vanilla", "gamma": 4}).generate(prompt, 40)
    finally:
        hook.remove()
    assert n_spy == gen.target_calls == len(gen.records) == len(spy_seen)  # one verify per iteration, no more
    assert all(c.get("output_hidden_states") for c in calls[:n_spy])
    assert not any("output_hidden_states" in c for c in calls[n_spy:])  # other methods: plain forward
    accepted = [r.accepted for r in gen.records]
    assert 0 < sum(accepted) < sum(r.drafted for r in gen.records)  # both accepted and rejected drafts
    with torch.no_grad():
        hs = target(torch.tensor([prompt + gen.token_ids]), output_hidden_states=True).hidden_states
    L, start = len(prompt), 0  # the first verify computes every prompt position, later ones from L - 1
    for rec, states in zip(gen.records, spy_seen):
        want = torch.stack([hs[k][0, start : L + rec.accepted] for k in SpyDrafter.layers])  # [3, m, H]
        torch.testing.assert_close(states, want, atol=1e-4, rtol=1e-4)
        L += rec.accepted + 1
        start = L - 1


def rows(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "rows.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def sd2_folders(tmp_path_factory):
    """A 2-step sd2 run on tiny_random, then two copies of it: steering with a large random W_s, and W_s = 0."""
    root = tmp_path_factory.mktemp("sd2")
    run(small("task=synth", "task.n=8", "task.max_new_tokens=16", "task.batch_size=4"), root / "synth")
    run(small("task=distill", "task.kind=sd2", f"task.data={root / 'synth'}", "task.val_n=2", "task.max_steps=2",
              "task.batch_size=2"), root / "trained")
    st = load_file(root / "trained" / "steering.safetensors")
    out = {}
    for name, scale in (("random", 0.005), ("zero", 0.0)):
        import shutil

        shutil.copytree(root / "trained", root / name)
        w = torch.randn(st["w_s.weight"].shape, generator=torch.Generator().manual_seed(0)) * scale
        save_file({**st, "w_s.weight": w}, root / name / "steering.safetensors")
        out[name] = root / name
    return out


def test_sd2_greedy_equals_ar_and_steering_changes_the_drafts(tmp_path, sd2_folders):
    common = ("decode.max_new_tokens=32", "limit=12")
    run(small("method=ar", *common), tmp_path / "ar")
    s = run(small("method=sd2", f"method.drafter={sd2_folders['random']}", *common), tmp_path / "sd2")
    z = run(small("method=sd2", f"method.drafter={sd2_folders['zero']}", *common), tmp_path / "zero")
    for a, b in zip(rows(tmp_path / "ar"), rows(tmp_path / "sd2")):
        assert a["id"] == b["id"] and a["token_ids"] == b["token_ids"], a["id"]
    assert s["lossless"] and 0.05 < s["acceptance_rate"] < 0.95
    assert s["acceptance_rate"] != z["acceptance_rate"]  # the random steering did change the drafts


def test_sd2_refuses_a_missing_or_foreign_drafter(tmp_path, sd2_folders):
    with pytest.raises(FileNotFoundError, match="nowhere is not a finished distill run.*task=distill task.kind=sd2"):
        run(small("method=sd2", f"method.drafter={tmp_path / 'nowhere'}", "limit=1"), tmp_path / "a")
    with pytest.raises(ValueError, match="needs method.drafter"):
        run(small("method=sd2", "method.drafter=null", "limit=1"), tmp_path / "a")
    with pytest.raises(ValueError, match="trained for pair 'tiny_random' .*seed=0.*seed=1"):
        run(small("method=sd2", f"method.drafter={sd2_folders['zero']}", "pair.seed=1", "limit=1"),
            tmp_path / "b")
    with pytest.raises(ValueError, match="holds a 'sd2' drafter; method 'distilled'"):
        run(small("method=distilled", f"method.drafter={sd2_folders['zero']}", "limit=1"), tmp_path / "c")
