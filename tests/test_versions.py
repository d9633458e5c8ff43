"""The run-time version guard (specbench.common.versions): releases faked, the message names installed and
required, and pyproject.toml states the same ranges."""

from __future__ import annotations

import subprocess
import sys

from pathlib import Path

import pytest
from packaging.requirements import Requirement

from specbench.common.versions import SUPPORTED, VersionError, check, require

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package,installed,kind", [
    ("transformers", "5.17.0", "below"), ("transformers", "5.23.0", "below"), ("transformers", "5.24.0", None),
    ("transformers", "5.25.0", "above"), ("transformers", "5.24.0.dev0", "below"),
    ("torch", "2.4.0", "below"), ("torch", "2.10.1+cu128", "below"), ("torch", "2.11.0+cu130", None),
    ("torch", "2.13.0+cpu", None), ("torch", "2.14.1", "above"), ("torch", "nightly", "invalid")])
def test_check_classifies(package, installed, kind):
    got = check(package, installed)
    assert (got and got[0]) == kind
    if got:
        assert installed in got[1] and SUPPORTED[package] in got[1]


def test_old_transformers_fails_naming_both():
    with pytest.raises(VersionError) as err:
        require({"torch": "2.11.0+cu130", "transformers": "5.17.0"})
    text = str(err.value)
    assert "transformers 5.17.0" in text and ">=5.24" in text and "cache" in text and "torch" not in text.split(";")[0][:5]


def test_newer_runs_with_a_warning_older_never():
    assert require({"torch": "2.14.1", "transformers": "5.24.0"}) == [
        "torch 2.14.1 is newer than specbench was tested with (torch>=2.11,<=2.13): it runs untested"]
    with pytest.raises(VersionError, match="torch 2.4.0 is installed"):  # below the floor: never let through
        require({"torch": "2.4.0", "transformers": "5.24.0"})


ENTRY_POINTS = {"run.py": "runpy.run_path('run.py', run_name='__main__')",
                "report": "runpy.run_module('specbench.report', run_name='__main__')",
                "bench": "runpy.run_module('specbench.bench', run_name='__main__')",
                "lm-eval adapter": "import specbench.lm_eval"}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_refuses_an_old_transformers_in_one_line(entry):
    """A fresh interpreter whose transformers reports 5.17.0 (its module's __version__, whatever pip's metadata
    says): each entry point prints one line naming installed and required, exits 1, and shows no traceback."""
    fake = "import runpy, sys, transformers; transformers.__version__ = '5.17.0'; sys.argv = ['x']"
    code = f"{fake}; {ENTRY_POINTS[entry]}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "Traceback" not in done.stderr
    assert done.stderr.startswith("specbench: transformers 5.17.0 is installed; specbench needs transformers>=5.24")


def test_a_newer_torch_warns_in_one_line_and_runs():
    code = "import torch; torch.__version__ = '2.14.1'; import specbench; print('ran')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr
    assert done.stderr.strip() == ("torch 2.14.1 is newer than specbench was tested with (torch>=2.11,<=2.13): it runs "
                                   "untested")


def test_pyproject_states_the_same_ranges():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = {Requirement(d).name: Requirement(d).specifier for d in deps}
    for package, spec in SUPPORTED.items():
        assert str(reqs[package]) == str(Requirement(f"{package}{spec}").specifier)
