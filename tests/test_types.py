"""The type hints hold: mypy (pinned in the `dev` extra, configured in pyproject.toml's [tool.mypy]) over specbench/
and methods/ finds no error."""

import subprocess
import sys

from helpers import ROOT


def test_the_type_checker_finds_no_error():
    p = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout[-20000:] + p.stderr[-2000:]
    assert "Success: no issues found" in p.stdout
