"""Hardware cost profiles as data: what one pair's calls cost on one machine (measured by specbench.bench.profile),
and the call costs of an iteration read off one, for the predicted speedup (specbench.decoding.speedup).

A profile (profile.json) is {"format": 1, "name", "machine", "versions", "command", "entries": [...]}; an entry is
one (pair, dtype, device, path, batch size):

    {"pair": "llama31_8b_1b_shaped", "shapes": {"target": {...}, "draft": {...}}, "dtype": "bfloat16",
     "device": "NVIDIA H100 80GB HBM3", "path": "eager" | "compiled", "batch_size": B, "prompt_tokens": P,
     "target_chain_s": {"k": s},   # one target forward of k new tokens per row (a chain: 1 + drafts), B rows
     "target_tree_s": {"n": s},    # one tree-attention forward of the root's token and n nodes (B = 1, eager)
     "draft_token_s": s}           # one draft forward of 1 token per row, B rows

every s the median wall seconds of a number of forwards after a cached prompt of P tokens (rolled back after each).
Compiled forwards are padded to the compiled widths (specbench.decoding.compiled.WIDTHS), so a compiled entry
lists those widths; trees run eagerly at B = 1 (the tree methods decode one row). Between measured widths the
cost is interpolated linearly (`chain_seconds`); beyond the widest it is extrapolated from the last two.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

FORMAT = 1


class Entry(TypedDict):
    """One (pair, dtype, device, path, B) of a profile; see the module docstring."""

    pair: str
    shapes: dict[str, dict[str, object]]
    dtype: str
    device: str
    path: str
    batch_size: int
    prompt_tokens: int
    target_chain_s: dict[str, float]
    target_tree_s: dict[str, float]
    draft_token_s: float


def read(path: Path) -> dict:
    """A profile.json, checked for its format; ValueError naming the file otherwise."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path}: not a specbench cost profile (format {FORMAT} with 'entries'); profiles are "
                         "written by `python -m specbench.bench gpu` and `bench verify --profile`")
    return data


def interpolate(points: dict[str, float], x: float) -> float:
    """The piecewise-linear function through points {"k": seconds} at x; beyond the ends, the nearest segment's
    line (a single point: constant)."""
    xs = sorted(int(k) for k in points)
    if len(xs) == 1:
        return points[str(xs[0])]
    i = next((j for j in range(1, len(xs)) if xs[j] >= x), len(xs) - 1)
    (x0, x1), (y0, y1) = (xs[i - 1], xs[i]), (points[str(xs[i - 1])], points[str(xs[i])])
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def chain_seconds(entry: Entry, tokens: int) -> float:
    """Seconds of one target forward of `tokens` tokens per row at the entry's B: compiled forwards cost their
    padded width's graph (wider than every graph: eager, so extrapolated); eager ones are interpolated."""
    if entry["path"] == "compiled":
        padded = next((w for w in sorted(map(int, entry["target_chain_s"])) if w >= tokens), None)
        if padded is not None:
            return entry["target_chain_s"][str(padded)]
    return interpolate(entry["target_chain_s"], tokens)


def tree_seconds(entry: Entry, nodes: int) -> float:
    """Seconds of one tree-attention forward of the root's token and `nodes` nodes (the entry's trees,
    interpolated; an entry without trees: the chain of nodes + 1 tokens)."""
    return interpolate(entry["target_tree_s"], nodes) if entry["target_tree_s"] else chain_seconds(entry, nodes + 1)


def iteration_costs(entry: Entry, widths: list[int], tree: bool = False) -> dict[str, object]:
    """The call costs (specbench.decoding.speedup.call_costs' format) of iterations that verified w drafted nodes
    for each w in `widths`, read off a profile entry: target_by_width["w+1"] the forward of the root's token and
    w nodes (a chain, or with `tree` a tree), target_1 one token (ar's step at the entry's B), draft_per_token
    the draft's one-token forward."""
    by_width = {str(w + 1): tree_seconds(entry, w) if tree and w else chain_seconds(entry, w + 1) for w in widths}
    return {"batch_size": entry["batch_size"], "target_1": chain_seconds(entry, 1), "target_1_from": "profile",
            "target_by_width": by_width, "draft_per_token": entry["draft_token_s"]}
