"""Files: the repository's folders and atomic writes (a reader never sees a half-written file)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository (its git history and conf/)
CONF_DIR = ROOT / "conf"

log = logging.getLogger(__name__)


def temporary_sibling(path: Path) -> Path:
    """A unique (random uuid) hidden name next to `path`: `.<name>.<uuid>.tmp`."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A fresh temporary path next to `path` to write; renamed onto `path` on success, removed on error.

    The name is unique (a random uuid), so two writers of one file never share a temporary file; the
    caller creates the file, so it gets the usual permissions (mkstemp's would be owner-only).
    """
    tmp = temporary_sibling(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> Path:
    """Write text to path via atomic_path, flushed and fsync'ed before the rename; returns path."""
    with atomic_path(Path(path)) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write obj as JSON (indented, sorted keys) to path via write_text_atomic."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


@contextmanager
def atomic_folder(path: Path, replace: bool = False) -> Iterator[Path]:
    """A fresh temporary folder next to `path` to fill; renamed onto `path` on success, removed on error.

    A folder already at `path` is replaced (`replace`), else kept: another process that wrote it
    first wins, and this one's copy is dropped.
    """
    tmp = temporary_sibling(path)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if replace:
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.rename(tmp, path)  # atomic: readers see a complete folder or none
        except OSError:
            if replace or not path.exists():
                raise
            log.info("%s was written meanwhile by another process; keeping it", path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
