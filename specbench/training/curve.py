"""A training run's curve (curve.png in its folder): the held-out greedy agreement of each draft step against the
training steps, with the held-out KL beside it, from its train_log entries (specbench.training.distill.validation)."""

from __future__ import annotations

from pathlib import Path


def plot_curve(path: Path, history: list[dict], title: str) -> Path:
    """Draw `history`'s held-out entries into `path`: val_top1 per term (draft 1, 2, ...) on the left axis, val_kl
    dashed on the right; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    held = [h for h in history if isinstance(h.get("val_top1"), list)]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for j in range(max((len(h["val_top1"]) for h in held), default=0)):
        at = [h for h in held if len(h["val_top1"]) > j]
        ax.plot([h["step"] for h in at], [h["val_top1"][j] for h in at], "o-", ms=3, label=f"draft {j + 1}")
    ax.set(xlabel="training step", ylabel="held-out greedy agreement", ylim=(0, 1), title=title)
    kl = ax.twinx()
    kl.plot([h["step"] for h in held], [h["val_kl"] for h in held], "k--", lw=1, label="held-out KL")
    kl.set_ylabel("held-out KL (nats per position)")
    lines = ax.get_legend_handles_labels()[0] + kl.get_legend_handles_labels()[0]
    ax.legend(lines, [str(x.get_label()) for x in lines], fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
    return path
