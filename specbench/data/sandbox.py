"""Test model-generated Python outside the harness, with a verdict the generated code cannot reach.

`run_check(Check(code, entry_point, test, setup))` answers one question: does the function `entry_point` defined by
the untrusted `code` pass the trusted `test` (which defines `check(candidate)`)? Two fresh interpreters
(`python -I -B`, started through subprocess: the harness and its models are never forked) share the work:

- the candidate process runs `code` (prompt + completion) and then serves calls to the entry point: each request
  (arguments) arrives on one pipe, each answer goes back on another;
- the test process runs only trusted code: `setup` (the problem's prompt, which may define helpers the tests use,
  e.g. HumanEval's `poly`), then `test`, then `check(candidate)` where `candidate` is a proxy that sends its
  arguments to the candidate process and returns the answer.

Why two processes: a verdict computed in the process that runs the generated code can be forged by that code (it can
find the reporting function or its token through frames, gc or globals, override the builtins the tests use, return
objects that compare equal to anything, or exit with a success status before the tests run). Here the generated code
never shares a process with the test: what it can send is data, encoded by `encode_value` and rebuilt in the test
process by `decode_value`, a strict parser (never pickle, never eval); anything else is a protocol error. An
exception raised by the candidate comes back as its type name, which the test process turns into a new instance of
that built-in exception (one of `CANDIDATE_EXCEPTIONS`; any other name becomes `CandidateError`), so a test that
expects an exception behaves as before. The verdict is the test process's outcome, written to a pipe only the test
process holds, and taken by the harness only if the test process's exit status agrees (0 for a pass, 1 for a
failure). The candidate process's exit status, its output (sent to /dev/null) and anything it writes on its pipes
never count as a verdict.

What is stored (`Result.summary()`): "passed", "timed out", "failed: no verdict" (the test process died, e.g. out of
memory) or "failed: <name>", <name> the type name of the exception that ended the test process (`AssertionError`, a
built-in exception above, `CandidateError`, `CandidateGone`: the candidate process ended or closed its channel,
`BadResponse`: an answer that is not a well-formed encoded value, `UnsupportedValue`: a return value of a type the
channel does not carry). Never free text: the candidate's choice among these few dozen names is all it can put in a row.

How the candidate process is locked down (Linux namespaces, or the weaker process mode) and the resource limits of
both processes: specbench.data.isolation. Timing is a side channel this does not close (`sandbox_s` is stored): it
can only carry what the candidate can read, which in the namespace mode is the interpreter and the system libraries.
"""

from __future__ import annotations

import inspect
import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from specbench.data.isolation import GUARDS, IsolatedRun, Limits, apply_limits, resolve_isolation

MAX_MESSAGE = 16 * 1024 * 1024  # bytes of one encoded answer
CANDIDATE_EXCEPTIONS = (
    "ArithmeticError", "AssertionError", "AttributeError", "EOFError", "Exception", "FloatingPointError",
    "ImportError", "IndexError", "KeyError", "LookupError", "MemoryError", "ModuleNotFoundError",
    "NameError", "NotImplementedError", "OSError", "OverflowError", "RecursionError", "RuntimeError",
    "SyntaxError", "TimeoutError", "TypeError", "UnboundLocalError", "ValueError", "ZeroDivisionError",
)  # built-in exceptions the candidate's exceptions map to in the test process; not StopIteration (or
# StopAsyncIteration): raised from a call inside map() or an iterator it would end the iteration early, so a
# test such as `assert all(map(candidate, cases))` would pass on no cases
VERDICT = re.compile(r"passed|failed [A-Za-z_][A-Za-z0-9_]{0,63}")


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


_BOOT = r'''
cfg = json.loads(sys.stdin.read())
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
'''


@lru_cache(maxsize=1)
def _shared_source() -> str:
    """Code both processes run first: the codec and the limits (one definition, sent as source), then reading the
    configuration and sending all output to /dev/null. Read once per process (inspect reads the file on disk): a run
    keeps working if the installed source changes under it."""
    parts = [inspect.getsource(f) for f in (encode_value, decode_value, apply_limits)]
    return "import json, math, os, sys\nfrom typing import Any\n" + "\n".join(parts) + _BOOT


# The candidate process: limits, guards (specbench.data.isolation.GUARDS), the untrusted code, then one answer
# per request. Nothing here is trusted: the code can replace any of it, and all it can change is what it answers.
_CANDIDATE = r'''
apply_limits(cfg["limits"])
os.chdir(cfg["root"])
requests, answers = os.fdopen(cfg["requests"], "rb"), cfg["answers"]

def answer(message):
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(answers, data):]
''' + GUARDS + r'''
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


def run_check(check: Check, limits: Limits = Limits(), isolation: str = "auto", guards: bool = True) -> Result:
    """Run `check.test` against `check.code`'s entry point in two sandboxed processes (see the module docstring);
    guards=False leaves out reliability_guard and the audit hook (only for testing the OS layer)."""
    mode = resolve_isolation(isolation)
    run = IsolatedRun(mode, limits)
    ask_r, ask_w = os.pipe()  # requests: test -> candidate
    ans_r, ans_w = os.pipe()  # answers: candidate -> test
    verdict_r, verdict_w = os.pipe()  # test -> harness
    ends = [ask_r, ans_w, ask_w, ans_r, verdict_w]
    candidate_cfg = {"code": check.code, "entry_point": check.entry_point, "requests": ask_r, "answers": ans_w,
                     "guards": guards}
    test_cfg = {"setup": check.setup, "test": check.test, "entry_point": check.entry_point, "requests": ask_w,
                "answers": ans_r, "verdict": verdict_w, "exceptions": CANDIDATE_EXCEPTIONS, "max_message": MAX_MESSAGE}
    try:
        run.start_candidate(_shared_source() + _CANDIDATE, candidate_cfg, (ask_r, ans_w))
        run.start_test(_shared_source() + _TEST, test_cfg, (ask_w, ans_r, verdict_w))
        for fd in ends:
            os.close(fd)
        ends = []
        finished = run.wait()
    finally:
        for fd in ends:
            os.close(fd)
        seconds = run.stop()
        message = _read_verdict(verdict_r)
    if not finished:
        return Result("timed out", "", seconds, mode)
    status, _, reason = message.partition(" ")
    if not VERDICT.fullmatch(message) or run.procs[1].returncode != (0 if status == "passed" else 1):
        return Result("failed", "no verdict", seconds, mode)
    return Result(status, reason, seconds, mode)


def _read_verdict(fd: int) -> str:
    """What the test process (ended) wrote on the verdict pipe, without waiting for more; the pipe is closed."""
    os.set_blocking(fd, False)
    try:
        message = os.read(fd, 256).decode("ascii", "replace")
    except BlockingIOError:
        message = ""
    os.close(fd)
    return message
