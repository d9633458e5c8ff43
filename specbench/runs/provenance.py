"""What a run records about where it ran: git hash, package versions, device, memory, and the runtime:
the device, dtype and threads that ran and which weights each model role held."""

from __future__ import annotations

import hashlib
import inspect
import json
import platform
import resource
import subprocess
import sys
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from specbench.common.files import ROOT
from specbench.common.hub import cached_config
from specbench.decoding.method import Method
from specbench.decoding.profiles import shapes
from specbench.decoding.rule import RULES

PACKAGES = ["specbench", "torch", "transformers", "accelerate", "datasets", "hydra-core", "omegaconf",
            "tokenizers", "numpy", "scipy", "pandas", "scikit-learn", "lm-eval"]


def git_info() -> dict[str, object]:
    """Commit hash of the project checkout and whether its tracked files have local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True, check=True).stdout.strip())
        return {"git_hash": head, "git_dirty": dirty}
    except (OSError, subprocess.CalledProcessError):
        return {"git_hash": None, "git_dirty": None}


def file_state(path: Path, root: Path = ROOT) -> str:
    """A file's state in the git checkout `root`: clean, modified, untracked, or outside (no checkout holds it)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", str(path)], cwd=root, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "outside"
    return "untracked" if out.startswith("??") else "modified" if out.strip() else "clean"


def method_code(method: Method) -> dict[str, dict[str, str]]:
    """The source files of the method's parts (its policy, drafter, shape, rule and loop classes and their bases
    in specbench), by path under the checkout: each file's sha256 and git state, so that the code a run imported is
    in its record, also where it is untracked or modified."""
    base_rule = method.plan.rule.removeprefix("js_relaxed(").removesuffix(")")
    parts = [type(method.policy), type(method.drafter), type(method.shape), RULES.get(base_rule)]
    parts += [type(method.loop)] if method.loop is not None else []
    files = {Path(f) for cls in parts for c in cls.__mro__ if c.__module__.startswith("specbench")
             for f in [inspect.getsourcefile(c)] if f}
    out = {}
    for f in sorted(files):
        name = str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f)
        out[name] = {"sha256": hashlib.sha256(f.read_bytes()).hexdigest(), "git": file_state(f)}
    return out


def code_record(method: Method) -> dict[str, object]:
    """The run's code: the checkout's git hash, whether it has local changes (a method file git does not track
    counts as one) and method_code."""
    code, git = method_code(method), git_info()
    untracked = any(f["git"] == "untracked" for f in code.values())
    return {**git, "git_dirty": git["git_dirty"] or untracked if git["git_hash"] else None, "method_code": code}


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide the numbers."""
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def device_info(device: torch.device) -> dict[str, object]:
    """Device type and name, CPU model (cpu_record's: "AMD EPYC", not the architecture) and thread count."""
    info: dict[str, object] = {"device": str(device), "platform": platform.platform(), "cpu": cpu_record()["model"],
                               "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def peak_memory(device: torch.device) -> dict[str, float]:
    """Peak resident memory of this process (MiB) and, on CUDA, peak allocated GPU memory (MiB)."""
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}  # Linux: KiB
    if device.type == "cuda":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def folder_fingerprint(folder: Path) -> str:
    """sha256 (first 16 hex digits) over a local model folder's file names, sizes and first MiB each: which
    weights ran, without reading every byte of a large checkpoint."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(folder)}:{f.stat().st_size}:".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(2**20))
    return h.hexdigest()[:16]


def model_record(model: Any) -> dict[str, Any]:
    """Which weights a loaded model holds: path or hub id, revision (the hub commit, or a local folder's fingerprint),
    the quantization method and whether the weights were converted (loaded from GGUF, or saved in another dtype than
    the one that ran); a toy model also its `weights_sha256`; one placed by a device_map its `placement`, the count
    of its modules on each device ({"0": 40, "cpu": 41, "disk": 2}); a dependent head (DraftHead) its method.head and
    the fingerprint of the folder it was read from."""
    if hasattr(model, "head_folder"):
        folder = model.head_folder
        return {"path": model.name_or_path, "revision": folder_fingerprint(folder) if folder else None,
                "quantized": None, "converted": False}
    cfg = model.config
    path = getattr(cfg, "_name_or_path", "") or None
    revision = getattr(cfg, "_commit_hash", None)
    config_file = None  # the config.json the weights were saved with: a local folder's, else the hub cache's
    if path:
        local = Path(path) / "config.json"
        config_file = local if local.exists() else cached_config(path, revision)
    if path and revision is None:  # a local folder's fingerprint, else the hub cache's snapshot (.../snapshots/<hash>)
        parts = config_file.parts if config_file else ()
        snapshot = parts[parts.index("snapshots") + 1] if "snapshots" in parts else None
        revision = folder_fingerprint(Path(path)) if Path(path).is_dir() else snapshot
    quant = getattr(cfg, "quantization_config", None)
    quant = quant if quant is None or isinstance(quant, dict) else quant.to_dict()
    saved = json.loads(config_file.read_text()) if config_file else {}
    saved_dtype = saved.get("dtype") or saved.get("torch_dtype")
    converted = bool(getattr(cfg, "gguf_file", None)) or (
        quant is None and saved_dtype is not None and f"torch.{saved_dtype}" != str(model.dtype))
    placed = getattr(model, "hf_device_map", None)  # device_map's placement: modules per device (or "disk")
    return {"path": path, "revision": revision, "quantized": quant.get("quant_method") if quant else None,
            "converted": converted,
            **({"weights_sha256": cfg.weights_sha256} if getattr(cfg, "weights_sha256", None) else {}),
            **({"placement": dict(Counter(map(str, placed.values())))} if placed else {})}


def runtime(models: dict[str, Any], threads: int, pair: Any = None, hidden_layers: tuple[int, ...] = ()
            ) -> dict[str, Any]:
    """What actually ran, read from the loaded models {role: model}: device and dtype (the verifier's, the first
    role), the torch CPU threads and each role's model_record; with the loaded `pair` its models' `shapes` (what a
    cost profile's entries are matched by); `verify_hidden_layers`, the hidden states each verify returned (EAGLE-3's
    and SD²'s layers; a projection prices such verifies apart)."""
    first = next(iter(models.values()))
    return {"device": str(first.device), "dtype": str(first.dtype).removeprefix("torch."), "threads": threads,
            "models": {role: model_record(m) for role, m in models.items()},
            **({} if pair is None else {"shapes": {"target": shapes(pair.target),
                                                   "draft": None if pair.draft is None else shapes(pair.draft)}}),
            "verify_hidden_layers": list(hidden_layers), "cpu": cpu_record()}


# the CPU features that decide a forward's speed on the CPU (matrix units, vector widths, their float formats)
CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")


def cpu_record() -> dict[str, Any]:
    """The CPU's model name and the speed-deciding features it has (CPU_FLAGS), from /proc/cpuinfo on Linux (else
    the platform's processor string and no flags): runs timed on different CPUs are not comparable."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor() or platform.machine(), "flags": []}
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    model = fields.get("model name") or fields.get("Model") or platform.processor() or platform.machine()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags]}
