"""The README's set-up and test commands are the ones CI runs (.ci/run), word for word."""

import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from helpers import ROOT


def commands(text: str) -> list[str]:
    """Each shell line without its comment and surrounding blanks, empty ones dropped."""
    return [c for c in (line.split("  #")[0].strip() for line in text.splitlines()) if c and not c.startswith("#")]


def readme_blocks() -> list[list[str]]:
    """The commands of each ```bash block of README.md, in order."""
    return [commands(b) for b in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)]


def test_ci_runs_the_readmes_setup_and_test_commands():
    setup, tests = readme_blocks()[:2]
    ci = commands((ROOT / ".ci" / "run").read_text())
    installs = [c for c in setup if c.startswith("pip ")]
    assert installs == ["pip install 'torch<=2.13' --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu",
                        "pip install -e '.[dev]'"]
    assert [c for c in ci if c.startswith(("pip install", "python -m pip install"))] == installs  # same order
    assert tests == ['python -m pytest -q -m "not slow" -n auto'] and ci[-1] == tests[0]


def test_ci_installs_into_a_new_virtual_environment_every_time():
    """.ci/run makes a fresh venv in a new temporary folder and activates it before the first install."""
    ci = commands((ROOT / ".ci" / "run").read_text())
    first_install = next(i for i, c in enumerate(ci) if c.startswith("pip install"))
    made = [i for i, c in enumerate(ci) if re.fullmatch(r'python3? -m venv "\$CI_TMP/venv"', c)]
    activated = [i for i, c in enumerate(ci) if c == '. "$CI_TMP/venv/bin/activate"']
    assert made and activated and made[0] < activated[0] < first_install
    assert any(c.startswith('CI_TMP="$(mktemp -d)"') for c in ci[:made[0]])  # a new folder, never reused
    assert 'rm -rf "$CI_TMP"' in (ROOT / ".ci" / "run").read_text()


def requirements(lines: list[str]) -> dict[str, Requirement]:
    """name (normalised) -> Requirement of each requirement line."""
    reqs = [Requirement(line) for line in lines]
    return {canonicalize_name(r.name): r for r in reqs}


def test_every_dependency_is_bounded_by_the_version_in_constraints():
    """Each dependency of pyproject (dev extras too) has an upper bound `<=V` where V is the version
    constraints.txt pins (the newest the suite passed with), and that version satisfies the whole range."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = requirements(project["dependencies"] + project["optional-dependencies"]["dev"])
    pins = {canonicalize_name(n): v for n, v in
            (line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
             if line and not line.startswith("#"))}
    for name, req in deps.items():
        uppers = [s.version for s in req.specifier if s.operator == "<="]
        assert uppers, f"{req}: no upper bound (<=)"
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert Version(uppers[0]) == Version(pins[name]), f"{req}: upper bound is not the pinned {pins[name]}"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req} excludes the pinned {pins[name]}"


def test_the_readmes_torch_bound_is_pyprojects():
    bound = re.search(r'"torch>=[\d.]+,(<=[\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    torch_line = next(c for c in readme_blocks()[0] if c.startswith("pip install 'torch"))
    assert f"'torch{bound}'" in torch_line
