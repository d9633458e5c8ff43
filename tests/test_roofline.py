"""Roofline costs (specbench.runs.roofline) and `python -m specbench.report DIR --profile roofline:GPU`: the
bytes and FLOPs of a forward by hand on a small config, the weights against transformers' own models' parameter
counts, the spec-sheet table's names, and a run projected onto a GPU's bare roofline by predicted_speedup's formula."""

from __future__ import annotations


import pytest
import torch

from test_projection import CHAIN, TOY, chain_run
from helpers import write_run
from specbench.analysis import report
from specbench.runs import roofline
from specbench.decoding.profiles import ProfileError, read
from specbench.common.files import ROOT

SMALL = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10}


def test_a_forwards_bytes_and_flops_by_hand():
    """n=2, h=8, i=16, a=2, g=1, d=8/2=4, V=10: W = 2 (2*8*2*4 + 2*8*1*4 + 3*8*16) + 10*8 = 1232; a bf16 forward of
    k=2 tokens in B=3 rows over L=5 cached ones moves 2 (1232 + 3*2*2*1*4*7 + 3*2*10) = 3256 bytes and does
    2*3*2*1232 + 4*3*2*2*2*4*7 = 17472 FLOPs."""
    m = roofline.layout(SMALL)
    assert (m.n, m.h, m.i, m.a, m.g, m.d, m.V) == (2, 8, 16, 2, 1, 4, 10)
    assert roofline.weights(m) == 1232
    assert roofline.forward_bytes(m, "bfloat16", 3, 2, 5) == 3256
    assert roofline.forward_bytes(m, "float32", 3, 2, 5) == 6512
    assert roofline.forward_flops(m, 3, 2, 5) == 17472
    slow = roofline.Gpu("x", "x", bandwidth=1000.0, peak={"bfloat16": 10.0}, sheet="by hand")
    fast = roofline.Gpu("y", "y", bandwidth=1.0, peak={"bfloat16": 1e9}, sheet="by hand")
    assert roofline.forward_seconds(m, "bfloat16", 3, 2, 5, slow) == pytest.approx(1747.2)  # FLOPs bound
    assert roofline.forward_seconds(m, "bfloat16", 3, 2, 5, fast) == pytest.approx(3256.0)  # bytes bound
    with pytest.raises(ProfileError, match="no spec-sheet peak for float32; it has bfloat16"):
        roofline.forward_seconds(m, "float32", 1, 1, 0, slow)
    assert roofline.layout({**SMALL, "head_dim": 6}).d == 6  # a recorded head_dim wins


@pytest.mark.parametrize("kind, shape", [
    ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=128256)),  # Llama-3.1-8B
    ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                   num_key_value_heads=8, vocab_size=151936)),  # Qwen3-0.6B: head_dim 128, not 1024 / 16
    ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                   num_key_value_heads=2, vocab_size=151936))])  # Qwen2.5-0.5B
def test_the_weights_a_forward_reads_are_transformers_models_matrices(kind, shape):
    """W equals the parameters of transformers' own model of those shapes (built on the meta device, untied) but
    the embedding, the norms and the biases, which W leaves out."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(kind, **shape, tie_word_embeddings=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    matrices = sum(p.numel() for name, p in model.named_parameters()
                   if p.dim() == 2 and "embed_tokens" not in name)
    assert roofline.weights(roofline.layout({"model_type": kind, **shape})) == matrices


def test_the_spec_sheet_table_names_each_gpu_as_cuda_does():
    names = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H100 PCIe": "h100-pcie",
             "NVIDIA A100-SXM4-80GB": "a100-80gb", "NVIDIA A100-SXM4-40GB": "a100-40gb",
             "NVIDIA A100-PCIE-40GB": "a100-40gb", "NVIDIA A100 80GB PCIe": "a100-80gb-pcie", "NVIDIA B200": "b200",
             "NVIDIA L40S": "l40s", "NVIDIA L4": "l4", "NVIDIA GeForce RTX 4090": "rtx4090"}
    for name, key in names.items():
        g = roofline.gpu_named(name)
        assert g is not None and g.key == key, name
    assert roofline.gpu_named("NVIDIA H200 NVL") is None and roofline.gpu_named("Tesla T4") is None
    assert roofline.gpu("h200").bandwidth == 4.8e12 and roofline.gpu("a100-80gb").bandwidth == 2.039e12
    with pytest.raises(ProfileError, match="roofline:v100: no such GPU .*valid: a100-40gb, a100-80gb"):
        roofline.gpu("v100")


def test_a_copy_probe_measures_a_positive_bandwidth():
    assert roofline.copy_probe(torch.device("cpu"), mib=4, repeats=2) > 0


def test_a_run_projected_onto_a_bare_roofline_by_hand(tmp_path, capsys):
    """No measured L4 profile ships, so roofline:l4 prices each forward at its roofline alone: the chain run of
    test_projection (float32, cache of 128 tokens: its rows record no prompt lengths) at T_k, the target's
    forward of k tokens, and d, the draft's one-token forward, is (2 E[T|2] + E[T|1]) / (2 (2d + T_3) + d + T_2)
    x T_1 over ar."""
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    chain_run(tmp_path / "res")
    g = roofline.gpu("l4")
    t, dm = roofline.layout(TOY["target"]), roofline.layout(TOY["draft"])
    T = {k: 4 * (roofline.weights(t) + 8 * 2 * 2 * 32 * (128 + k) + k * 512) / 0.3e12 for k in (1, 2, 3)}
    d = 4 * (roofline.weights(dm) + 1 * 2 * 2 * 32 * 129 + 512) / 0.3e12
    assert T[1] == pytest.approx(roofline.forward_seconds(t, "float32", 1, 1, 128, g))
    truth = (2 * 7 / 3 + 5 / 3) / (2 * (2 * d + T[3]) + (d + T[2])) * T[1]
    assert CHAIN["call_stats"]["iterations"] == {"2": 2, "1": 1}
    assert report.main([str(tmp_path / "res"), "--no-figures", "--table", "overview", "--profile", "roofline:l4",
                        "--out", str(tmp_path / "rep")]) == 0
    out, err = capsys.readouterr()
    assert f"{truth:.2f}" in out.split("at roofline:l4")[1] and "bare roofline" in err
    assert "== roofline ==" not in out  # no measured profile to compare


def test_roofline_h200_prints_the_shipped_profiles_ratios(tmp_path, capsys):
    """roofline:h200 prints each shipped H200 entry's measured / roofline ratio; the compiled Llama-shaped entry's
    one-token forward by hand: 2 bytes x (7,504,658,432 weights + 32 layers x 2 x 1024 KV x 129 positions +
    128,256 logits) / 4.8 TB/s."""
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    chain_run(tmp_path / "res")
    assert report.main([str(tmp_path / "res"), "--no-figures", "--table", "overview", "--profile",
                        "roofline:h200"]) == 0
    out, err = capsys.readouterr()
    table = out.split("== roofline ==")[1]
    e = next(e for e in read(ROOT / "profiles" / "h200-llama-shaped-compiled" / "profile.json")["entries"])
    bound = 2 * (7_504_658_432 + 32 * 2 * 1024 * 129 + 128_256) / 4.8e12
    line = next(x for x in table.splitlines() if "llama31_8b_1b_shaped · compiled · B=1" in x)
    assert f"| {e['target_chain_s']['1'] / bound:.2f} |" in line
    assert "x the measured / roofline ratios of llama31_8b_1b_shaped, qwen3_8b_0p6b_shaped (eager, B=1)" in err


def test_roofline_refusals(tmp_path, capsys):
    write_run(tmp_path / "res", "ar", "ar", [{"new": 12, "s": 1.0}])
    chain_run(tmp_path / "res")
    assert report.main([str(tmp_path / "res"), "--no-figures", "--profile", "roofline:v100"]) == 2
    assert "roofline:v100: no such GPU in the spec-sheet table; valid: a100-40gb" in capsys.readouterr().err
    assert report.main([str(tmp_path / "res"), "--no-figures", "--profile", "roofline:h200",
                        "--profile-pair", "p"]) == 2
    assert "--profile-pair names a measured profile's pair" in capsys.readouterr().err
