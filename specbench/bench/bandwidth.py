"""Memory bandwidth in `bench gpu`'s cost profiles: the bytes each measured target forward moves
(specbench.runs.roofline.forward_bytes: the weights, then every row's keys and values), the rate it moved them
at, its fraction of the device's bandwidth (rated by its spec sheet, or measured by a copy probe for a device not in
the table, a CPU included) and the time that bandwidth bounds it to, as a table and a plot per pair and path."""

from __future__ import annotations

from pathlib import Path

import torch

from specbench.runs import roofline
from specbench.decoding.profiles import Entry

WIDTHS = (1, 2, 4, 8, 16, 32, 64)  # the widths the table shows (the plot: every measured one)


def device_bandwidth(device: torch.device) -> tuple[float, str]:
    """(bytes per second, where it comes from): a GPU's rated bandwidth from the spec-sheet table, else a copy
    probe's (roofline.copy_probe)."""
    if device.type == "cuda":
        g = roofline.gpu_named(torch.cuda.get_device_name(device))
        if g is not None:
            return g.bandwidth, f"rated {g.bandwidth / 1e9:.0f} GB/s ({g.sheet})"
    probed = roofline.copy_probe(device, mib=64 if device.type == "cpu" else 1024)
    return probed, f"{probed / 1e9:.1f} GB/s by a copy probe (the device is not in the spec-sheet table)"


def split_bytes(e: Entry, width: int) -> tuple[float, float]:
    """(weight bytes, KV and logit bytes) of the entry's target forward of `width` tokens a row."""
    m = roofline.layout(e["shapes"]["target"])
    total = roofline.forward_bytes(m, e["dtype"], e["batch_size"], width, int(e.get("prompt_tokens") or 0))
    weights = roofline.DTYPE_BYTES[e["dtype"]] * roofline.weights(m)
    return weights, total - weights


def rows(entries: list[Entry], bandwidth: float) -> list[list[str]]:
    """A table row per entry and width: B, w, measured ms, weights GB/s, KV GB/s, fraction of `bandwidth`, and the
    bound bytes / bandwidth in ms."""
    out = []
    for e in entries:
        for w in (w for w in WIDTHS if str(w) in e["target_chain_s"]):
            s = e["target_chain_s"][str(w)]
            weights, kv = split_bytes(e, w)
            out.append([str(e["batch_size"]), str(w), f"{1e3 * s:.2f}", f"{weights / s / 1e9:.1f}",
                        f"{kv / s / 1e9:.2f}", f"{(weights + kv) / s / bandwidth:.1%}",
                        f"{1e3 * (weights + kv) / bandwidth:.3f}"])
    return out


HEADER = ["B", "tokens/row", "ms", "weights GB/s", "KV + logits GB/s", "of bandwidth", "bound ms"]


def plot(out: Path, name: str, path: str, entries: list[Entry], bandwidth: float) -> str:
    """<name>_<path>_bandwidth.png: ms per target forward against tokens per row, measured (a line per B) and the
    bandwidth's bound (dashed, same colour); its file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for e in entries:
        ws = sorted(map(int, e["target_chain_s"]))
        line, = ax.plot(ws, [1e3 * e["target_chain_s"][str(w)] for w in ws], "o-", ms=3, label=f"B={e['batch_size']}")
        ax.plot(ws, [1e3 * sum(split_bytes(e, w)) / bandwidth for w in ws], "--", color=line.get_color(),
                label=f"B={e['batch_size']} bytes / bandwidth")
    ax.set(xscale="log", yscale="log", xlabel="tokens per row", ylabel="ms per target forward",
           title=f"{name} ({path})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    png = f"{name}_{path}_bandwidth.png"
    fig.savefig(out / png, dpi=120)
    plt.close(fig)
    return png
