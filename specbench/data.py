"""Datasets: the registry of evaluators, examples, the limit / shard selection, and the data sources.

A benchmark's rows come either from the Hugging Face hub (what users do) or, when a local data
folder is set (`dataset.data_dir`, default: the environment variable SPECBENCH_DATA_DIR), from a
file in that folder (e.g. ../shared/data). The choice is explicit: a set folder is never
bypassed for the hub and a hub failure never falls back to another set; a set that cannot be
loaded fails with a `DataSourceError` naming the source it tried.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.registry import Registry

log = logging.getLogger(__name__)

DATASETS: Registry = Registry("dataset")
DATA_DIR_ENV = "SPECBENCH_DATA_DIR"


@dataclass
class Example:
    """One benchmark item: `prompt` is a user message (str) or a list of chat messages.

    Multi-turn items (MT-bench) also set `turns`, the user turns in order: the runner asks turn k
    after the model's own answers to turns 1..k-1 (`prompt` is then the first turn).
    """

    id: str
    prompt: str | list[dict[str, str]]
    reference: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    turns: list[str] | None = None


class Evaluator:
    """Base evaluator: examples -> prompts -> scores. One subclass per benchmark under evaluators/."""

    name = "base"
    stop_strings: tuple[str, ...] = ()

    def __init__(self, data_dir: str | None = None, **options: Any) -> None:
        if options:
            raise ValueError(f"dataset {self.name!r} got unknown options {sorted(options)}")
        self.data_dir = data_dir  # local copies folder; None: the hub

    def examples(self) -> list[Example]:
        raise NotImplementedError

    def score(self, example: Example, output: str) -> dict[str, Any]:
        """Task metrics for one output; `score` is the headline number (None: not scored)."""
        return {"score": None}


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    """'i/n' -> (i, n) with 0 <= i < n."""
    if shard in (None, ""):
        return None
    try:
        i, n = (int(s) for s in str(shard).split("/"))
    except ValueError:
        raise ValueError(f"dataset.shard must look like 'i/n' (e.g. 0/4), got {shard!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"dataset.shard {shard!r}: need 0 <= i < n")
    return i, n


def select(examples: list[Example], limit: int | None, shard: str | None) -> list[Example]:
    """The first `limit` examples (in the dataset's fixed order), then every n-th from i for shard i/n."""
    if limit is not None:
        if limit < 1:
            raise ValueError(f"dataset.limit must be >= 1 or null, got {limit}")
        examples = examples[:limit]
    s = parse_shard(shard)
    if s:
        examples = examples[s[0] :: s[1]]
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise ValueError("dataset has duplicate example ids; results could not be resumed safely")
    return examples


class DataSourceError(RuntimeError):
    """A benchmark set could not be loaded from the source it was asked for."""


@dataclass(frozen=True)
class Source:
    """Where one split of a benchmark lives: online (a hub dataset `hub`, or a builder such as 'json'
    with `hub_files`; or a plain file at `url` for sets that are not on the hub) and/or as a file
    under the local data folder (`local`, relative to it)."""

    label: str
    hub: str | None = None
    hub_config: str | None = None
    hub_split: str | None = None
    hub_files: str | None = None
    url: str | None = None
    local: str | None = None

    @property
    def online(self) -> bool:
        return bool(self.hub or self.url)

    def hub_name(self) -> str:
        """The online source as a readable string, e.g. 'openai/gsm8k (config main, split test)'."""
        if self.url:
            return self.url
        where = self.hub_files or self.hub
        parts = [f"config {self.hub_config}"] if self.hub_config else []
        parts += [f"split {self.hub_split}"] if self.hub_split else []
        return f"{where} ({', '.join(parts)})" if parts else str(where)


def read_local(path: Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl, .jsonl.gz or .json (a list of objects) file."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        if path.name.endswith((".jsonl", ".jsonl.gz")):
            return [json.loads(line) for line in f if line.strip()]
        rows = json.load(f)
    if not isinstance(rows, list):
        raise DataSourceError(f"{path}: expected a JSON list of rows, got {type(rows).__name__}")
    return rows


def load_hub(path: str, name: str | None, split: str | None, data_files: str | None) -> list[dict[str, Any]]:
    """Rows of a hub dataset (or of `data_files` through a builder such as 'json') via datasets.load_dataset."""
    import datasets

    kwargs: dict[str, Any] = {"split": split or "train"}
    if data_files:
        kwargs["data_files"] = data_files
    return datasets.load_dataset(path, name, **kwargs).to_list()


def load_url(url: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Rows of a .jsonl or .json file downloaded from `url`."""
    from urllib.request import urlopen

    with urlopen(url, timeout=timeout) as f:
        text = f.read().decode("utf-8")
    if url.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def load_source(source: Source, data_dir: str | os.PathLike | None) -> list[dict[str, Any]]:
    """The rows of `source`: from `data_dir` when it is set, else online (hub or URL); DataSourceError otherwise."""
    if data_dir not in (None, ""):
        if source.local is None:
            hint = (f"it is loaded online from {source.hub_name()}: unset dataset.data_dir and {DATA_DIR_ENV} to "
                    "use it") if source.online else "no source is known"
            raise DataSourceError(f"{source.label}: no local copy exists under data_dir={data_dir}; {hint}")
        path = Path(data_dir).expanduser() / source.local
        if not path.is_file():
            raise DataSourceError(
                f"{source.label}: local file {path.resolve()} not found (dataset.data_dir={data_dir}); "
                f"point data_dir ({DATA_DIR_ENV}) at a folder holding {source.local}, or unset it to load "
                f"{source.hub_name() if source.online else 'the set'} online"
            )
        log.info("%s: reading %s", source.label, path)
        return read_local(path)
    if not source.online:
        raise DataSourceError(f"{source.label}: not available online; set dataset.data_dir or {DATA_DIR_ENV} "
                              f"to a folder holding {source.local}")
    log.info("%s: loading %s", source.label, source.hub_name())
    try:
        if source.url:
            return load_url(source.url)
        return load_hub(source.hub, source.hub_config, source.hub_split, source.hub_files)
    except Exception as err:  # datasets and urllib raise many types (connection, not found, offline mode)
        local = (f"or set dataset.data_dir / {DATA_DIR_ENV} to a folder holding {source.local}" if source.local
                 else "no local copy of this set exists")
        where = "" if source.url else " from the Hugging Face hub"
        raise DataSourceError(f"{source.label}: could not load {source.hub_name()}{where} "
                              f"({type(err).__name__}: {err}); check network access, {local}") from err


def build_dataset(cfg: dict) -> Evaluator:
    """The evaluator named cfg['name'], built with the dataset options it understands."""
    import evaluators  # noqa: F401  (import registers)

    skip = {"name", "limit", "shard", "system_prompt", "chat_template"}
    return DATASETS.get(cfg["name"])(**{k: v for k, v in cfg.items() if k not in skip})
