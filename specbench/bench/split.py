"""`bench gpu`'s `split` section: the pair's target placed over two places by accelerate under a memory cap, as
`from_pretrained(device_map="auto", max_memory=...)` places a target too large for one GPU (`pair=llama70b_8b`):
half of it on the GPU and the rest on the CPU (on a CPU: the CPU and disk offload). Its greedy `ar` and `vanilla`
rows are compared with the same pair's on one device, token for token, and both tokens/s are reported.

accelerate's `infer_auto_device_map` and `dispatch_model` are what from_pretrained calls for a device_map; the
shaped pairs are built on the device rather than read from files, so the section dispatches the built target (the
loading side, from files with max_memory and offload_folder, is tests/test_runtime.py's)."""

from __future__ import annotations

import tempfile
import time
from collections import Counter

import torch

from specbench.bench.common import engines
from specbench.models.pairs import Pair


def split_map(model: torch.nn.Module, device: torch.device, fraction: float = 0.5) -> dict[str, int | str]:
    """A device_map holding about `fraction` of the model's bytes on `device` and the rest on the CPU (a CUDA
    device) or on disk (the CPU), decoder layers kept whole."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import compute_module_sizes

    size = compute_module_sizes(model)[""]
    cap: dict[int | str, int] = ({device.index or 0: int(size * fraction), "cpu": 4 * size} if device.type == "cuda"
                                 else {"cpu": int(size * fraction)})
    return dict(infer_auto_device_map(model, max_memory=cap,
                                      no_split_module_classes=getattr(model, "_no_split_modules", None) or []))


def generate_all(pair: Pair, prompts: list[list[int]], gamma: int, max_new: int) -> dict[str, tuple[list, float]]:
    """(each prompt's token ids, tokens per second) of eager ar and vanilla, after a warm-up on the first prompt."""
    out = {}
    for label, engine in engines(pair, gamma, max_new, ("eager",)).items():
        engine.generate(prompts[0], max_new)
        t0 = time.perf_counter()
        tokens = [engine.generate(p, max_new).token_ids for p in prompts]
        out[label] = (tokens, sum(map(len, tokens)) / (time.perf_counter() - t0))
    return out


def split_figures(pair: Pair, prompts: list[list[int]], gamma: int, max_new: int) -> dict:
    """The pair's ar and vanilla on one device, then with its target split by split_map: the placement (modules per
    device), both runs' tokens/s and the labels whose tokens differ. The target stays split: the pair's last use."""
    from accelerate import dispatch_model

    device = pair.target.device
    one = generate_all(pair, prompts, gamma, max_new)
    placement = split_map(pair.target, device)
    with tempfile.TemporaryDirectory(prefix="specbench-offload-") as offload:
        dispatch_model(pair.target, device_map=placement, offload_dir=offload, main_device=str(device))
        split = generate_all(pair, prompts, gamma, max_new)
    return {"placement": dict(Counter(map(str, placement.values()))),
            "tps": {label: {"one device": one[label][1], "split": split[label][1]} for label in one},
            "differ": [label for label in one if one[label][0] != split[label][0]]}
