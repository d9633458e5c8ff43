"""`python -m specbench.bench kit --out DIR`: the wheels a GPU node with its own torch lacks for `bench gpu` and the
CUDA test lane, fetched on a connected machine, and the one line that installs them there with no network.

The node's stack is read from `--node FILE`: its `pip list --format=freeze`, run on the node.
build_kit fetches, for the node's Python and platform, every requirement (and requirement of a fetched wheel) the
node does not satisfy; never torch, triton or the CUDA libraries: a node torch outside specbench's range is refused.
pip resolves nothing here itself (`--no-deps` throughout) because the node's packages are not installed on this
machine: its resolver cannot be told that they exist. The wheels must fit in --limit-mib (48 by default: what a
job's upload beside the checkout may hold).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import cast

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from specbench.common.files import ROOT
from specbench.common.versions import SUPPORTED

# what `bench gpu` and the CUDA lane import (tests/conftest.py CUDA_LANE), by specbench's requirement names
GPU_PATH = ("torch", "transformers", "accelerate", "hydra-core", "omegaconf", "pandas", "matplotlib", "scipy",
            "tqdm", "psutil", "pyarrow", "tokenizers", "safetensors", "scikit-learn")
TEST_PATH = ("pytest>=8",)  # the lane's runner
NEVER = ("torch", "triton")  # with every nvidia-* and cuda-* package: the node's own
LIMIT_MIB = 48


def never(name: str) -> bool:
    """Packages the kit must not carry: torch and the CUDA stack are the node's."""
    name = canonicalize_name(name)
    return name in NEVER or name.startswith(("nvidia-", "cuda-"))


def specbench_requirements() -> dict[str, Requirement]:
    """specbench's own requirements (pyproject.toml, as installed), by canonical name; their upper bounds (the newest
    releases the suite passed with) are kept for torch and transformers only (specbench.common.versions.SUPPORTED,
    checked again at import): a node's newer scipy or pandas is used as it is, and recorded in every run."""
    reqs = [Requirement(r) for r in md.requires("specbench") or [] if "extra ==" not in r]
    out: dict[str, Requirement] = {canonicalize_name(r.name): floor_only(r) for r in reqs}
    return {**out, **{name: Requirement(f"{name}{spec}") for name, spec in SUPPORTED.items()}}


def floor_only(req: Requirement) -> Requirement:
    """req without its upper bounds (<, <=)."""
    return Requirement(req.name + ",".join(str(s) for s in req.specifier if not s.operator.startswith("<")))


def pins(path: Path = ROOT / "constraints.txt") -> dict[str, str]:
    """constraints.txt's pinned versions by canonical name."""
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()] if path.exists() else []
    pairs = (line.partition("==") for line in lines if "==" in line)
    return {canonicalize_name(name): version.strip() for name, _, version in pairs}


def read_node(path: Path) -> dict[str, str]:
    """The node's packages {canonical name: version} from `pip list --format=freeze` lines (# comments skipped)."""
    out: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "==" not in line:
            raise SystemExit(f"{path}, line {n}: expected NAME==VERSION (`pip list --format=freeze`), got {line!r}")
        name, version = line.split("==", 1)
        out[canonicalize_name(name)] = version.strip()
    return out


def node_environment(python: str) -> dict[str, str]:
    """The marker environment of a Linux x86-64 node running CPython `python` (e.g. '3.12')."""
    env = cast(dict[str, str], default_environment())  # packaging's Environment: a TypedDict of str values only
    env.update({"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
                "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                "implementation_name": "cpython", "platform_python_implementation": "CPython"})
    return env


def satisfied(req: Requirement, node: dict[str, str]) -> bool:
    """Does the node's version of req's package satisfy it?"""
    have = node.get(canonicalize_name(req.name))
    return have is not None and req.specifier.contains(Version(have).public, prereleases=True)


def wheel_requirements(wheel: Path, env: dict[str, str]) -> list[Requirement]:
    """A wheel's Requires-Dist that apply on the node (markers evaluated, no extras)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    reqs = [Requirement(r) for r in msg.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({**env, "extra": ""})]


def fetch(req: Requirement, version: str | None, out: Path, python: str, platforms: list[str]) -> Path:
    """Download one wheel of req (at `version` if given) for the node, with no dependencies; a package published
    as a source archive only is built into a wheel here, which must be pure Python. Its path."""
    spec = f"{req.name}=={version}" if version else f"{req.name}{req.specifier}"
    before = set(out.glob("*.whl"))
    plat = [a for p in platforms for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", *plat, "-d", str(out), spec]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:  # a source archive only (antlr4-python3-runtime 4.9.3): build its wheel here
        build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), spec],
                               capture_output=True, text=True)
        if build.returncode != 0:
            raise SystemExit(f"kit: no wheel of {spec} for CPython {python} on {platforms[0]}, and building one "
                             f"failed:\n{done.stderr.strip()}\n{build.stderr.strip()}")
    new = sorted(set(out.glob("*.whl")) - before) or sorted(
        w for w in out.glob("*.whl") if canonicalize_name(w.name.split("-")[0]) == canonicalize_name(req.name))
    if not new:
        raise SystemExit(f"kit: pip reported success for {spec} but wrote no wheel into {out}")
    if new[0].name.split("-")[-1] != "any.whl" and done.returncode != 0:
        raise SystemExit(f"kit: {spec} built into {new[0].name}, not a pure-Python wheel: build it on the node")
    return new[0]


def build_kit(out: Path, python: str, platforms: list[str], node: dict[str, str]) -> list[Path]:
    """Every wheel the node lacks for GPU_PATH and TEST_PATH, in `out`; SystemExit naming a node torch out of range."""
    ours, pinned, env = specbench_requirements(), pins(), node_environment(python)
    queue = [ours.get(canonicalize_name(n), Requirement(n)) for n in GPU_PATH] + [Requirement(r) for r in TEST_PATH]
    torch_req = ours["torch"]
    if not satisfied(torch_req, node):
        raise SystemExit(f"kit: the node's torch {node.get('torch', '(none)')} is outside specbench's range "
                         f"torch{torch_req.specifier}: install a supported torch there first (the kit never carries "
                         "torch or CUDA libraries)")
    wheels, seen = [], set()
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in seen or never(name) or satisfied(req, node):
            continue
        seen.add(name)
        version = pinned.get(name)
        if version is not None and not req.specifier.contains(version, prereleases=True):
            version = None  # the pin does not satisfy this requirement: the newest that does
        wheel = fetch(req, version, out, python, platforms)
        wheels.append(wheel)
        node = {**node, name: wheel.name.split("-")[1]}  # what the node will have once the kit is installed
        queue += wheel_requirements(wheel, env)
    return wheels


def cmd_kit(args: argparse.Namespace) -> int:
    """Build the kit into args.out, check its size, print the install line."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    node = read_node(Path(args.node))
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # a kit appears whole or not at all
        wheels = build_kit(Path(tmp), args.python, args.platform or PLATFORMS, node)
        size = sum(w.stat().st_size for w in wheels)
        if size > args.limit_mib * 2**20:
            listing = ", ".join(f"{w.name} {w.stat().st_size / 2**20:.1f}" for w in wheels)
            print(f"kit: {size / 2**20:.1f} MiB of wheels, over --limit-mib {args.limit_mib}: {listing}",
                  file=sys.stderr)
            return 1
        for old in out.glob("*.whl"):
            old.unlink()
        for w in wheels:
            w.rename(out / w.name)
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB, in {out}:")
    for w in sorted(out.glob("*.whl")):
        print(f"  {w.name}  {w.stat().st_size / 2**20:.1f} MiB")
    print("On the node (no network), in the checkout:")
    # the kit's wheels and specbench (editable) into the node's torch environment: no index, no dependency resolution
    print(f"python -m pip install --no-index --no-deps --no-build-isolation {out}/*.whl -e .   "
          "# in the checkout, in the environment that holds the node's torch")
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The command's options."""
    ap.add_argument("--out", required=True, help="folder of the wheels (its old wheels are replaced)")
    ap.add_argument("--python", default="3.12", help="the node's Python version (default 3.12)")
    ap.add_argument("--platform", action="append", default=None,
                    help="pip platform tags of the node, repeatable (default manylinux_2_28 .. manylinux1 x86_64)")
    ap.add_argument("--node", required=True,
                    help="the node's package list: a file of `python -m pip list --format=freeze` run on the node")
    ap.add_argument("--limit-mib", type=float, default=LIMIT_MIB, help=f"most MiB of wheels (default {LIMIT_MIB})")


PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_24_x86_64"]
