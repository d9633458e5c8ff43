"""Files: the repository's folders and atomic writes (a reader never sees a half-written file)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository (its git history and conf/)
CONF_DIR = ROOT / "conf"


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A fresh temporary path next to `path` to write; renamed onto `path` on success, removed on error.

    The name is unique (a random uuid), so two writers of one file never share a temporary file; the
    caller creates the file, so it gets the usual permissions (mkstemp's would be owner-only).
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write obj as JSON to path via a uniquely named temporary file and os.replace."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
