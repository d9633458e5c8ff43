"""Hardware cost profiles as data: what one pair's calls cost on one machine (measured by specbench.bench.profile),
and the call costs of an iteration read off one, for the predicted speedup (specbench.decoding.speedup).

A profile (profile.json) is {"format": 1, "name", "machine", "versions", "command", "entries": [...]}; an entry is
one (pair, dtype, device, path, batch size); keys marked * are lacking in older profiles:

    {"pair": "llama31_8b_1b_shaped", "shapes": {"target": {...}, "draft": {...}}, "dtype": "bfloat16",
     "device": "NVIDIA H100 80GB HBM3", "path": "eager" | "compiled", "batch_size": B, "prompt_tokens": P,
     "target_chain_s": {"k": s},   # one target forward of k new tokens per row (a chain: 1 + drafts), B rows
     "target_tree_s": {"n": s},    # one tree-attention forward of the root's token and n nodes (B = 1, eager)
     "draft_token_s": s,           # one draft forward of 1 token per row, B rows
     "draft_chain_s": {"k": s},    # * one draft forward of k tokens per row, B rows (eager; else draft_token_s)
     "draft_tree_s": {"k": s},     # * one draft tree-attention forward of the root's and k - 1 nodes (B = 1, eager)
     "target_hidden_s": {"k": s},  # * a target forward of k tokens also returning three layers' hidden states
                                   #   (EAGLE-3's and SD²'s verifies; B = 1, eager)
     "target_prefill_s": {"P": s}, # * one target forward of a P-token prompt into an empty cache (B = 1, eager)
     "draft_prefill_s": {"P": s},  # * the draft's likewise
     "long_tokens": L,             # * a longer cache, L > P tokens (B = 1, eager), and after it:
     "target_chain_long_s": {"k": s},  # * the target's chains
     "draft_chain_long_s": {"k": s}}   # * the draft's forwards

every s (but the prefills') the median wall seconds of several forwards after a cached prompt of P tokens (rolled
back after each). Compiled forwards are padded to the compiled widths (specbench.decoding.compiled.WIDTHS), which a
compiled entry lists; trees run eagerly at B = 1. Between measured widths the cost is interpolated linearly, beyond
the widest extrapolated from the last two; a tree smaller than the smallest measured is interpolated from the
one-token forward (a tree of 0 nodes). A forward over a cache of kv tokens (a run's mean context, not P) costs its
cost after P times kv_scale, linear in the cache between P and `long_tokens` where the entry has them, whose
forwards attend over more keys: the attention's share of a forward grows with the cache.
`shapes` (SHAPE_KEYS of each model's config) decides the costs at one dtype:
a run records its pair's (config.json runtime.shapes), and `pair_entries` / `pick` choose the entry to cost it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

FORMAT = 1
SHAPE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size")  # an entry matches a run by these
LAYOUT_KEYS = ("head_dim",)  # recorded beside them for the roofline (specbench.runs.roofline), not matched
ENTRY_KEYS: dict[str, type | tuple[type, ...]] = {  # what every entry must have to cost an iteration
    "pair": str, "dtype": str, "path": str, "batch_size": int, "target_chain_s": dict, "draft_token_s": (int, float)}


class ProfileError(ValueError):
    """A profile that cannot be read or used (a missing or invalid file, no entry for a run's pair); names the file."""


def shapes(model: object) -> dict[str, object]:
    """The shape and layout keys of a model's (text) config: what decides its call costs at one dtype."""
    cfg = model.config.get_text_config()  # type: ignore[attr-defined]
    return {k: getattr(cfg, k, None) for k in (*SHAPE_KEYS, *LAYOUT_KEYS)}


def same_shapes(a: Mapping[str, object] | None, b: Mapping[str, object] | None) -> bool:
    """Do two models' recorded shapes agree in SHAPE_KEYS (older records lack the layout keys)?"""
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in SHAPE_KEYS)


class OptionalKeys(TypedDict, total=False):
    """Entry keys older profiles lack."""

    draft_chain_s: dict[str, float]
    draft_tree_s: dict[str, float]
    target_hidden_s: dict[str, float]
    target_prefill_s: dict[str, float]
    draft_prefill_s: dict[str, float]
    long_tokens: int
    target_chain_long_s: dict[str, float]
    draft_chain_long_s: dict[str, float]


class Entry(OptionalKeys):
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
    """A profile.json checked for its format and entries' keys, `_file` its path; else ProfileError naming it."""
    hint = ("profiles are written by `python -m specbench.bench verify --pair NAME --profile FILE` and "
            "`python -m specbench.bench gpu`")
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ProfileError(f"cost profile {path}: no such file ({hint})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"cost profile {path}: cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"cost profile {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
        raise ProfileError(f"{path}: not a specbench cost profile (format {FORMAT} with 'entries'); {hint}")
    for i, entry in enumerate(data["entries"]):
        bad = [k for k, t in ENTRY_KEYS.items() if not isinstance(entry, dict) or not isinstance(entry.get(k), t)]
        if bad or not entry["target_chain_s"]:
            raise ProfileError(f"{path}: entry {i} lacks {', '.join(bad or ['target_chain_s'])} (every entry needs "
                               f"{', '.join(ENTRY_KEYS)}); {hint}")
    data.setdefault("name", str(path))
    return {**data, "_file": str(path)}  # where it was read from, for the errors that name it


def interpolate(points: dict[str, float], x: float) -> float:
    """The piecewise-linear function through points {"k": seconds} at x, extended by the end segments' lines."""
    xs = sorted(int(k) for k in points)
    if len(xs) == 1:
        return points[str(xs[0])]
    i = next((j for j in range(1, len(xs)) if xs[j] >= x), len(xs) - 1)
    (x0, x1), (y0, y1) = (xs[i - 1], xs[i]), (points[str(xs[i - 1])], points[str(xs[i])])
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def chain_seconds(entry: Entry, tokens: float) -> float:
    """Seconds of one target forward of `tokens` tokens per row: a compiled one costs its padded width's graph (wider
    than every graph: eager, so extrapolated); eager ones are interpolated."""
    if entry["path"] == "compiled":
        padded = next((w for w in sorted(map(int, entry["target_chain_s"])) if w >= tokens), None)
        if padded is not None:
            return entry["target_chain_s"][str(padded)]
    return interpolate(entry["target_chain_s"], tokens)


def tree_seconds(entry: Entry, nodes: float) -> float:
    """Seconds of one tree-attention forward of the root's token and `nodes` nodes (an entry without trees: the
    chain of nodes + 1 tokens)."""
    trees = entry.get("target_tree_s") or {}
    if not trees:
        return chain_seconds(entry, nodes + 1)
    if nodes < min(map(int, trees)):
        return interpolate({"0": chain_seconds(entry, 1), **trees}, nodes)
    return interpolate(trees, nodes)


def draft_seconds(entry: Entry, tokens: float, tree: bool = False, kv: float | None = None) -> float:
    """Seconds of one draft forward of `tokens` tokens per row (with `tree` a tree-attention forward) over a cache of
    `kv` tokens (kv_scale); an entry without those widths (older, or compiled): its one-token forward."""
    widths = entry.get("draft_tree_s") if tree else entry.get("draft_chain_s")
    seconds = interpolate(widths, tokens) if widths else entry["draft_token_s"]
    return seconds * kv_scale(entry, "draft", tokens, kv)


def kv_scale(entry: Entry, role: str, tokens: float, kv: float | None) -> float:
    """The factor by which a `role` forward of `tokens` a row over a cache of kv tokens costs more than over the
    entry's P = prompt_tokens: 1 + (kv - P) / (L - P) x (c_L(tokens) / c_P(tokens) - 1), c_P and c_L its chain
    forwards after P and after L = long_tokens (linear in the cache, extrapolated past L); 1 where the entry has no
    long forwards or kv is None."""
    target = role == "target"
    longer = entry.get("target_chain_long_s") if target else entry.get("draft_chain_long_s")
    short = entry["target_chain_s"] if target else entry.get("draft_chain_s")
    L, P = entry.get("long_tokens"), entry.get("prompt_tokens")
    if kv is None or not longer or not short or not L or P is None or L <= P:
        return 1.0
    return 1 + (kv - P) / (L - P) * (interpolate(longer, tokens) / interpolate(short, tokens) - 1)


def iteration_costs(entry: Entry, widths: list[int], tree: bool = False, draft_per_node: float | None = None,
                    hidden: bool = False, look: Mapping[str, float] | None = None, kv: float | None = None
                    ) -> dict[str, object]:
    """The call costs (speedup.call_costs' format) of iterations that verified w nodes, w in `widths`, off an entry:
    target_by_width["w+1"] the forward of the root's token, w nodes and look[w] look-only nodes (their mean per such
    iteration: Lookahead's window; with `tree` a tree; with `hidden` a chain also returning hidden states,
    target_hidden_s where present), target_1 ar's step, draft_per_token `draft_per_node`
    (specbench.runs.projection) or else the draft's one-token forward; every target forward over a cache of `kv`
    tokens (kv_scale; None: the entry's prompt)."""
    states = entry.get("target_hidden_s") if hidden and not tree else None  # chains that return hidden states
    fed = {w: w + (look or {}).get(str(w), 0.0) for w in widths}  # nodes fed besides the root
    by_width = {str(w + 1): (tree_seconds(entry, fed[w]) if tree and fed[w] else interpolate(states, fed[w] + 1)
                             if states else chain_seconds(entry, fed[w] + 1)) * kv_scale(entry, "target", fed[w] + 1, kv)
                for w in widths}
    return {"batch_size": entry["batch_size"], "target_1": chain_seconds(entry, 1) * kv_scale(entry, "target", 1, kv),
            "target_1_from": "profile", "target_by_width": by_width,
            "draft_per_token": (entry["draft_token_s"] * kv_scale(entry, "draft", 1, kv) if draft_per_node is None
                                else draft_per_node)}


def pairs(profile: dict) -> list[str]:
    """The pair names of a profile's entries, in order."""
    return list(dict.fromkeys(e["pair"] for e in profile["entries"]))


def describe(pair: str, shapes: dict | None) -> str:
    """'toy (target llama 8 layers, hidden 128; draft llama 1 layer, hidden 128)': a pair and its shapes in words."""
    if not shapes:
        return pair
    said = [f"{role} {s.get('model_type')} {s.get('num_hidden_layers')} layer{'' if s.get('num_hidden_layers') == 1 else 's'}"
            f", hidden {s.get('hidden_size')}" for role, s in ((r, shapes.get(r)) for r in ("target", "draft")) if s]
    return f"{pair} ({'; '.join(said)})"


def pair_entries(profile: dict, pair: str, shapes: dict | None, by_name: str | None = None) -> list[Entry]:
    """The entries for a run of `pair` with `shapes` ({"target": {...}, "draft": {...} or None}; None: not
    recorded): those of the pair `by_name` when given (projecting onto another pair's costs), else those whose
    shapes equal the run's (the draft's too where it has one), else, without shapes, those of its pair's name.
    ProfileError naming the run's pair and the profile's pairs when there are none."""
    where = f"cost profile {profile['name']!r}" + (f" ({profile['_file']})" if profile.get("_file") else "")
    if by_name is not None:
        mine = [e for e in profile["entries"] if e["pair"] == by_name]
        if not mine:
            raise ProfileError(f"{where} has no pair {by_name!r} (--profile-pair); its pairs: {', '.join(pairs(profile))}")
        return mine
    if shapes:
        mine = [e for e in profile["entries"]
                if same_shapes((e.get("shapes") or {}).get("target"), shapes.get("target"))
                and (not shapes.get("draft") or same_shapes((e.get("shapes") or {}).get("draft"), shapes["draft"]))]
    else:
        mine = [e for e in profile["entries"] if e["pair"] == pair]
    if not mine:
        theirs = "; ".join(describe(p, next(e.get("shapes") for e in profile["entries"] if e["pair"] == p))
                           for p in pairs(profile))
        how = "by the shapes of target and draft" if shapes else "by pair name (the run did not record its shapes)"
        raise ProfileError(f"{where} does not match the run's pair {describe(pair, shapes)} ({how}): the profile's "
                           f"pairs are {theirs}. Measure the pair's profile (`python -m specbench.bench verify "
                           f"--pair {pair} --profile FILE`), or name a profile pair to project onto "
                           "(--profile-pair NAME)")
    return mine


def pick(entries: list[Entry], pair: str, dtype: str | None, path: str, batch_size: int,
         any_dtype: bool = False) -> tuple[Entry | None, str]:
    """(the entry at the run's dtype, path and batch size, why) or (None, why not). `dtype` None (not recorded) or
    `any_dtype` (a user-named pair) takes the entries' one dtype; the run's own pair name is preferred."""
    at = [e for e in entries if e["path"] == path and e["batch_size"] == batch_size]
    have = sorted({(e["path"], e["batch_size"], e["dtype"]) for e in entries})
    if not at:
        return None, (f"no entry at path {path}, batch_size {batch_size} (the profile's entries for the pair: "
                      f"{', '.join(f'{p} B={b} {d}' for p, b, d in have)})")
    same = [e for e in at if e["dtype"] == dtype]
    if not same and (dtype is None or any_dtype):
        dtypes = sorted({e["dtype"] for e in at})
        if len(dtypes) > 1:
            return None, f"entries in several dtypes ({', '.join(dtypes)}) and the run's dtype {dtype} is none of them"
        same = at
    if not same:
        return None, (f"no entry in the run's dtype {dtype} (the profile's for the pair at {path}, B={batch_size}: "
                      f"{', '.join(sorted({e['dtype'] for e in at}))}; --profile-pair NAME projects onto another "
                      "dtype)")
    entry = next((e for e in same if e["pair"] == pair), same[0])
    return entry, f"entry {entry['pair']} {entry['dtype']} {entry['path']} B={entry['batch_size']}"


def prefill_seconds(entry: Entry, role: str, tokens: int) -> float | None:
    """Seconds of the `role` model's forward of a `tokens`-token prompt into an empty cache (interpolated); None
    where the entry has none (older profiles, compiled and B > 1 entries)."""
    points = {"target": entry.get("target_prefill_s"), "draft": entry.get("draft_prefill_s")}.get(role) or {}
    return interpolate(points, tokens) if points else None

