"""The package's shape: imports go one way (no cycles, layers only import below them), no module reaches
into another's private names, plugins install under the specbench namespace, each package says what it
owns, and every module imports on its own."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from helpers import ROOT

# Where each package's source lives (the plugin folders sit at the top of the repository).
SOURCES = {"specbench": ROOT / "specbench", "specbench.methods": ROOT / "methods",
           "specbench.evaluators": ROOT / "evaluators"}

# Each package may import only the packages listed for it (and itself): the layers of the design.
LAYERS = {
    "common": set(),
    "decoding": {"common"},
    "data": {"common"},
    "models": {"common", "data"},
    "methods": {"common", "decoding", "models"},
    "evaluators": {"common", "data"},
    "runs": {"common", "decoding", "data", "models"},
    "training": {"common", "decoding", "data", "models", "runs", "evaluators"},
    "analysis": {"common", "runs"},
    "bench": {"common", "decoding", "data", "models", "runs", "analysis", "training"},  # python -m specbench.bench
    "": {"common", "decoding", "data", "models", "runs", "analysis", "training"},  # entry points: lm_eval, report
}


def module_files() -> dict[str, Path]:
    """Every module of the installed package: dotted name -> source file."""
    out = {}
    for base, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("").parts
            if base == "specbench" and rel[0] in ("methods", "evaluators"):
                continue
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            out[".".join((base, *parts))] = path
    return out


MODULES = module_files()


def package_of(module: str) -> str:
    """specbench.decoding.engine and specbench.decoding -> 'decoding'; specbench.bench and specbench -> ''."""
    parts = module.split(".")
    is_package = MODULES[module].name == "__init__.py"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and is_package) else ""


def imports(module: str) -> list[tuple[str, str, int]]:
    """(imported specbench module, imported name or '', line) for every import in the module, at any depth."""
    tree = ast.parse(MODULES[module].read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "specbench"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "specbench":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub, "", node.lineno) if sub in MODULES else (node.module, a.name, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    """module -> the specbench modules it imports."""
    return {m: {target for target, _, _ in imports(m) if target != m} for m in MODULES}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_import_only_the_layers_below():
    bad = []
    for m in MODULES:
        own = package_of(m)
        for target, _, line in imports(m):
            dep = package_of(target)
            if dep and dep != own and dep not in LAYERS[own]:
                bad.append(f"{MODULES[m].relative_to(ROOT)}:{line} ({own or 'top'}) imports {target} ({dep})")
    assert bad == []


def test_no_private_names_from_other_modules():
    bad = []
    for m in MODULES:
        tree = ast.parse(MODULES[m].read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specbench"):
                for a in node.names:
                    if a.name.startswith("_"):
                        bad.append(f"{MODULES[m].relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}")
                    if f"{node.module}.{a.name}" in MODULES:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("specbench")})
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{MODULES[m].relative_to(ROOT)}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert bad == []


def test_packages_say_what_they_own_and_are_all_installed():
    packages = sorted(m for m, p in MODULES.items() if p.name == "__init__.py")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert sorted(config["packages"]) == packages
    assert config["package-dir"] == {"specbench.methods": "methods", "specbench.evaluators": "evaluators"}
    for m in packages:
        doc = ast.get_docstring(ast.parse(MODULES[m].read_text()))
        assert doc and doc.strip(), f"{MODULES[m]} has no docstring"
    assert set(LAYERS) == {package_of(m) for m in MODULES}


def test_plugin_folders_are_not_top_level_names():
    """methods/ and evaluators/ are importable only as specbench.methods / specbench.evaluators."""
    code = ("import importlib.util, sys; import specbench.methods, specbench.evaluators; "
            "print(importlib.util.find_spec('methods'), importlib.util.find_spec('evaluators'))")
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "None"]


def test_every_module_imports_on_its_own():
    """Each module imported first in a fresh package state (all specbench modules dropped between imports),
    so an import that works only after some other module was loaded fails here."""
    code = ("import importlib, sys\n"
            f"names = {sorted(MODULES)!r}\n"
            "failed = []\n"
            "for name in names:\n"
            "    for m in [m for m in sys.modules if m == 'specbench' or m.startswith('specbench.')]:\n"
            "        del sys.modules[m]\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except Exception as e:\n"
            "        failed.append(f'{name}: {type(e).__name__}: {e}')\n"
            "print('\\n'.join(failed))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("registry", ["methods", "datasets", "builders", "tasks"])
def test_registries_discover_their_plugins(registry):
    """Every module in a plugin package registers something; the registry finds it without a list (methods/: a
    policy (specbench.decoding.policy), a drafter, a shape (specbench.decoding.parts), a rule (specbench.decoding.rule)
    or a loop (specbench.decoding.method))."""
    from specbench.data.dataset import DATASETS
    from specbench.decoding.method import LOOPS
    from specbench.decoding.policy import POLICIES
    from specbench.decoding.parts import DRAFTERS, SHAPES
    from specbench.decoding.rule import RULES
    from specbench.models.pairs import BUILDERS
    from specbench.runs.runner import TASKS

    regs, folder = {"methods": ((POLICIES, DRAFTERS, SHAPES, RULES, LOOPS), ROOT / "methods"),
                    "datasets": ((DATASETS,), ROOT / "evaluators"), "builders": ((BUILDERS,), None),
                    "tasks": ((TASKS,), None)}[registry]
    names = [(reg, n) for reg in regs for n in reg.names()]
    assert names
    if folder:
        files = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
        modules = {sys.modules[type(reg.get(n)).__module__ if not isinstance(reg.get(n), type) else
                               reg.get(n).__module__].__name__ for reg, n in names}
        registered = {m.rsplit(".", 1)[1] for m in modules if m.startswith("specbench.") and "decoding" not in m}
        assert set(files) == registered
