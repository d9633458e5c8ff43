"""The report of `bench gpu`: report.md written as it goes, figures.jsonl, the machine's lines and the plots."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch

from specbench.runs.provenance import git_info, package_versions


class Report:
    """DIR/report.md written as it goes (flushed after every block) and DIR/figures.jsonl, one record per figure."""

    def __init__(self, out: Path, append: bool = False) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.md, self.jsonl = out, out / "report.md", out / "figures.jsonl"
        if not append:  # a new report; with append the sections go after the ones already there
            self.md.write_text("")
            self.jsonl.write_text("")

    def write(self, *lines: str) -> None:
        """Append lines (and a blank one) to report.md and echo them."""
        text = "\n".join(lines) + "\n\n"
        with self.md.open("a") as f:
            f.write(text)
        print(text, end="", flush=True)

    def table(self, header: list[str], rows: Sequence[Sequence[object]]) -> None:
        """A markdown table."""
        self.write("| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                   *("| " + " | ".join(map(str, r)) + " |" for r in rows))

    def record(self, **fields: object) -> None:
        """One figure into figures.jsonl."""
        with self.jsonl.open("a") as f:
            f.write(json.dumps(fields) + "\n")


@functools.cache
def driver() -> str:
    """The NVIDIA driver's version (nvidia-smi, asked once a process), else 'n/a'."""
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    return smi.stdout.strip().splitlines()[0] if smi and smi.returncode == 0 and smi.stdout.strip() else "n/a"


def machine(device: torch.device) -> list[str]:
    """Lines naming the machine: GPU and driver (or CPU), CUDA, torch, transformers, specbench commit."""
    v, g = package_versions(), git_info()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        hw = f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB), driver {driver()}, CUDA {torch.version.cuda}"
    else:
        hw = f"CPU ({torch.get_num_threads()} torch thread(s)), no GPU"
    return [f"- machine: {hw}", f"- torch {v.get('torch')}, transformers {v.get('transformers')}, python {v['python']}",
            f"- specbench commit {g['git_hash']}{' (local changes)' if g['git_dirty'] else ''}",
            f"- date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"]


def count(n: int) -> str:
    """A parameter count as 8.03B or 1.2M."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def plot(out: Path, name: str, rows: list[dict], costs: dict[str, list[float]]) -> list[str]:
    """Two PNGs per pair: tokens/s against B, a line per method (<name>_throughput.png, once rows are measured), and
    the per-call costs (<name>_calls.png); their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for png, data in ((f"{name}_throughput.png", rows), (f"{name}_calls.png", costs)):
        if not data:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.5))
        if data is rows:
            for method in dict.fromkeys(r["method"] for r in rows):
                mine = [r for r in rows if r["method"] == method]
                ax.plot([r["B"] for r in mine], [r["tokens_per_s"] for r in mine], "o-", label=method)
            ax.set(xscale="log", xlabel="batch size B", ylabel="tokens/s", title=name)
        else:
            labels = list(costs)
            for k, path in enumerate(("eager", "compiled")):
                vals = [costs[label][k] for label in labels]
                ax.bar([i + 0.4 * k for i in range(len(labels))], [v if v == v else 0 for v in vals], 0.4, label=path)
            ax.set_xticks([i + 0.2 for i in range(len(labels))], labels, rotation=30, ha="right")
            ax.set(ylabel="ms per call (median)", title=name)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / png, dpi=120)
        plt.close(fig)
        names.append(png)
    return names
