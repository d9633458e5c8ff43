"""The run-time version guard (specbench.common.versions): releases faked, the message names installed and
required, and pyproject.toml states the same ranges."""

from __future__ import annotations

import subprocess
import sys

from pathlib import Path

import pytest
from packaging.requirements import Requirement

from specbench.common.versions import SUPPORTED, UNTESTED, VersionError, check, require

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


def test_old_transformers_fails_naming_both(monkeypatch):
    monkeypatch.delenv(UNTESTED, raising=False)
    with pytest.raises(VersionError) as err:
        require({"torch": "2.11.0+cu130", "transformers": "5.17.0"})
    text = str(err.value)
    assert "transformers 5.17.0" in text and ">=5.24" in text and "cache" in text and "torch" not in text.split(";")[0][:5]


def test_newer_fails_unless_allowed(monkeypatch):
    monkeypatch.delenv(UNTESTED, raising=False)
    with pytest.raises(VersionError, match="torch 2.14.1 is newer"):
        require({"torch": "2.14.1", "transformers": "5.24.0"})
    monkeypatch.setenv(UNTESTED, "1")
    assert require({"torch": "2.14.1", "transformers": "5.24.0"}) == [
        "torch 2.14.1 is newer than specbench was tested with (torch>=2.11,<=2.13)"]
    with pytest.raises(VersionError, match="torch 2.4.0 is installed"):  # below the floor: never let through
        require({"torch": "2.4.0", "transformers": "5.24.0"})


def test_import_fails_with_a_faked_transformers(tmp_path):
    """A fresh interpreter whose transformers reports 5.17.0 (its module's __version__, whatever pip's metadata
    says) cannot import specbench: the error names installed and required."""
    code = ("import transformers; transformers.__version__ = '5.17.0'\n"
            "import specbench\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0
    assert "VersionError: transformers 5.17.0 is installed; specbench needs transformers" in done.stderr


def test_pyproject_states_the_same_ranges():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = {Requirement(d).name: Requirement(d).specifier for d in deps}
    for package, spec in SUPPORTED.items():
        assert str(reqs[package]) == str(Requirement(f"{package}{spec}").specifier)
