"""Measuring hardware cost profiles (their format: specbench.decoding.profiles): what one pair's calls cost on one
machine, so a run measured elsewhere can be projected onto it (`python -m specbench.report DIR --profile PROFILE`).

Every cost is the median wall seconds of `steps` forwards after a cached prompt (rolled back after each); the first
two forwards of each are warm-up (a compiled width's graph is built there).
"""

from __future__ import annotations

import statistics
from pathlib import Path
import torch
from transformers import PreTrainedModel

from specbench.bench.gpu_report import driver
from specbench.common.files import write_json_atomic
from specbench.decoding.compiled import WIDTHS, StaticState
from specbench.decoding.profiles import FORMAT, Entry, shapes
from specbench.decoding.state import ModelState, sync
from specbench.decoding.tree_state import TreeState
from specbench.models.pairs import Pair
from specbench.runs.provenance import cpu_record

CHAIN_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64)  # tokens per row of the verify forwards
TREE_NODES = (16, 32, 64)
DRAFT_WIDTHS = (1, 2, 3, 4, 6, 8, 16)  # tokens per row of the draft's forwards (eager entries): chains feed 1-2, trees more
BATCH_SIZES = (1, 4, 16, 64)
HIDDEN_WIDTHS = (1, 2, 4, 8, 16)  # verifies that return hidden states (EAGLE-3's chains: up to γ + 1 tokens)
PREFILL_TOKENS = (32, 128, 512)  # prompt lengths of the prefill forwards (a generation's first; those within the
# pair's context), interpolated between
LONGER = 256  # the longer cache's extra tokens (within the pair's context), whose forwards price a run's contexts


def device_name(device: torch.device) -> str:
    """The GPU's name, or 'cpu (N threads)'."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).name
    return f"cpu ({torch.get_num_threads()} threads)"


def forward_seconds(model: PreTrainedModel, prompt: list[int], width: int, rows: int = 1, compile: bool = False,
                    steps: int = 15, layers: tuple[int, ...] = (), every_logit: bool = True) -> float:
    """Median seconds of one forward of `width` new tokens in each of `rows` rows on top of a cached prompt
    (rolled back each time), on the eager state or the compiled one (static cache, one row, the padded width);
    with `layers`, a forward that also returns those layers' hidden states (an EAGLE-3 or SD² verify).

    every_logit: the forward computes the logits of all `width` tokens, as a verify does (the rule reads each
    position; with a large vocabulary the output layer is a sizeable share of the forward: Qwen2.5-Coder-1.5B's
    151936 x 1536 is 0.23 GMAC a token beside its body's 1.3); False: of the last one only, as a draft's forward
    does. The compiled path always computes all of them (one graph per width)."""
    buf = torch.tensor([prompt + [65] * width] * rows, dtype=torch.long, device=model.device)  # [B, P + width]
    state = StaticState(model, 1, len(prompt) + width + 1, "bench") if compile else ModelState(model, rows)
    state.forward(buf, len(prompt), 1)
    times = []
    for _ in range(steps + 2):  # the first two: warm-up (a compiled width's graph is built here)
        t0 = state.seconds
        state.forward(buf, len(prompt) + width, width if every_logit else 1, layers)
        sync(model.device)
        state.settle()
        times.append(state.seconds - t0)
        state.crop(len(prompt))
    return statistics.median(times[2:])


def prefill_seconds(model: PreTrainedModel, prompt: list[int], tokens: int, steps: int = 3) -> float:
    """Median seconds of a forward of a `tokens`-token prompt (`prompt` repeated) into an empty cache, keeping the last
    logits as a generation's first forward does; after one warm-up (long prompts: fewer steps)."""
    ids = (prompt * (tokens // max(len(prompt), 1) + 1))[:tokens]
    buf = torch.tensor([ids], dtype=torch.long, device=model.device)
    times = []
    for _ in range(steps + 1):
        state = ModelState(model, 1)
        state.forward(buf, tokens, 1)
        times.append(state.seconds)
    return statistics.median(times[1:])


def tree_seconds(model: PreTrainedModel, prompt: list[int], nodes: int, steps: int = 15) -> float:
    """Median seconds of one tree-attention forward of the root's token and `nodes` nodes (node j's parent
    (j - 1) // 2: a complete binary tree) after a cached prompt; each forward's nodes are dropped again."""
    buf = torch.tensor([prompt + [65]], dtype=torch.long, device=model.device)
    state = TreeState(model)
    state.forward(buf, len(prompt) - 1, 1)  # the prompt but its last token cached: each forward feeds it and the tree
    parents = [(j - 1) // 2 if j else -1 for j in range(nodes)]
    times = []
    for _ in range(steps + 2):
        t0 = state.seconds
        state.feed_trees(buf, [len(prompt)], [[65] * nodes], [parents], True)
        times.append(state.seconds - t0)
        state.keep_paths([len(prompt) - 1], [[]])
    return statistics.median(times[2:])


def measure_entry(pair: Pair, name: str, prompt: list[int], path: str, rows: int, steps: int,
                  trees: tuple[int, ...] = TREE_NODES) -> Entry:
    """One profile entry of `pair` (named `name`) on its device: the target's chains at each width, the draft's forwards
    (compiled: of one token, no further graphs built; eager: DRAFT_WIDTHS) and, eager at B = 1, both models' trees, the
    target's chains that return hidden states (HIDDEN_WIDTHS), both models' prefills (PREFILL_TOKENS) and their chains
    after a longer cache of `long_tokens` (the prompt plus LONGER, within the pair's context)."""
    compile = path == "compiled"
    t, d = pair.target, pair.model("draft")
    widths = [w for w in WIDTHS if w <= max(CHAIN_WIDTHS)] if compile else CHAIN_WIDTHS  # compiled: the graphs' widths
    chains = {str(w): forward_seconds(t, prompt, w, rows, compile, steps) for w in widths}
    tree = {str(n): tree_seconds(t, prompt, n, steps) for n in trees} if rows == 1 and not compile else {}
    drafts = {str(w): forward_seconds(d, prompt, w, rows, compile, steps, every_logit=False)
              for w in ((1,) if compile else DRAFT_WIDTHS)}
    draft_trees = {str(w): tree_seconds(d, prompt, w - 1, steps) for w in DRAFT_WIDTHS} if tree else {}
    # three hidden-state indices (low, middle, high: the states an EAGLE-3 head reads); which ones does not change the
    # forward's cost, only that three are returned
    n_layers = t.config.get_text_config().num_hidden_layers
    layers = tuple(sorted({min(2, n_layers), max(1, n_layers // 2), max(1, n_layers - 3)}))
    hidden = {str(w): forward_seconds(t, prompt, w, rows, compile, steps, layers) for w in HIDDEN_WIDTHS} if tree else {}
    context = pair.context_length([t, d]) or max(PREFILL_TOKENS)
    lengths = [n for n in PREFILL_TOKENS if n <= context] or [context]
    L = min(len(prompt) + LONGER, context - max(CHAIN_WIDTHS) - 1)  # the longer cache, leaving room for every width
    longer = (prompt * (L // max(len(prompt), 1) + 1))[:L] if tree and L >= len(prompt) + 16 else None
    prefill = {role: {str(n): prefill_seconds(m, prompt, n, min(steps, 3)) for n in lengths}
               for role, m in (("target", t), ("draft", d))} if tree else {}
    entry = Entry(pair=name, shapes={"target": shapes(t), "draft": shapes(d)},
                  dtype=str(t.dtype).removeprefix("torch."), device=device_name(t.device), path=path, batch_size=rows,
                  prompt_tokens=len(prompt), target_chain_s=chains, target_tree_s=tree, draft_token_s=drafts["1"])
    if not compile:
        entry["draft_chain_s"] = drafts
    if draft_trees:
        entry["draft_tree_s"] = draft_trees
    if hidden:
        entry["target_hidden_s"] = hidden
    if prefill:
        entry["target_prefill_s"], entry["draft_prefill_s"] = prefill["target"], prefill["draft"]
    if longer:
        entry["long_tokens"] = L
        entry["target_chain_long_s"] = {str(w): forward_seconds(t, longer, w, 1, False, steps) for w in CHAIN_WIDTHS}
        entry["draft_chain_long_s"] = {str(w): forward_seconds(d, longer, w, 1, False, steps, every_logit=False)
                                       for w in DRAFT_WIDTHS}
    return entry


def hardware(entries: list[Entry]) -> dict[str, object]:
    """What the profile was measured on: the CPU's model and speed-deciding flags, and the GPU's name and driver where
    its entries ran on one (what a projection compares with a run's machine: analysis.projection_costs)."""
    gpu = next((e["device"] for e in entries if not e["device"].startswith("cpu")), None)
    return {"cpu": cpu_record(), "gpu": None if gpu is None else {"name": gpu, "driver": driver()}}


def write(path: Path, name: str, header: dict[str, object], entries: list[Entry]) -> None:
    """profile.json (atomically: a reader never sees half of it), with the hardware it was measured on."""
    write_json_atomic(path, {"format": FORMAT, "name": name, **header, "hardware": hardware(entries),
                             "entries": entries})


