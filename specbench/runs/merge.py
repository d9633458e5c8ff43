"""Merge the shard runs of one configuration into one run folder, with a recomputed summary.

    python run.py -m hydra/launcher=slurm dataset=gsm8k shard=$(seq -s, -f '%g/8' 0 7)
    python -m specbench.runs.merge results/<pair>/gsm8k            # every shard group found below
    python -m specbench.runs.merge SHARD_DIR ... [--out DIR]       # exactly these shards

A shard group is the finished run folders whose run identities are equal but for `shard`, merged only when complete
(check_group); anything else is refused with the reason, writing nothing for it. The merged folder is what the
unsharded run writes, by default the folder `python run.py` uses for the same config without the shard, so rerunning
that command resumes it with nothing left to do. Merging again is safe: identical rows are kept and the summary
rewritten; different rows refuse. The merged folder is written holding its lock (folder_lock).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specbench.data.dataset import parse_shard
from specbench.decoding.metrics import summarize
from specbench.runs.results import CONFIG, ROWS, SUMMARY, FolderLocked, folder_lock, read_rows
from specbench.common.configs import differing
from specbench.runs.layout import unsharded
from specbench.runs.measurements import peaks
from specbench.runs.identity import identity as run_identity
from specbench.common.files import write_json_atomic, write_text_atomic
from specbench.common.progress import progress_bar

log = logging.getLogger(__name__)


class MergeError(ValueError):
    """Shards that cannot be merged; the message says which and why."""


@dataclass
class Shard:
    """One shard run: its folder, config.json record, summary and rows; `problem` says why it is unfinished."""

    dir: Path
    record: dict
    summary: dict
    rows: list[dict]
    index: int
    count: int
    problem: str | None = None


def load_shard(run_dir: Path) -> Shard:
    """Read a shard run folder (a folder without config.json or without a shard is an error)."""
    if not (run_dir / CONFIG).exists():
        raise MergeError(f"{run_dir}: no {CONFIG} (not a run folder)")
    record = json.loads((run_dir / CONFIG).read_text())
    shard = parse_shard(record["config"].get("shard"))
    if shard is None:
        raise MergeError(f"{run_dir}: not a shard run (its shard is null)")
    rows = read_rows(run_dir / ROWS)
    summary = json.loads((run_dir / SUMMARY).read_text()) if (run_dir / SUMMARY).exists() else {}
    problem = None
    if summary.get("n_examples") != len(rows):  # the runner writes summary.json after the last row
        problem = (f"{run_dir}: unfinished shard (summary.json: {summary.get('n_examples', 'absent')} rows, "
                   f"rows.jsonl: {len(rows)}); rerun its job to finish it")
    return Shard(run_dir, record, summary, rows, *shard, problem=problem)


def identity(config: dict) -> dict:
    """What a shard group shares: the run identity (specbench.runs.identity) without the shard, `limit` kept."""
    return run_identity(config, drop={("shard",)}, keep={("limit",)})


def config_diff(a: dict, b: dict) -> list[str]:
    """'key: a vs b' for every flattened key where two configs differ (specbench.common.configs.differing)."""
    return [f"{k}: {x!r} vs {y!r}" for k, (x, y) in differing(a, b).items()]


def group_shards(shards: list[Shard]) -> list[list[Shard]]:
    """Shards grouped by identity (first-seen order)."""
    groups: dict[str, list[Shard]] = {}
    for s in shards:
        groups.setdefault(json.dumps(identity(s.record["config"]), sort_keys=True, default=str), []).append(s)
    return list(groups.values())


def check_group(group: list[Shard]) -> None:
    """Refuse a group that is not exactly one complete, disjoint round-robin split of one example list."""
    for s in group:
        if s.problem:
            raise MergeError(s.problem)
    counts = {s.count for s in group}
    if len(counts) != 1:
        raise MergeError(f"shards of different splits (n = {sorted(counts)}): {[str(s.dir) for s in group]}")
    n = counts.pop()
    seen: dict[int, Path] = {}
    for s in group:
        if s.index in seen:
            raise MergeError(f"shard {s.index}/{n} appears twice: {seen[s.index]} and {s.dir}")
        seen[s.index] = s.dir
    missing = [f"{i}/{n}" for i in range(n) if i not in seen]
    if missing:
        raise MergeError(f"missing shard(s) {', '.join(missing)} of the group of {group[0].dir}")
    owner: dict[str, Path] = {}
    for s in group:
        for r in s.rows:
            if r["id"] in owner:
                raise MergeError(f"example {r['id']!r} is in two shards: {owner[r['id']]} and {s.dir}")
            owner[r["id"]] = s.dir
    total = len(owner)
    for s in group:  # shard i of a round-robin split of N examples holds ceil((N - i) / n)
        expected = -(-(total - s.index) // n)
        if len(s.rows) != expected:
            raise MergeError(f"{s.dir}: shard {s.index}/{n} has {len(s.rows)} rows, but a split of {total} "
                             f"examples gives it {expected}")


def merged_rows(group: list[Shard]) -> list[dict]:
    """Rows back in the dataset's order: example k*n + i is row k of shard i."""
    by_index = {s.index: s.rows for s in group}
    n, out = len(group), []
    for k in range(max(len(r) for r in by_index.values())):
        out += [by_index[i][k] for i in range(n) if k < len(by_index[i])]
    return out


def default_out(group: list[Shard]) -> Path:
    """The folder of the same config without the shard: each shard's folder name minus its shard=iofn
    (specbench.runs.layout.unsharded)."""
    outs = set()
    for s in group:
        name = unsharded(s.dir.name)
        if name is None:
            raise MergeError(f"{s.dir}: the folder name does not hold one 'shard=iofn' (the name a shard i/n "
                             "run gets); pass --out")
        outs.add(str(s.dir.parent / name))
    if len(outs) != 1:
        raise MergeError(f"the shards' paths give different merged folders {sorted(outs)}; pass --out")
    return Path(outs.pop())


def merged_summary(group: list[Shard], rows: list[dict], record: dict) -> dict:
    """summarize() over all rows, the runner's run fields, peak memory over shards, and each shard's provenance."""
    first, summaries = group[0].summary, [s.summary for s in group]
    shards = [{"dir": str(s.dir), "shard": f"{s.index}/{s.count}", "n_examples": len(s.rows),
               "finished": s.summary.get("finished"), "git_hash": s.record.get("git_hash"),
               "device_info": s.record.get("device_info"), "versions": s.record.get("versions")}
              for s in sorted(group, key=lambda s: s.index)]
    return {**summarize(rows), **{k: first.get(k) for k in ("method", "pair", "dataset", "lossless")},
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **peaks(summaries), **record, "merged_from": shards}


def write_merged(group: list[Shard], out: Path) -> dict:
    """Check the group and write its merged run folder at `out`, holding its lock (rows in the dataset's order, config
    with `shard: null`, summary with each shard's provenance under `merged_from`, traces); returns the summary."""
    check_group(group)
    try:
        with folder_lock(out):  # `out` is the folder `python run.py` resumes: never write it beside a run
            return _write_merged(sorted(group, key=lambda s: s.index), out)
    except FolderLocked as e:
        raise MergeError(str(e)) from None


def _write_merged(group: list[Shard], out: Path) -> dict:
    """write_merged's writing, under the lock of `out`."""
    for key in ("git_hash", "versions", "device_info"):
        if len({json.dumps(s.record.get(key), sort_keys=True) for s in group}) > 1:
            log.warning("%s: the shards differ in %s (each shard's is under merged_from)", out, key)
    rows = merged_rows(group)
    record = copy.deepcopy(group[0].record)
    record["config"]["shard"] = None
    if (out / CONFIG).exists():
        old = json.loads((out / CONFIG).read_text())["config"]
        if identity(old) != identity(record["config"]):
            diff = "; ".join(config_diff(old, record["config"]))
            raise MergeError(f"{out} holds a different configuration ({diff}); refusing to merge into it: pass another "
                             "--out")
    if (out / ROWS).exists():
        old_rows = read_rows(out / ROWS)
        if old_rows != rows:
            raise MergeError(f"{out / ROWS} already holds other rows ({len(old_rows)}); refusing to replace them")
    else:
        write_text_atomic(out / ROWS, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    for s in group:
        for t in sorted((s.dir / "traces").glob("*.parquet")):
            (out / "traces").mkdir(exist_ok=True)
            shutil.copy2(t, out / "traces" / t.name)
    write_json_atomic(out / CONFIG, record)
    summary = merged_summary(group, rows, record)
    write_json_atomic(out / SUMMARY, summary)
    return summary


def find_shards(paths: list[Path]) -> tuple[list[Shard], bool]:
    """Shard runs at or below `paths`; True when every path was itself a run folder (explicit shards)."""
    dirs: list[Path] = []
    explicit = True
    for p in paths:
        if (p / CONFIG).exists():
            dirs.append(p)
            continue
        if not p.is_dir():
            raise MergeError(f"{p}: no such folder")
        explicit = False
        for cfg in sorted(p.rglob(CONFIG)):
            shard = json.loads(cfg.read_text()).get("config", {}).get("shard")
            if shard not in (None, ""):
                dirs.append(cfg.parent)
    return [load_shard(d) for d in progress_bar(dirs, desc="reading shards", unit="run")], explicit


def main(argv: list[str] | None = None) -> int:
    """Command line: merge every complete shard group given or found; non-zero exit if any was refused."""
    ap = argparse.ArgumentParser(prog="python -m specbench.runs.merge", description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="shard run folders, or folders to search for them")
    ap.add_argument("--out", type=Path,
                    help="merged run folder (only for one group; default: the path without the shard)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        shards, explicit = find_shards(args.paths)
        if not shards:
            raise MergeError(f"no shard runs (shard set) in {', '.join(map(str, args.paths))}")
        groups = group_shards(shards)
        if len(groups) > 1 and (explicit or args.out):
            a, b = groups[0][0], groups[1][0]
            raise MergeError(f"the shards differ in config beyond the shard ({a.dir} vs {b.dir}: "
                             f"{'; '.join(config_diff(identity(a.record['config']), identity(b.record['config'])))})")
    except MergeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    failed = 0
    for group in groups:
        try:
            out = args.out or default_out(group)
            s = write_merged(group, out)
            print(f"merged {len(group)} shards, {s['n_examples']} rows -> {out}")
        except MergeError as e:
            failed += 1
            print(f"error: {e}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
