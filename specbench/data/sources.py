"""Data sources of the benchmarks: where a set's rows come from, read into Rows that name their origin.

A set's rows come from the Hugging Face hub (asked once, as for models: load_hub) or, when a local data folder is set
(`dataset.data_dir`, default $SPECBENCH_DATA_DIR), from a file there (JSON Lines or JSON, either gzipped, or Parquet).
The choice is explicit: a set folder is never bypassed for the hub and a hub failure never falls back to another set;
a set that cannot be loaded fails with a `DataSourceError` naming the source it tried, a bad row naming its file and
line (or hub set and row) and the field (`Row`).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from specbench.common.errors import UserError
from specbench.common.hub import HubUnavailable, cache_names, cached_snapshot, download_command, hub_source
from specbench.common.options import shown

log = logging.getLogger(__name__)

DATA_DIR_ENV = "SPECBENCH_DATA_DIR"


class DataSourceError(UserError, RuntimeError):
    """A benchmark set could not be loaded from the source it was asked for."""


class NoLocalCopyError(DataSourceError):
    """A local data folder is set but the set (or the split asked for) has no local copy: it exists only online."""


class HubSetUnavailable(DataSourceError):
    """The hub (asked once) or HF_HUB_OFFLINE rules out a hub set and no local cache holds it."""


@dataclass(frozen=True)
class Source:
    """Where one split of a benchmark lives: online (a hub dataset `hub`, or a builder such as 'json' with `hub_files`;
    or a file at `url` for sets not on the hub) and/or as a file `local` under the local data folder."""

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


class MissingFieldError(DataSourceError, KeyError):
    """A row lacks a field its benchmark needs, or holds null there; the message names the row's origin."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Row(dict):
    """One data row and its `origin` (e.g. 'data/gsm8k/test.jsonl, line 7'): `row[key]` of a missing or null field
    raises MissingFieldError naming both (optional fields: `row.get`); `text` and `texts` also check the kind."""

    def __init__(self, fields: dict[str, Any], origin: str) -> None:
        super().__init__(fields)
        self.origin = origin

    def __missing__(self, key: str) -> Any:
        raise MissingFieldError(f"{self.origin}: the row has no {key!r} field, which this benchmark needs "
                                f"(its fields: {', '.join(map(repr, self)) or 'none'})")

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        if value is None:
            raise MissingFieldError(f"{self.origin}: the row's {key!r} field is null; this benchmark needs a value")
        return value

    def error(self, message: str) -> DataSourceError:
        """An error about this row, naming its origin."""
        return DataSourceError(f"{self.origin}: {message}")

    def text(self, key: str, optional: bool = False) -> str | None:
        """The string field `key` (None for a missing or null field when `optional`)."""
        value = self.get(key) if optional else self[key]
        if value is None or isinstance(value, str):
            return value
        raise self.error(f"field {key!r} must be a string, got {shown(value)}")

    def texts(self, key: str) -> list[str]:
        """The field `key` as a non-empty list of strings (e.g. a question's turns)."""
        value = self[key]
        if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
            raise self.error(f"field {key!r} must be a non-empty list of strings, got {shown(value)}")
        return value


def as_row(item: Any, origin: str) -> Row:
    """A parsed item as a Row; anything but a JSON object fails naming `origin`."""
    if not isinstance(item, dict):
        raise DataSourceError(f"{origin}: expected a JSON object (a row of named fields), got {type(item).__name__}")
    return item if isinstance(item, Row) else Row(item, origin)


def as_rows(items: list[Any], where: str) -> list[Row]:
    """Parsed items as Rows named '<where>, row n' unless one knows its origin (JSONL); none fails naming `where`."""
    if not items:
        raise DataSourceError(f"{where}: no rows (an empty list); a benchmark needs at least one")
    return [as_row(item, f"{where}, row {n}") for n, item in enumerate(items, 1)]


def decode_utf8(data: bytes, where: str, first_line: int = 1) -> str:
    """`data` as UTF-8 text (a leading byte-order mark dropped); a bad byte fails naming `where`, its line and column."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = first_line + data.count(b"\n", 0, err.start)
        col = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataSourceError(f"{where}, line {line}: byte 0x{data[err.start]:02x} at column {col} is not UTF-8 "
                              "text; data files must be UTF-8") from None


def parse_jsonl(data: bytes, where: str) -> list[Row]:
    """The rows of JSON Lines bytes, one object per non-blank line; a bad line fails naming its 1-based number."""
    rows = []
    for n, raw in enumerate(data.split(b"\n"), 1):
        line = decode_utf8(raw, where, n)
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataSourceError(f"{where}, line {n}: not valid JSON ({err.msg} at column {err.colno}); each "
                                  "line must be one JSON object") from None
        rows.append(as_row(item, f"{where}, line {n}"))
    return rows


def parse_rows(data: bytes, where: str, jsonl: bool) -> list[Row]:
    """The rows of a JSON Lines file or of a JSON list of objects (`where` names it in errors)."""
    if not data.strip():
        raise DataSourceError(f"{where}: the file is empty; a benchmark needs at least one row")
    if jsonl:
        return as_rows(parse_jsonl(data, where), where)
    try:
        items = json.loads(decode_utf8(data, where))
    except json.JSONDecodeError as err:
        raise DataSourceError(f"{where}, line {err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(items, list):
        raise DataSourceError(f"{where}: expected a JSON list of rows, got {type(items).__name__}")
    return as_rows(items, where)


def read_parquet(path: Path) -> list[Row]:
    """Rows of a Parquet file (through pyarrow; nulls stay None), the n-th named '<path>, row n'."""
    import pyarrow
    import pyarrow.parquet

    try:
        items = pyarrow.parquet.read_table(path).to_pylist()
    except (OSError, pyarrow.ArrowException) as err:
        raise DataSourceError(f"{path}: cannot be read as Parquet ({type(err).__name__}: {err})") from None
    return as_rows(items, str(path))


def read_local(path: Path) -> list[Row]:
    """Rows of a .jsonl or .json (a list of objects) file, either optionally gzip-compressed (.gz), or of a .parquet."""
    if path.name.endswith(".parquet"):
        return read_parquet(path)
    name = path.name.removesuffix(".gz")
    if not name.endswith((".jsonl", ".json")):
        raise DataSourceError(f"{path}: unknown data file type; expected .jsonl, .json, .jsonl.gz, .json.gz or "
                              ".parquet")
    try:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError; EOFError: truncated
        raise DataSourceError(f"{path}: cannot be read ({type(err).__name__}: {err})") from None
    return parse_rows(data, str(path), name.endswith(".jsonl"))


def hub_repo(path: str, data_files: str | None) -> tuple[str, str | None] | None:
    """(hub dataset id, file in it or None) that load_hub reads: `path`, or the repository of `data_files` of the form
    hf://datasets/<owner>/<name>/<file>; None for a local folder, other files or a name that is no hub id."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if data_files:
        parts = data_files.removeprefix("hf://datasets/").split("/")
        if not data_files.startswith("hf://datasets/") or len(parts) < 3:
            return None
        repo: tuple[str, str | None] = ("/".join(parts[:2]), "/".join(parts[2:]))
    elif path.count("/") == 1 and not Path(path).exists():
        repo = (path, None)
    else:
        return None
    try:
        validate_repo_id(repo[0])
    except HFValidationError:  # a revision (name@rev) or an odd name: left to datasets
        return None
    return repo


def in_datasets_cache(repo_id: str) -> bool:
    """Has an earlier load left the hub set `repo_id` in the datasets cache (where datasets looks offline)?"""
    from datasets import config
    from datasets.naming import camelcase_to_snakecase

    owner, name = repo_id.split("/")
    root = Path(config.HF_DATASETS_CACHE) / f"{owner}___{camelcase_to_snakecase(name)}"
    return any(p.is_dir() for p in root.glob("*/*/*"))  # <config>/<version>/<hash>, as datasets' cache lookup


@contextlib.contextmanager
def offline_mode() -> Iterator[None]:
    """datasets and huggingface_hub in offline mode for the block (local caches, no request), set through their public
    config constants and restored after: load_dataset has no per-call offline switch, and HF_HUB_OFFLINE /
    HF_DATASETS_OFFLINE in the environment are read once, on import."""
    import datasets.config
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def load_cached(path: str, name: str | None, kwargs: dict[str, Any], repo_id: str, file: str | None) -> Any:
    """The set from the local caches alone, without a request: `file` of the hub snapshot through the builder
    `path`; else the datasets cache of an earlier load, then the snapshot folder (`hf download`)."""
    import datasets

    snapshot, tried = cached_snapshot(repo_id, "dataset"), []
    with offline_mode():
        if file is not None:
            if snapshot is None or not (snapshot / file).is_file():
                raise HubUnavailable(f"{file} of {repo_id} is not in {cache_names('dataset')}")
            return datasets.load_dataset(path, name, **{**kwargs, "data_files": str(snapshot / file)})
        for where, source in (("the datasets cache", path if in_datasets_cache(repo_id) else None),
                              (f"the snapshot {snapshot}", snapshot and str(snapshot))):
            if source is not None:
                try:
                    return datasets.load_dataset(source, name, **kwargs)
                except Exception as err:  # noqa: BLE001 - e.g. another config or split cached: try the next
                    tried.append(f"{where}: {type(err).__name__}: {err}")
    raise HubUnavailable(f"{repo_id} (config {name}, split {kwargs['split']}) could not be read from "
                         f"{cache_names('dataset')}: " + ("; ".join(tried) or "not there"))


def load_hub(path: str, name: str | None, split: str | None, data_files: str | None) -> list[dict[str, Any]]:
    """Rows of a hub dataset (or of `data_files` through a builder such as 'json') via datasets.load_dataset, after
    hub_source asked the hub once (as for models); read from the local caches when the hub cannot be reached or
    HF_HUB_OFFLINE is set. HubSetUnavailable, with the download command, when neither can supply it."""
    import datasets

    kwargs: dict[str, Any] = {"split": split or "train"}
    if data_files:
        kwargs["data_files"] = data_files
    repo = hub_repo(path, data_files)
    if repo is None:
        return datasets.load_dataset(path, name, **kwargs).to_list()
    repo_id, file = repo
    snapshot = cached_snapshot(repo_id, "dataset")
    cached = (snapshot is not None and (snapshot / file).is_file()) if file else (
        snapshot is not None or in_datasets_cache(repo_id))
    try:
        if hub_source(repo_id, None, "dataset", cached) == "hub":
            return datasets.load_dataset(path, name, **kwargs).to_list()
        log.info("%s: reading the local caches (no request)", repo_id)
        return load_cached(path, name, kwargs, repo_id, file).to_list()
    except HubUnavailable as err:
        command = download_command(repo_id, None, "dataset") + (f" {file}" if file else "")
        raise HubSetUnavailable(f"{err}\nDownload it where the hub is reachable (later runs read the local cache):"
                                f"\n  {command}") from None


def load_url(url: str, timeout: float = 60.0) -> list[Row]:
    """Rows of a .jsonl or .json file downloaded from `url` (errors name the URL and line)."""
    from urllib.request import urlopen

    with urlopen(url, timeout=timeout) as f:
        data = f.read()
    return parse_rows(data, url, url.endswith(".jsonl"))


def load_source(source: Source, data_dir: str | os.PathLike | None) -> list[Row]:
    """The rows of `source`: from `data_dir` when set, else online (hub or URL); else (or rowless) DataSourceError."""
    if data_dir not in (None, ""):
        if source.local is None:
            hint = (f"it is loaded online from {source.hub_name()}: unset dataset.data_dir and {DATA_DIR_ENV} to "
                    "use it") if source.online else "no source is known"
            raise NoLocalCopyError(f"{source.label}: no local copy exists under data_dir={data_dir}; {hint}")
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
        rows = load_url(source.url) if source.url else load_hub(source.hub or "", source.hub_config,  # online: a hub
                                                                source.hub_split, source.hub_files)
    except HubSetUnavailable as err:  # the hub asked once (or HF_HUB_OFFLINE) and no local cache holds the set
        local = (f"Or set dataset.data_dir / ${DATA_DIR_ENV} to a folder holding {source.local}" if source.local
                 else "This set has no local copy for dataset.data_dir")
        raise HubSetUnavailable(f"{source.label}: could not load {source.hub_name()} from the Hugging Face hub: "
                                f"{err}\n{local}") from err
    except DataSourceError:  # the download worked but its content is not rows: already names the URL and line
        raise
    except Exception as err:  # datasets and urllib raise many types (connection, not found, offline mode)
        local = (f"or set dataset.data_dir / {DATA_DIR_ENV} to a folder holding {source.local}" if source.local
                 else "no local copy of this set exists")
        where = "" if source.url else " from the Hugging Face hub"
        raise DataSourceError(f"{source.label}: could not load {source.hub_name()}{where} "
                              f"({type(err).__name__}: {err}); check network access, {local}") from err
    return as_rows(rows, f"{source.label} ({source.hub_name()})")
