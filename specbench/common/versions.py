"""The torch and transformers releases specbench runs on, checked when specbench is imported.

pip checks pyproject's requirements only when it resolves them; a node's site-installed torch, an environment filled
with `--no-deps`, or conda can hold other releases, and transformers < 5.24 accepts the models' `cache=` argument and
ignores it (no KV cache: slower, and different calls than the harness counts). So the modules' own `__version__`s
(not pip's metadata) are checked here, once, against SUPPORTED; tests/test_versions.py checks pyproject's ranges.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from specbench.common.errors import UserError

# package -> the releases tested (pyproject.toml's requirement, the same string)
SUPPORTED = {"torch": ">=2.11,<=2.13", "transformers": ">=5.24,<=5.24.0"}
WHY = {"torch": "the floor is the oldest release the engine, acceptance, tree, head and method tests ran on "
                "(docs/results/install-and-ci.md, 'The supported floor')",
       "transformers": "5.24 renamed the models' cache argument `past_key_values` to `cache`, which older releases "
                       "accept and silently ignore"}


class VersionError(UserError, ImportError):
    """An installed torch or transformers outside SUPPORTED; the message names installed and required."""


def check(package: str, installed: str) -> tuple[str, str] | None:
    """None when `installed` (a module's __version__, e.g. '2.11.0+cu130'; its local label is not compared) is inside
    SUPPORTED[package], else ("below" | "above" | "invalid", the message naming installed and required)."""
    spec, wanted = SpecifierSet(SUPPORTED[package]), f"{package}{SUPPORTED[package]}"
    try:
        public = Version(Version(installed).public)
    except InvalidVersion:
        return "invalid", f"{package} reports version {installed!r}, not a PEP 440 version; specbench needs {wanted}"
    if spec.contains(public, prereleases=True):
        return None
    floor = SpecifierSet(",".join(s for s in SUPPORTED[package].split(",") if s.startswith(">")))
    if not floor.contains(public, prereleases=True):
        return "below", f"{package} {installed} is installed; specbench needs {wanted} ({WHY[package]})"
    return "above", f"{package} {installed} is newer than specbench was tested with ({wanted})"


def require(versions: dict[str, str]) -> list[str]:
    """Raise VersionError naming each package below its range or with no valid version; a newer release than the
    tested one runs, its one-line warning returned. `versions`: package -> __version__."""
    problems = [p for p in (check(name, v) for name, v in versions.items()) if p]
    fatal = [why for kind, why in problems if kind != "above"]
    if fatal:
        raise VersionError("; ".join(fatal) + ". Install the supported releases (pip install -e . resolves them; on a "
                           "node with its own torch, docs/gpu.md's 'Offline GPU nodes' kit)")
    return [f"{why}: it runs untested" for kind, why in problems if kind == "above"]


def require_installed() -> list[str]:
    """require() on the imported torch and transformers."""
    import torch
    import transformers

    return require({"torch": torch.__version__, "transformers": transformers.__version__})
