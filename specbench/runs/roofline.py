"""The least time a forward can take on a GPU: its bytes over the rated memory bandwidth or its FLOPs over the rated
peak, whichever is more (the roofline), from spec sheets shipped here (GPUS) and a decoder's config shapes.

A forward of k new tokens in each of B rows, over a cache of L tokens per row, of a decoder with n layers, hidden
size h, MLP width i (gated: gate, up and down projections), a query heads and g key/value heads of width d and a
vocabulary of V, its weights and cache in a dtype of b bytes:

    W     = n * (2*h*a*d + 2*h*g*d + 3*h*i) + V*h        matrix weights read once a forward (q, k, v, o, MLP; lm_head)
    bytes = b * (W + B*n*2*g*d*(L + k) + B*k*V)          + every row's keys and values read, + the logits written
    FLOPs = 2*B*k*W + 4*B*k*n*a*d*(L + k)                matmuls, + attention scores and values over L + k positions
    s     = max(bytes / bandwidth, FLOPs / peak[dtype])

Left out, as small beside these: norms and biases, the embedding rows gathered (B*k*h), activations between
layers; the causal mask's unused half of the k x k block is counted. A spec sheet's peak is its dense one (no
sparsity); float32 is the CUDA cores' rate, which torch's matmuls use unless TF32 is allowed.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.common.files import ROOT
from specbench.decoding.profiles import FORMAT, Entry, ProfileError, interpolate, read

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
GATED = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo2", "granite")  # gate/up/down MLPs


@dataclass(frozen=True)
class Gpu:
    """One GPU's spec sheet: its rated memory bandwidth (bytes/s) and dense peak FLOP/s per dtype."""

    key: str
    pattern: str  # a regular expression matching torch.cuda.get_device_name's names of it
    bandwidth: float
    peak: Mapping[str, float]
    sheet: str  # where the figures come from


def _gpu(key: str, pattern: str, gb_s: int, bf16_tf: float, fp32_tf: float | None, sheet: str) -> Gpu:
    peak = {"bfloat16": bf16_tf * 1e12, "float16": bf16_tf * 1e12, **({"float32": fp32_tf * 1e12} if fp32_tf else {})}
    return Gpu(key, pattern, gb_s * 1e9, peak, sheet)


GPUS = {g.key: g for g in (  # GB/s; dense bf16 tensor-core TFLOP/s; float32 without TF32
    _gpu("a100-40gb", r"A100.*40GB", 1555, 312, 19.5, "NVIDIA A100 datasheet (40GB SXM4/PCIe: 1,555 GB/s)"),
    _gpu("a100-80gb", r"A100-SXM4-80GB|A100.*80GB HBM2e", 2039, 312, 19.5, "NVIDIA A100 datasheet (80GB SXM4)"),
    _gpu("a100-80gb-pcie", r"A100 80GB PCIe", 1935, 312, 19.5, "NVIDIA A100 datasheet (80GB PCIe)"),
    _gpu("h100-sxm", r"H100 80GB HBM3|H100 SXM", 3350, 989, 67, "NVIDIA H100 datasheet (SXM5)"),
    _gpu("h100-pcie", r"H100 PCIe", 2000, 756, 51, "NVIDIA H100 datasheet (PCIe)"),
    _gpu("h200", r"H200(?! NVL)", 4800, 989, 67, "NVIDIA H200 datasheet (SXM)"),
    _gpu("b200", r"B200", 8000, 2250, None, "NVIDIA HGX B200 datasheet (per GPU)"),
    _gpu("l40s", r"L40S", 864, 362, 91.6, "NVIDIA L40S datasheet"),
    _gpu("l4", r"\bL4\b", 300, 121, 30.3, "NVIDIA L4 datasheet"),
    _gpu("rtx4090", r"RTX 4090", 1008, 165.2, 82.6, "NVIDIA Ada Lovelace whitepaper (FP32 accumulate)"),
)}


def gpu(key: str) -> Gpu:
    """The spec sheet named `key`; ProfileError listing the valid names."""
    if key not in GPUS:
        raise ProfileError(f"roofline:{key}: no such GPU in the spec-sheet table; valid: {', '.join(GPUS)}")
    return GPUS[key]


def gpu_named(device_name: str) -> Gpu | None:
    """The spec sheet of a device name as CUDA reports it ('NVIDIA H200'), or None for a GPU not in the table."""
    return next((g for g in GPUS.values() if re.search(g.pattern, device_name)), None)


@dataclass(frozen=True)
class Layout:
    """The sizes a forward's bytes and FLOPs depend on (the module docstring's letters)."""

    n: int
    h: int
    i: int
    a: int
    g: int
    d: int
    V: int


def layout(shapes: Mapping[str, object]) -> Layout:
    """A model's Layout from its recorded config shapes (profiles.shapes); d is `head_dim` where recorded, else the
    default transformers' config class gives that model type (hidden / heads but for e.g. qwen3's 128)."""
    kind = str(shapes.get("model_type"))
    if kind not in GATED:
        raise ProfileError(f"roofline: model_type {kind!r} has no known layer layout; known: {', '.join(GATED)}")
    h, a = int(shapes["hidden_size"]), int(shapes["num_attention_heads"])  # type: ignore[call-overload]
    d = shapes.get("head_dim")
    if d is None:
        from transformers import AutoConfig

        d = getattr(AutoConfig.for_model(kind, hidden_size=h, num_attention_heads=a), "head_dim", None) or h // a
    return Layout(int(shapes["num_hidden_layers"]), h, int(shapes["intermediate_size"]), a,  # type: ignore
                  int(shapes["num_key_value_heads"]), int(d), int(shapes["vocab_size"]))  # type: ignore


def weights(m: Layout) -> int:
    """W: the matrix weights one forward reads, q, k, v and o projections, the gated MLP, and lm_head."""
    return m.n * (2 * m.h * m.a * m.d + 2 * m.h * m.g * m.d + 3 * m.h * m.i) + m.V * m.h


def forward_bytes(m: Layout, dtype: str, rows: int, tokens: int, kv: int) -> float:
    """Bytes a forward of `tokens` per row over `rows` rows after `kv` cached ones moves: b * (W + KV + logits)."""
    return DTYPE_BYTES[dtype] * (weights(m) + rows * m.n * 2 * m.g * m.d * (kv + tokens) + rows * tokens * m.V)


def forward_flops(m: Layout, rows: int, tokens: int, kv: int) -> float:
    """FLOPs of the same forward: 2 B k W for the matmuls, 4 B k n a d (L + k) for attention."""
    return 2 * rows * tokens * weights(m) + 4 * rows * tokens * m.n * m.a * m.d * (kv + tokens)


def forward_seconds(m: Layout, dtype: str, rows: int, tokens: int, kv: int, g: Gpu) -> float:
    """max(bytes / bandwidth, FLOPs / peak): the least time of the forward on GPU g."""
    if dtype not in g.peak:
        raise ProfileError(f"roofline:{g.key}: no spec-sheet peak for {dtype}; it has {', '.join(g.peak)}")
    return max(forward_bytes(m, dtype, rows, tokens, kv) / g.bandwidth,
               forward_flops(m, rows, tokens, kv) / g.peak[dtype])


def copy_probe(device: torch.device, mib: int = 256, repeats: int = 5) -> float:
    """Bytes per second a copy of `mib` MiB moves (read + written) on `device`, the median of `repeats`: the
    bandwidth of a GPU not in GPUS (or of a CPU) as a kernel reaches it, not as rated."""
    src = torch.empty(mib * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):  # the first warms up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / sorted(times[1:])[len(times[1:]) // 2]


WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64)  # a roofline entry's target widths, as bench gpu's
DRAFT_WIDTHS = (1, 2, 4, 8, 16)
PREFILLS = (32, 128, 512, 2048)
# role (target, draft, target_prefill, draft_prefill) -> {width: measured / roofline seconds}
Ratios = dict[str, dict[str, float]]


def measured_ratios(e: Entry, g: Gpu) -> Ratios:
    """A measured entry's seconds over the roofline's for the same calls, per role and width or prompt length."""
    t = layout(e["shapes"]["target"])
    d = layout(e["shapes"]["draft"]) if (e["shapes"].get("draft")) else None
    B, L, dt = e["batch_size"], int(e.get("prompt_tokens") or 0), e["dtype"]
    out: Ratios = {"target": {w: s / forward_seconds(t, dt, B, int(w), L, g) for w, s in e["target_chain_s"].items()}}
    if d is not None:
        chain = e.get("draft_chain_s") or {"1": e["draft_token_s"]}
        out["draft"] = {w: s / forward_seconds(d, dt, B, int(w), L, g) for w, s in chain.items()}
    for role, m, pre in (("target", t, e.get("target_prefill_s")), ("draft", d, e.get("draft_prefill_s"))):
        if m is not None and pre:
            out[f"{role}_prefill"] = {p: s / forward_seconds(m, dt, 1, int(p), 0, g) for p, s in pre.items()}
    return out


def shipped(g: Gpu, root: Path = ROOT / "profiles") -> list[Entry]:
    """The entries measured on GPU g among the profiles shipped in `root` (profiles/*/profile.json) with shapes."""
    return [e for p in sorted(root.glob("*/profile.json")) for e in read(p)["entries"]
            if e.get("shapes") and gpu_named(str(e.get("device", ""))) is g]


def slowdowns(g: Gpu, path: str, rows: int, entries: list[Entry]) -> tuple[Ratios, str]:
    """(the mean measured / roofline ratio per role and width over `entries` of GPU g at `path` and the batch size
    nearest `rows` (any path where none is at it), in words); ({}, why) with no entries: the bare roofline."""
    if not entries:
        return {}, f"no measured profile of {g.key} ships: the bare roofline"
    at = [e for e in entries if e["path"] == path] or entries
    near = min({e["batch_size"] for e in at}, key=lambda b: abs(math.log(b / rows)))
    use = [e for e in at if e["batch_size"] == near]
    each = [measured_ratios(e, g) for e in use]
    out: Ratios = {}
    for role in ("target", "draft", "target_prefill", "draft_prefill"):
        widths = sorted({w for r in each for w in r.get(role, {})}, key=int)
        if widths:
            out[role] = {w: statistics.mean(r[role][w] for r in each if w in r.get(role, {})) for w in widths}
    said = (f"x the measured / roofline ratios of {', '.join(sorted({e['pair'] for e in use}))} "
            f"({use[0]['path']}, B={near}) on {g.key}")
    return out, said


def ratio(r: Ratios, role: str, width: int) -> float:
    """The ratio for `role` at `width`, interpolated; a prefill the profile lacks takes the target's widest chain
    ratio, a draft forward the target's at its width; 1 with no ratios."""
    if role in r:
        return interpolate(r[role], width)
    if role.endswith("prefill") and "target" in r:
        return r["target"][max(r["target"], key=int)]
    return interpolate(r["target"], width) if "target" in r else 1.0


@dataclass(frozen=True)
class Site:
    """What a roofline entry prices: a pair (its recorded config shapes), dtype, path and batch size, and the cache
    length its forwards attend over."""

    pair: str
    shapes: dict[str, dict[str, object]]  # {"target": profiles.shapes, "draft": the same or None}
    dtype: str
    path: str
    batch_size: int
    kv: int


def entry(site: Site, g: Gpu, r: Ratios) -> Entry:
    """A profile entry (profiles.Entry) for the site on GPU g: every forward at its roofline seconds, times the
    ratios `r`; no draft forwards (0 s) where the pair has no draft."""
    t, B, kv = layout(site.shapes["target"]), site.batch_size, site.kv
    d = layout(site.shapes["draft"]) if site.shapes.get("draft") else None

    def at(m: Layout, role: str, k: int, L: int, rows: int) -> float:
        return forward_seconds(m, site.dtype, rows, k, L, g) * ratio(r, role, k)

    out = Entry(pair=site.pair, shapes=site.shapes, dtype=site.dtype, device=f"{g.key} (its roofline)", path=site.path,
                batch_size=B, prompt_tokens=kv, target_tree_s={},
                target_chain_s={str(w): at(t, "target", w, kv, B) for w in WIDTHS},
                target_prefill_s={str(p): at(t, "target_prefill", p, 0, 1) for p in PREFILLS},
                draft_token_s=at(d, "draft", 1, kv, B) if d else 0.0)
    if d is not None:
        out["draft_chain_s"] = {str(w): at(d, "draft", w, kv, B) for w in DRAFT_WIDTHS}
        out["draft_prefill_s"] = {str(p): at(d, "draft_prefill", p, 0, 1) for p in PREFILLS}
    return out


def profile(g: Gpu, sites: list[Site], measured: list[Entry]) -> dict:
    """A cost profile (profiles.read's format) of GPU g with an entry per site, each forward at its roofline times
    the `measured` entries' ratios (slowdowns); `said` names where the ratios came from."""
    found = {(s.path, s.batch_size): slowdowns(g, s.path, s.batch_size, measured) for s in sites}  # once per kind
    priced = [(site, *found[site.path, site.batch_size]) for site in sites]
    return {"format": FORMAT, "name": f"roofline:{g.key}", "machine": [f"- {g.sheet}"],
            "entries": [entry(site, g, r) for site, r, _ in priced], "said": sorted({w for _, _, w in priced})}
