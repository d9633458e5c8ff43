"""SuffixDecoding's speculation: specbench.decoding.suffix against arctic-inference's own SuffixTree (its C++ module).

arctic-inference installs only with its CUDA kernels; its suffix tree builds alone (about 40 s of CPU):

    pip download arctic-inference==0.3.0 --no-deps --no-binary :all: -d /tmp/ai && tar xzf /tmp/ai/*.tar.gz -C /tmp/ai
    python -m venv /tmp/nb && /tmp/nb/bin/pip install nanobind
    cmake -S /tmp/ai/arctic_inference-0.3.0/csrc/suffix_decoding -B /tmp/ai/build \
        -DPython_EXECUTABLE=/tmp/nb/bin/python -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/ai/build
    mkdir -p /tmp/ai/pkg/arctic_inference/suffix_decoding && touch /tmp/ai/pkg/arctic_inference/__init__.py \
        /tmp/ai/pkg/arctic_inference/suffix_decoding/__init__.py && cp /tmp/ai/build/_C*.so /tmp/ai/pkg/arctic_inference/suffix_decoding/

    PYTHONPATH=/tmp/ai/pkg python docs/fidelity/cmp_suffix.py --configs 500
    PYTHONPATH=/tmp/ai/pkg python docs/fidelity/cmp_suffix.py --configs 30 --contexts 20 --write tests/data/suffix_reference.json

Each config: random sequences over a small vocabulary (many repeats and count ties), a tree depth, the sequences added
to both trees; then random contexts (half of them ending like a stored sequence) and random speculation settings
(max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob, path or tree). A case matches when tokens,
parents, probabilities (float32), score and match length are equal. `--write` stores the cases and the reference's
answers as JSON, which tests/test_suffix.py checks in CI without arctic-inference.
"""

from __future__ import annotations

import argparse
import json
import random

import numpy as np
from arctic_inference.suffix_decoding._C import SuffixTree

from specbench.decoding.suffix import SuffixIndex


def cases(seed: int, contexts: int) -> dict:
    rng = random.Random(seed)
    V, depth = rng.choice([2, 3, 5, 12]), rng.choice([4, 8, 16, 64])
    seqs = [[rng.randrange(V) for _ in range(rng.randint(1, 60))] for _ in range(rng.randint(1, 4))]
    out = []
    for _ in range(contexts):
        ctx = [rng.randrange(V) for _ in range(rng.randint(1, 20))]
        if rng.random() < 0.5:
            s = rng.choice(seqs)
            ctx = ctx[: rng.randint(0, 5)] + s[: rng.randint(1, len(s))]
        args = [rng.choice([1, 4, 16, 64]), rng.choice([1.0, 0.5, 2.0, 1.5]), rng.choice([0.0, 1.0, -1.0]),
                rng.choice([0.0, 0.1, 0.3]), rng.random() < 0.5]
        out.append({"context": ctx[-depth:], "args": args})
    return {"depth": depth, "sequences": seqs, "cases": out}


def answer(d) -> dict:
    return {"tokens": list(d.token_ids), "parents": list(d.parents), "probs": [float(p) for p in d.probs],
            "score": float(d.score), "match_len": int(d.match_len)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", type=int, default=200)
    ap.add_argument("--contexts", type=int, default=200)
    ap.add_argument("--write", default=None, help="store the cases and the reference's answers here (JSON)")
    args = ap.parse_args()
    configs, bad, n = [], 0, 0
    for seed in range(args.configs):
        c = cases(seed, args.contexts)
        ref, ours = SuffixTree(c["depth"]), SuffixIndex(c["depth"])
        for i, s in enumerate(c["sequences"]):
            ref.extend(i, s)
            ours.new_sequence(s)
        for case in c["cases"]:
            want = answer(ref.speculate(case["context"], *case["args"]))
            d = ours.speculate(case["context"], *case["args"])
            got = {"tokens": d.tokens, "parents": d.parents, "probs": d.probs, "score": d.score,
                   "match_len": d.match_len}
            n += 1
            f32 = lambda a: (a["tokens"], a["parents"], [np.float32(p) for p in a["probs"]], np.float32(a["score"]),
                             a["match_len"])
            if f32(got) != f32(want):
                bad += 1
                print(f"!! config {seed} context {case['context']} args {case['args']}: ours {got} reference {want}")
            case["reference"] = want
        configs.append(c)
    print(f"   {n} speculations ({args.configs} configs), {bad} differ from arctic-inference's SuffixTree")
    if args.write:
        with open(args.write, "w") as f:
            json.dump(configs, f, separators=(",", ":"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
