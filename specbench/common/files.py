"""Files: the repository's folders and atomic writes (a reader never sees a half-written file)."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specbench.common.errors import UserError

ROOT = Path(__file__).resolve().parents[2]  # the repository (its git history and conf/)
CONF_DIR = ROOT / "conf"

log = logging.getLogger(__name__)


TEMPORARY = re.compile(r"\..+\.[0-9a-f]{32}\.tmp")  # temporary_sibling's names: `.<name>.<uuid hex>.tmp`
FULL = {errno.ENOSPC, errno.EDQUOT}  # errors of a full disk or quota
READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}  # errors of a folder this process may not write


def temporary_sibling(path: Path) -> Path:
    """A unique (random uuid) hidden name next to `path`: `.<name>.<uuid>.tmp`."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def remove_temporaries(folder: Path, below: tuple[str, ...] = ()) -> list[Path]:
    """Remove what killed writers left in `folder` and its sub-folders `below` under temporary_sibling's names."""
    removed = []
    for where in (Path(folder), *(Path(folder) / name for name in below)):
        for path in sorted(where.glob(".*.tmp")) if where.is_dir() else []:
            if not TEMPORARY.fullmatch(path.name):
                continue
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
                removed.append(path)
            except OSError as err:  # debris that stays costs room only: never a reason to stop a run
                log.warning("%s: cannot remove this temporary file an interrupted writer left: %s", path, err)
    if removed:
        log.warning("%s: removed %d temporary files an interrupted writer left: %s", folder, len(removed),
                    ", ".join(str(p.relative_to(folder)) for p in removed))
    return removed


class FolderNotWritable(UserError, OSError):
    """A folder is full, read-only or not this user's to write; the message names it and what to do."""

    def __str__(self) -> str:  # the message, not OSError's '[Errno n] strerror: filename'
        return str(self.args[0])


def not_writable(folder: Path, err: OSError) -> FolderNotWritable:
    """The error for `err` (a full disk, a folder this user may not write) while writing in `folder`."""
    name = f" {err.filename}" if err.filename and Path(err.filename) != Path(folder) else ""
    what = f"{folder}: cannot write{name} ({err.strerror or err})"
    if err.errno in FULL:
        hint = ("the disk (or quota) is full; free space, or write to another disk (a run: paths.results=...), "
                "and rerun the same command (a run resumes: the whole rows it wrote are kept)")
    elif err.errno == errno.ENOTDIR:
        hint = "a folder cannot be made inside a file; write elsewhere (a run: paths.results=...)"
    else:
        hint = "make the folder writable, or write to one this user may write (a run: paths.results=...)"
    out = FolderNotWritable(f"{what}: {hint}")
    out.errno, out.strerror, out.filename = err.errno, err.strerror, err.filename
    return out


def check_writable(folder: Path) -> None:
    """Raise FolderNotWritable unless `folder` (or its nearest existing parent) may be written and its disk has room."""
    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise not_writable(existing, OSError(errno.ENOTDIR, f"{existing} is a file, not a folder", str(folder)))
    if not os.access(existing, os.W_OK | os.X_OK):
        code = errno.EROFS if os.statvfs(existing).f_flag & os.ST_RDONLY else errno.EACCES
        raise not_writable(existing, OSError(code, os.strerror(code), str(folder)))
    disk = os.statvfs(existing)  # a file system that counts no blocks (or inodes) reports 0 of them: unknown
    no_room = disk.f_blocks and (disk.f_bfree if os.geteuid() == 0 else disk.f_bavail) == 0
    if no_room or (disk.f_files and not disk.f_favail):
        raise not_writable(existing, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder)))


@contextmanager
def writing(folder: Path) -> Iterator[None]:
    """Turn a full disk's or an unwritable folder's OSError in the block into FolderNotWritable naming `folder`."""
    try:
        yield
    except FolderNotWritable:
        raise
    except OSError as err:
        if err.errno not in FULL | READ_ONLY:
            raise
        raise not_writable(Path(folder), err) from err


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A fresh temporary path next to `path` to write; renamed onto `path` on success, removed on error. The name is
    unique (a random uuid), so two writers of one file never share a temporary file; the caller creates the file, so
    it gets the usual permissions (mkstemp's would be owner-only)."""
    tmp = temporary_sibling(path)
    try:
        with writing(path.parent):
            yield tmp
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> Path:
    """Write text to path via atomic_path, flushed and fsync'ed before the rename; returns path."""
    with atomic_path(Path(path)) as tmp:
        append_durably(tmp, text)  # a fresh file
    return Path(path)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write obj as JSON (indented, sorted keys) to path via write_text_atomic."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


@contextmanager
def atomic_folder(path: Path, replace: bool = False) -> Iterator[Path]:
    """A fresh temporary folder next to `path` to fill; renamed onto `path` on success, removed on error. A folder
    already at `path` is replaced (`replace`), else kept: another process that wrote it first wins."""
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


def cut_to_last_line(path: Path, end: int | None = None) -> int:
    """Cut `path` after its last complete line that ends before byte `end` (default: its size): what a crash
    left mid-append goes; returns the number of bytes cut (0 for a missing file)."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = data.rfind(b"\n", 0, len(data) if end is None else end) + 1
    if keep != len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
    return len(data) - keep


def append_durably(path: Path, text: str) -> None:
    """Append `text` (whole lines) to `path` in one write, flushed and fsync'ed to disk."""
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
