"""The README's set-up and test commands are the ones CI runs (.ci/run), word for word."""

import re

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
    assert installs == ["pip install 'torch<=2.13' --index-url https://download.pytorch.org/whl/cpu",
                        "pip install -e '.[dev]'"]
    assert [c for c in ci if c.startswith(("pip ", "python -m pip"))] == installs  # the same, in the same order
    assert tests == ['python -m pytest -q -m "not slow"'] and ci[-1] == tests[0]


def test_the_readmes_torch_bound_is_pyprojects():
    bound = re.search(r'"torch>=[\d.]+,(<=[\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f"'torch{bound}'" in readme_blocks()[0][0]
