"""The code sandbox: hostile completions fail within their limits and leave the harness and the files alone."""

import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT
from specbench.sandbox import Limits, namespaces_available, resolve_isolation, run_python

DATA = ROOT.parent / "shared" / "data"
MODES = ["process", pytest.param("namespace", marks=pytest.mark.skipif(
    not namespaces_available(), reason="Linux namespaces (unshare/setpriv) not available here"))]
LIMITS = Limits(timeout_s=4.0, memory_mb=512)


@pytest.fixture
def outside(tmp_path):
    """Files outside the sandbox that hostile code goes after, with their content to check afterwards."""
    (tmp_path / "keep.txt").write_text("keep me")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "inner.txt").write_text("me too")
    return tmp_path


@pytest.fixture
def listener():
    """A TCP server on localhost in the harness process; records whether anything connected."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    hits = []

    def serve():
        while not stop.is_set():
            try:
                hits.append(srv.accept())
            except (socket.timeout, OSError):
                pass

    stop = threading.Event()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join()
    srv.close()


def hostile(outside: Path, port: int) -> dict[str, str]:
    """Completions (function bodies of a HumanEval-style check) that try to escape or cheat."""
    keep, d = outside / "keep.txt", outside / "dir"
    return {
        "infinite loop": "while True:\n    pass",
        "fork bomb (guarded: 2**5 processes at most)": "import os\nfor _ in range(5):\n    os.fork()",
        "fork bomb via posix": "import posix\nfor _ in range(5):\n    posix.fork()",
        "10 GB allocation": "x = bytearray(10 * 1024 ** 3)",
        "write outside its folder": f"open({str(outside / 'pwned.txt')!r}, 'w').write('x')",
        "write outside by a relative path": f"open('../../..{outside}/pwned.txt', 'w').write('x')",
        "overwrite a file": f"open({str(keep)!r}, 'w').write('gone')",
        "delete a file": f"import os\nos.remove({str(keep)!r})",
        "delete a file via posix": f"import posix\nposix.unlink({str(keep)!r})",
        "delete a folder": f"import shutil\nshutil.rmtree({str(d)!r})",
        "rename a file": f"import os\nos.rename({str(keep)!r}, 'stolen.txt')",
        "open a socket": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).send(b'hi')",
        "subprocess": f"import subprocess\nsubprocess.run(['rm', {str(keep)!r}])",
        "os.system": f"import os\nassert os.system('rm {keep}') == 0",
        "kill the harness": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "os._exit(0) before the tests fail": "import os\nos._exit(0)",
        "ctypes": "import ctypes\nctypes.CDLL(None).exit(0)",
        "output flood": "while True:\n    print('x' * 100000)",
    }


def check_program(body: str) -> str:
    """A HumanEval-style program whose test fails unless the body cheats its way out."""
    return (f"def f():\n{_indent(body)}\n    return 1\n\n\n"
            "def check(candidate):\n    assert candidate() == 2\n\ncheck(f)\n")


def _indent(body: str) -> str:
    return "\n".join("    " + line for line in body.splitlines())


def snapshot(outside: Path) -> dict[str, str]:
    return {str(p.relative_to(outside)): p.read_text() for p in sorted(outside.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("mode", MODES)
def test_hostile_completions_fail_within_their_limits_and_touch_nothing(mode, outside, listener):
    port, hits = listener
    before, readme = snapshot(outside), (ROOT / "README.md").stat()
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    why = {"infinite loop": "timed out", "10 GB allocation": "MemoryError", "open a socket": "PermissionError",
           "os._exit(0) before the tests fail": "no verdict", "fork bomb via posix": "PermissionError"}
    for name, body in hostile(outside, port).items():
        res = run_python(check_program(body), LIMITS, mode)
        assert res.status in ("failed", "timed out"), (name, res)
        assert why.get(name, "") in res.summary(), (name, res)
        assert res.seconds < LIMITS.timeout_s + 3, (name, res.seconds)
        assert len(res.output) <= LIMITS.output_bytes
    assert snapshot(outside) == before
    assert (ROOT / "README.md").stat().st_mtime == readme.st_mtime
    assert not hits  # nothing reached the harness's server
    time.sleep(0.2)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children  # no process left behind


@pytest.mark.parametrize("mode", MODES)
def test_verdicts(mode):
    assert run_python("assert sum([1, 2]) == 3", LIMITS, mode).passed
    r = run_python("assert 1 == 2, 'nope'", LIMITS, mode)
    assert (r.status, r.detail) == ("failed", "AssertionError: nope")
    assert run_python("import sys\nsys.exit(0)", LIMITS, mode).detail == "SystemExit: 0"
    r = run_python("import os\nos._exit(0)", LIMITS, mode)
    assert r.status == "failed" and "no verdict" in r.detail
    r = run_python("print('passed')\nraise ValueError('x')", LIMITS, mode)  # printed text is not a verdict
    assert r.status == "failed" and r.output == "passed\n"
    r = run_python("while True: pass", Limits(timeout_s=1.0), mode)
    assert r.status == "timed out" and r.summary() == "timed out" and 1.0 <= r.seconds < 3


@pytest.mark.parametrize("mode", MODES)
def test_limits(mode):
    lim = Limits(timeout_s=10, memory_mb=256, file_mb=4)
    assert run_python("x = bytearray(64 * 1024 ** 2)", lim, mode).passed
    assert run_python("x = bytearray(512 * 1024 ** 2)", lim, mode).detail.startswith("MemoryError")
    assert run_python("open('small', 'wb').write(b'x' * 1024 ** 2)", lim, mode).passed  # its own folder
    assert "File too large" in run_python("open('big', 'wb').write(b'x' * 8 * 1024 ** 2)", lim, mode).detail
    r = run_python("while True: pass", Limits(timeout_s=10, cpu_s=1), mode)  # CPU limit before the wall clock
    assert r.status == "failed" and r.seconds < 8
    assert mode == "namespace" or "SIGXCPU" in r.detail  # (unshare reports its child's signal as exit code 1)


@pytest.mark.parametrize("mode", MODES)
def test_each_run_gets_a_fresh_folder_that_is_removed(mode):
    before = set(Path(tempfile.gettempdir()).glob("specbench-sandbox-*"))
    code = ("import os\nassert os.listdir('.') == [] and os.path.samefile('.', os.environ['HOME'])\n"
            "assert os.environ['HOME'] == os.environ['TMPDIR']\nopen('mine.txt', 'w').write('x')")
    assert run_python(code, LIMITS, mode).passed and run_python(code, LIMITS, mode).passed
    assert set(Path(tempfile.gettempdir()).glob("specbench-sandbox-*")) <= before


@pytest.mark.skipif(not namespaces_available(), reason="Linux namespaces not available")
def test_namespaces_alone_contain_code_that_defeats_the_in_process_guards(outside, listener):
    """Without reliability_guard and the audit hook: read-only mounts, no network, no process escapes."""
    port, hits = listener
    before = snapshot(outside)
    cases = {
        "write": (f"open({str(outside / 'keep.txt')!r}, 'w')", "Read-only file system"),
        "delete": (f"import os\nos.remove({str(outside / 'keep.txt')!r})", "Read-only file system"),
        "socket": (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)", "unreachable"),
        "devices": ("open('/dev/vda', 'rb')", "No such file"),
        "capabilities": ("caps = open('/proc/self/status').read().split('CapEff:')[1].split()[0]\n"
                         "assert int(caps, 16) == 0, caps\nraise RuntimeError('no capabilities')", "no capabilities"),
    }
    for name, (code, detail) in cases.items():
        r = run_python(code, LIMITS, "namespace", guards=False)
        assert r.status == "failed" and detail in r.detail, (name, r)
    escape = ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              "        os.execvp('sleep', ['sleep', '37.123'])\n    os._exit(0)\n")
    assert run_python(escape, LIMITS, "namespace", guards=False).passed
    time.sleep(0.3)
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "37.123"]]
    assert snapshot(outside) == before and not hits


@pytest.mark.skipif(not DATA.is_dir(), reason="local HumanEval copy not found")
def test_humaneval_scores_hostile_completions_zero(outside):
    from specbench.data import build_dataset

    ev = build_dataset({"name": "humaneval", "data_dir": str(DATA), "timeout_s": 3})
    ex = ev.examples()[0]
    for body in ("    import os\n    os._exit(0)\n", "    while True:\n        pass\n",
                 f"    import shutil\n    shutil.rmtree({str(outside)!r})\n    return True\n"):
        s = ev.score(ex, body)
        assert s["score"] == 0.0 and not s["passed"] and s["sandbox_s"] < 6, s
    assert (outside / "keep.txt").read_text() == "keep me"


def test_bad_isolation_value():
    with pytest.raises(ValueError, match="auto, namespace, process"):
        resolve_isolation("docker")


def test_harness_process_is_never_the_one_running_code():
    r = run_python(f"import os\nassert os.getpid() != {os.getpid()}", LIMITS, "process")
    assert r.passed
