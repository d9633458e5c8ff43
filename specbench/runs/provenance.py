"""What a run records about where it ran: git hash, package versions, device, memory."""

from __future__ import annotations

import platform
import resource
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from specbench.common.files import ROOT

PACKAGES = ["specbench", "torch", "transformers", "accelerate", "datasets", "hydra-core", "omegaconf",
            "tokenizers", "numpy", "scipy", "pandas", "scikit-learn", "lm-eval"]


def git_info(root: Path | None = None) -> dict[str, object]:
    """Commit hash of the project checkout and whether its tracked files have local changes."""
    root = root or ROOT
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, check=True).stdout.strip())
        return {"git_hash": head, "git_dirty": dirty}
    except (OSError, subprocess.CalledProcessError):
        return {"git_hash": None, "git_dirty": None}


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
    """Device type and name, CPU model and thread count."""
    info: dict[str, object] = {"device": str(device), "platform": platform.platform(),
                               "cpu": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads()}
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
