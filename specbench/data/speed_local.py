"""SPEED-Bench-format throughput files from local text, for machines that cannot fetch SPEED-Bench's sources.

    python -m specbench.data.speed_local --data-dir DATA --tokenizer Qwen/Qwen2.5-Coder-1.5B-Instruct \
        --tokens 1000,2000,8000 --per-tier 2 --out local_speed

writes <out>/speed/throughput_<k>k/test.parquet (k = tokens / 1000) in SPEED-Bench's schema, read by
`dataset=speed_bench dataset.config=throughput_<k>k dataset.data_dir=<out>`: per tier (PIECES, TAILS) local text cut
to `tokens` tokens of the target's own tokenizer (SPEED-Bench counts with tiktoken's o200k_base). These are not
SPEED-Bench's prompts: figures on them say so.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import logging
import sys
from pathlib import Path
from typing import Callable, Iterator

from specbench.data.dataset import Row, read_local

log = logging.getLogger(__name__)

TIERS = ("low_entropy", "mixed", "high_entropy")


# tier -> the k-th piece of text of a prompt, from a row of the tier's set
PIECES: dict[str, Callable[[Row, int], str]] = {
    "low_entropy": lambda r, k: r["prompt"] + r["canonical_solution"] + "\n\n",
    "mixed": lambda r, k: (f"Question {k + 1}: {r['question']}\n"
                           + "".join(f"{'ABCD'[j]}. {c}\n" for j, c in enumerate(r["choices"])) + "\n"),
    "high_entropy": lambda r, k: r["document"] + "\n\n",
}


def pieces(rows: list[Row], start: int, tier: str) -> Iterator[str]:
    """The tier's pieces of the rows from `start` on, cycling through them."""
    for k in itertools.count():
        yield PIECES[tier](rows[(start + k) % len(rows)], k)


TAILS = {"low_entropy": "Continue the code above with the next function, in the same style.",
         "mixed": "Answer Question 1 above again: give its letter and one sentence of reasons.",
         "high_entropy": "Continue the last story above in your own words."}


def build(count: Callable[[str], int], cut: Callable[[str, int], str], tier: str, pieces: Iterator[str],
          tokens: int) -> str:
    """Pieces of text joined until the prompt reaches `tokens` tokens (count), cut there (cut), the tier's request
    last; the request's tokens are part of the budget."""
    tail = "\n\n" + TAILS[tier]
    body = ""
    while count(body + tail) < tokens:
        body += next(pieces)
    budget = tokens - count(tail)
    return cut(body, budget) + tail


def write(out: Path, tokens: int, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("question_id", pa.string()), ("category", pa.string()), ("sub_category", pa.string()),
                        ("turns", pa.list_(pa.string())), ("source", pa.string()), ("src_id", pa.string()),
                        ("difficulty", pa.string()), ("multiturn", pa.bool_())])
    path = out / "speed" / f"throughput_{tokens // 1000}k" / "test.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    tmp.replace(path)  # all or nothing
    return path


def make(data_dir: Path, tokenizer, tokens: list[int], per_tier: int, out: Path) -> list[Path]:
    """One throughput file per token count, `per_tier` prompts per tier (module docstring)."""
    sources = {"low_entropy": ("humaneval", read_local(data_dir / "humaneval" / "HumanEval.jsonl.gz")),
               "mixed": ("mmlu", read_local(data_dir / "mmlu" / "test.jsonl")),
               "high_entropy": ("xsum", read_local(data_dir / "xsum" / "test_1000.jsonl"))}

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def cut(text: str, n: int) -> str:
        return tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"][:n])

    written = []
    for n in tokens:
        if n < 1000 or n % 1000:
            raise ValueError(f"--tokens {n}: SPEED-Bench's buckets are multiples of 1000 tokens (1000, 2000, 8000, ...)")
        rows = []
        for j in range(per_tier):
            for tier in TIERS:
                name, src = sources[tier]
                start = j * 37  # another stretch of the set for each prompt
                text = build(count, cut, tier, pieces(src, start, tier), n)
                rows.append({"question_id": hashlib.md5(f"{tier}-{n}-{j}".encode()).hexdigest(), "category": tier,
                             "sub_category": f"local_{name}", "turns": [text], "source": f"local:{name}",
                             "src_id": f"{name}_{start}", "difficulty": "", "multiturn": False})
        written.append(write(out, n, rows))
        log.info("wrote %s: %d prompts of %d tokens", written[-1], len(rows), n)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specbench.data.speed_local", description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True, help="a local data folder holding humaneval/, mmlu/test.jsonl, xsum/")
    ap.add_argument("--tokenizer", required=True, help="a hub id or folder of the tokenizer that counts the tokens")
    ap.add_argument("--tokens", default="1000,2000,8000", help="input lengths, multiples of 1000 (default 1000,2000,8000)")
    ap.add_argument("--per-tier", type=int, default=2, help="prompts per entropy tier (default 2)")
    ap.add_argument("--out", required=True, help="the folder to write speed/throughput_<k>k/test.parquet under")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from transformers import AutoTokenizer

    try:
        tokens = [int(t) for t in args.tokens.split(",")]
        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        for p in make(Path(args.data_dir), tok, tokens, args.per_tier, Path(args.out)):
            print(p)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
