"""The code sandbox: verdicts from a separate trusted process, a strict value channel, limits, and isolation."""

import json
import math
import os
import socket
import tempfile
import threading
from pathlib import Path

import psutil
import pytest

import specbench.data.isolation as isolation_module
from helpers import SYNTHETIC
from specbench.data.isolation import Limits, namespace_problem, resolve_isolation
from specbench.data.sandbox import Check, decode_value, encode_value, run_check

NAMESPACES = pytest.mark.skipif(bool(namespace_problem()), reason="Linux namespaces (unshare/setpriv) not available")
MODES = ["process", pytest.param("namespace", marks=NAMESPACES)]
LIMITS = Limits(timeout_s=30.0, memory_mb=512)  # generous: a busy machine must not time a check out


def probe(body: str, test: str, limits: Limits = LIMITS, mode: str = "namespace", guards: bool = True):
    """Run `def probe():` + body in the candidate; the trusted `test` (a check body) judges what it returns."""
    code = "def probe():\n" + "\n".join("    " + line for line in body.splitlines()) + "\n"
    check = "def check(candidate):\n" + "\n".join("    " + line for line in test.splitlines()) + "\n"
    return run_check(Check(code, "probe", check), limits, mode, guards)


# ---------------------------------------------------------------- the value channel

VALUES = [None, True, False, 0, -7, 2**70, 1.5, -0.0, 1e300, math.inf, -math.inf, "", "héllo\n\"", b"\x00\xff",
          1 + 2j, [], [1, [2, [3]]], (), (1, "a", (2.5,)), {1, "x"}, frozenset({(1, 2)}), {}, {"a": 1, 2: [3], (1, 2): None},
          [{"k": (1, {2})}]]


# ids by position: a set's repr depends on the process's string hash seed, and every xdist worker must collect the
# same ids
@pytest.mark.parametrize("value", VALUES, ids=[f"{i}-{type(v).__name__}" for i, v in enumerate(VALUES)])
def test_values_round_trip_with_their_exact_types(value):
    back = decode_value(json.loads(json.dumps(encode_value(value))))
    assert back == value and type(back) is type(value)
    assert repr(back) == repr(value)  # nested types too (tuple vs list, int vs float, -0.0)


def test_nan_and_subclasses_arrive_as_plain_values():
    assert math.isnan(decode_value(json.loads(json.dumps(encode_value(math.nan)))))

    class Rigged(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    class Text(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    back = decode_value(json.loads(json.dumps(encode_value([Rigged(3), Text("x"), (Rigged(4),)]))))
    assert back == [3, "x", (4,)] and [type(v) for v in back] == [int, str, tuple] and type(back[2][0]) is int
    assert back != [5, "y", (4,)]


@pytest.mark.parametrize("data", [
    {"object": []}, {"tuple": [], "set": []}, {"float": "1.5"}, {"float": "nan "}, {"bytes": 5}, {"bytes": "zz"},
    {"complex": [1]}, {"complex": ["a", 1]}, {"dict": [[1]]}, {"dict": [[[1], 2]]}, {"set": [[1]]}, {"tuple": 5},
    {"__class__": "os.system"}, {"pickle": "gASV"},
], ids=repr)
def test_the_decoder_accepts_nothing_else(data):
    with pytest.raises(ValueError):
        decode_value(data)


def test_objects_the_channel_does_not_carry_are_refused_when_sent():
    class Always:
        def __eq__(self, other):
            return True

    for value in (Always(), object(), iter([1]), print, [Always()]):
        with pytest.raises(TypeError):
            encode_value(value)


# ---------------------------------------------------------------- verdicts

@pytest.mark.parametrize("mode", MODES)
def test_verdicts_are_the_test_process_outcome(mode):
    test = "assert candidate(2) == 4\nassert candidate(x=3) == 9"
    check = lambda code: run_check(Check(code, "f", "def check(candidate):\n" + "\n".join(  # noqa: E731
        "    " + line for line in test.splitlines())), LIMITS, mode)
    r = check("def f(x):\n    return x * x\n")
    assert (r.status, r.summary(), r.isolation) == ("passed", "passed", mode)
    assert check("def f(x):\n    return x + 2\n").summary() == "failed: AssertionError"
    assert check("def f(x):\n    raise ValueError('secret text')\n").summary() == "failed: ValueError"
    assert check("class Mine(Exception):\n    pass\ndef f(x):\n    raise Mine()\n").summary() == "failed: CandidateError"
    assert check("def f(x:\n").summary() == "failed: SyntaxError"
    assert check("def g(x):\n    return x * x\n").summary() == "failed: NameError"
    assert check("f = 3\n").summary() == "failed: TypeError"
    assert check("import os\nos._exit(0)\n").summary() == "failed: CandidateGone"
    assert check("def f(x):\n    return object()\n").summary() == "failed: UnsupportedValue"
    assert check("print('passed')\ndef f(x):\n    print('passed')\n    return 0\n").summary() == "failed: AssertionError"
    loop = Check("def f(x):\n    while True:\n        pass\n", "f", "def check(candidate):\n    candidate(1)\n")
    r = run_check(loop, Limits(timeout_s=1.0), mode)
    assert r.summary() == "timed out" and r.seconds >= 1.0  # the loop never ends: only the timeout stops it


def test_a_test_that_expects_an_exception_still_gets_it():
    test = ("def check(candidate):\n    try:\n        candidate(-1)\n    except ValueError:\n        pass\n"
            "    else:\n        raise AssertionError('no ValueError')\n    assert candidate(2) == 2\n")
    code = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    assert run_check(Check(code, "f", test), LIMITS, "process").passed
    assert not run_check(Check(code.replace("ValueError", "KeyError"), "f", test), LIMITS, "process").passed


@pytest.mark.parametrize("stop", ["StopIteration", "StopAsyncIteration", "GeneratorExit"])
def test_a_candidate_cannot_end_the_tests_iteration_early(stop):
    """StopIteration from a call inside map() would end it: `all(map(candidate, cases))` passing on no cases."""
    test = "def check(candidate):\n    assert all(map(candidate, [1, 2, 3]))\n    assert list(map(candidate, [4])) == [True]\n"
    cheat = f"def f(x):\n    raise {stop}\n"
    assert run_check(Check(cheat, "f", test), LIMITS, "process").summary() == "failed: CandidateError"
    assert run_check(Check("def f(x):\n    return x > 0\n", "f", test), LIMITS, "process").passed


def test_the_setup_defines_helpers_for_the_test_only():
    """The problem's prompt runs on the trusted side too: a helper the tests use cannot be replaced by the candidate."""
    setup = "def helper(x):\n    return x + 1\n\ndef f(x):\n    '''stub'''\n"
    test = "def check(candidate):\n    assert helper(candidate(1)) == 3\n"
    assert run_check(Check(setup + "def f(x):\n    return 2 * x\n", "f", test, setup), LIMITS, "process").passed
    hijack = setup + "def helper(x):\n    return 3\ndef f(x):\n    return 0\n"
    assert run_check(Check(hijack, "f", test, setup), LIMITS, "process").summary() == "failed: AssertionError"


# ---------------------------------------------------------------- limits

@pytest.mark.parametrize("mode", MODES)
def test_memory_file_and_cpu_limits(mode):
    lim = Limits(timeout_s=30, memory_mb=256, file_mb=4)
    assert probe("x = bytearray(64 * 1024 ** 2)\nreturn len(x)", "assert candidate() == 64 * 1024 ** 2", lim, mode).passed
    assert probe("try:\n    bytearray(512 * 1024 ** 2)\nexcept MemoryError:\n    return 'MemoryError'",
                 "assert candidate() == 'MemoryError'", lim, mode).passed
    assert probe("return open('small', 'wb').write(b'x' * 1024 ** 2)", "assert candidate() == 1024 ** 2", lim, mode).passed
    assert probe("try:\n    open('big', 'wb').write(b'x' * 8 * 1024 ** 2)\nexcept OSError as e:\n    return e.errno",
                 "import errno\nassert candidate() == errno.EFBIG", lim, mode).passed
    # the CPU limit, not the wall clock (which would read "timed out"), ends the loop
    r = probe("while True:\n    pass", "candidate()", Limits(timeout_s=120, cpu_s=1), mode)
    assert r.summary() == "failed: CandidateGone"


@NAMESPACES
def test_processes_and_the_programs_memory_are_bounded():
    """RLIMIT_NPROC under the run's own uid: `processes` tasks in all, so memory <= processes x memory_mb."""
    lim = Limits(timeout_s=60, memory_mb=256, processes=4)
    # each child takes 200 MB (or fails to), says which on `done`, and stays alive (blocked on `hold`)
    body = """import os
hold, _ = os.pipe()
done, said = os.pipe()
children = 0
for _ in range(30):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            x = bytearray(200 * 1024 ** 2)
            os.write(said, b'1')
        except MemoryError:
            os.write(said, b'0')
        os.read(hold, 1)
        os._exit(0)
    children += 1
got = b''
while len(got) < children:
    got += os.read(done, children)
try:
    bytearray(300 * 1024 ** 2)
    alone = 'allocated'
except MemoryError:
    alone = 'MemoryError'
return [children, got.count(b'1'), alone]"""
    assert probe(body, "assert candidate() == [3, 3, 'MemoryError']", lim, guards=False).passed


@NAMESPACES
def test_no_process_outlives_its_run():
    escape = ("import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(41.5)'])\n"
              "    os._exit(0)\nreturn 1")
    assert probe(escape, "assert candidate() == 1", guards=False).passed
    assert not [p for p in psutil.process_iter() if "time.sleep(41.5)" in " ".join(_cmdline(p))]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.mark.parametrize("mode", MODES)
def test_each_run_gets_a_fresh_folder_that_is_removed(mode, tmp_path, monkeypatch):
    """Run folders go to a private temporary root here, so other processes' sandboxes cannot disturb the check."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = set(tmp_path.glob("specbench-sandbox-*"))
    body = ("here = os.listdir('.')\nopen('mine.txt', 'w').write('x')\n"
            "return [here, os.path.samefile('.', os.environ['HOME']), os.environ['HOME'] == os.environ['TMPDIR']]")
    for _ in range(2):
        assert probe("import os\n" + body, "assert candidate() == [[], True, True]", LIMITS, mode).passed
    assert before == set() and set(tmp_path.glob("specbench-sandbox-*")) == set()


# ---------------------------------------------------------------- isolation of the namespace mode

@pytest.fixture
def harness_sockets(tmp_path):
    """A Unix socket in the file system, an abstract one and a TCP one, held by the harness; records connections."""
    servers = []
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "harness.sock"))
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0specbench-test-{os.getpid()}")
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    for s in (unix, abstract, tcp):
        s.listen()
        s.settimeout(0.1)
        servers.append(s)
    hits, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            for s in servers:
                try:
                    hits.append(s.accept())
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield {"unix": str(tmp_path / "harness.sock"), "abstract": f"\0specbench-test-{os.getpid()}",
           "tcp": tcp.getsockname()}, hits
    stop.set()
    t.join()
    for s in servers:
        s.close()


@NAMESPACES
def test_the_candidate_sees_only_the_interpreter(tmp_path, harness_sockets):
    """Without reliability_guard and the audit hook: what the OS alone refuses."""
    addresses, hits = harness_sockets
    (tmp_path / "keep.txt").write_text("keep me")
    binds, links, _ = isolation_module.read_only_paths()
    view = {"/dev", "/proc", "/.old", "/sandbox", *links, *(f"/dev/{d}" for d in isolation_module.DEVICES)}
    for path in binds:  # each bound path and the folders leading to it, nothing else
        view |= {str(p) for p in Path(path).parents if str(p) != "/"} | {path}
    body = f"""import os, socket
def walk(folder):
    found = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        found.append(path)
        if os.path.isdir(path) and not os.path.islink(path) and path not in {binds!r}:
            found += walk(path)
    return found
out = {{'view': sorted(walk('/')), 'uid': os.getuid(), 'groups': os.getgroups()}}
for name, (family, address) in {{'unix': (socket.AF_UNIX, {addresses['unix']!r}),
        'abstract': (socket.AF_UNIX, {addresses['abstract']!r}), 'tcp': (socket.AF_INET, {tuple(addresses['tcp'])!r})}}.items():
    s = socket.socket(family)
    try:
        s.connect(address)
        out[name] = 'connected'
    except OSError as e:
        out[name] = 'refused'
for path in ('/x', '/sandbox/../y', {binds[0]!r}):
    try:
        open(path, 'w')
        out[path] = 'written'
    except OSError as e:
        out[path] = e.errno
return out"""
    test = f"""import errno
out = candidate()
assert out['view'] == {sorted(view)!r}, out['view']
assert out['uid'] not in (0, os.getuid()) and out['groups'] == []
assert out['unix'] == out['abstract'] == out['tcp'] == 'refused'
assert set(v for k, v in out.items() if k.startswith('/')) == {{errno.EROFS}}"""
    r = probe(body, "import os\n" + test, guards=False)
    assert r.passed, r
    assert not hits and (tmp_path / "keep.txt").read_text() == "keep me"


# ---------------------------------------------------------------- choosing the isolation

def test_bad_isolation_value():
    with pytest.raises(ValueError, match="auto, namespace, process"):
        resolve_isolation("docker")


def test_without_namespaces_only_an_explicit_process_mode_runs(monkeypatch):
    monkeypatch.setattr(isolation_module, "namespace_problem", lambda: "unshare: unshare failed: Operation not permitted")
    for isolation in ("auto", "namespace"):
        with pytest.raises(RuntimeError, match=r"dataset\.isolation=.*\(unshare: unshare failed: Operation not "
                                               r"permitted\).*auto, namespace, process.*dataset\.isolation=process"):
            resolve_isolation(isolation, key="dataset.isolation")
        with pytest.raises(RuntimeError, match="isolation=process"):
            run_check(Check("def f():\n    return 1\n", "f", "def check(c):\n    assert c() == 1\n"), LIMITS, isolation)
    r = run_check(Check("def f():\n    return 1\n", "f", "def check(c):\n    assert c() == 1\n"), LIMITS, "process")
    assert r.passed and r.isolation == "process"


def test_humaneval_refuses_weak_isolation_unless_asked_and_records_it(monkeypatch):
    from specbench.data.dataset import build_dataset

    monkeypatch.setattr(isolation_module, "namespace_problem", lambda: "no unshare")
    with pytest.raises(RuntimeError, match=r"dataset\.isolation=auto .*\(no unshare\)\. Valid values: auto, namespace, process"):
        build_dataset({"name": "humaneval", "data_dir": str(SYNTHETIC)})
    ev = build_dataset({"name": "humaneval", "data_dir": str(SYNTHETIC), "isolation": "process"})
    ex = ev.examples()[2]
    s = ev.score(ex, ex.meta["canonical_solution"])
    assert s["passed"] and s["sandbox"] == "process"


def test_harness_process_is_never_the_one_running_code():
    assert probe("import os\nreturn os.getpid()", f"assert candidate() != {os.getpid()}", LIMITS, "process").passed
