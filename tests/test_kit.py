"""`python -m specbench.bench kit`: which wheels a node with its own torch is given, from its package list and the
wheels' own metadata (downloads faked: no network in tests), the size limit, and a node's list
(tests/data/node_freeze.txt: `pip list --format=freeze` of a GPU node with torch 2.11)."""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from specbench.bench import kit


def fake_wheel(folder: Path, name: str, version: str, requires: list[str] = (), size: int = 0) -> Path:
    """A wheel file whose METADATA names its Requires-Dist (and `size` bytes of payload)."""
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                                            + meta)
        if size:
            z.writestr("payload.bin", b"\0" * size, compress_type=zipfile.ZIP_STORED)
    return path


NODE = Path(__file__).parent / "data" / "node_freeze.txt"


def test_a_nodes_list_is_read():
    node = kit.read_node(NODE)
    assert node["torch"] == "2.11.0" and node["transformers"] == "5.17.0" and "hydra-core" not in node


def test_a_bad_node_line_names_file_and_line(tmp_path):
    f = tmp_path / "node.txt"
    f.write_text("# comment\ntorch==2.11.0\ntransformers 5.17\n")
    with pytest.raises(SystemExit, match=r"node.txt, line 3: expected NAME==VERSION"):
        kit.read_node(f)


def test_requirements_and_markers(tmp_path):
    w = fake_wheel(tmp_path, "pkg", "1.0", ["a>=1", "b; python_version < '3.11'", "c; extra == 'dev'",
                                            "d; sys_platform == 'linux'"])
    assert [r.name for r in kit.wheel_requirements(w, kit.node_environment("3.12"))] == ["a", "d"]
    assert [r.name for r in kit.wheel_requirements(w, kit.node_environment("3.10"))] == ["a", "b", "d"]
    assert kit.satisfied(Requirement("scipy>=1.10"), {"scipy": "1.18.1"})
    assert not kit.satisfied(Requirement("transformers>=5.24"), {"transformers": "5.17.0"})
    assert not kit.satisfied(Requirement("x>=1"), {})
    assert str(kit.floor_only(Requirement("scipy>=1.10,<=1.17.1")).specifier) == ">=1.10"
    assert kit.never("torch") and kit.never("nvidia-cublas") and kit.never("cuda-bindings") and not kit.never("tqdm")


def test_the_kit_holds_what_the_node_lacks_and_never_torch(tmp_path, monkeypatch):
    """A node with torch 2.11 and transformers 5.17: transformers is fetched at constraints.txt's pin, its new
    requirement (fake 'newdep') follows, Hydra and its antlr4 come too; torch and CUDA packages never."""
    fetched: list[tuple[str, str | None]] = []
    deps = {"transformers": ["torch>=2.2", "nvidia-cublas", "newdep>=2", "tqdm"], "hydra-core": ["omegaconf>=2.2",
            "antlr4-python3-runtime==4.9.*"], "omegaconf": ["antlr4-python3-runtime==4.9.*", "PyYAML>=5.1"]}

    def fetch(req, version, out, python, platforms):
        fetched.append((req.name, version))
        return fake_wheel(out, req.name, version or "2.0", deps.get(req.name, []))

    monkeypatch.setattr(kit, "fetch", fetch)
    node = {"torch": "2.11.0", "transformers": "5.17.0", "tqdm": "4.70.1", "pyyaml": "6.0.3", "pandas": "3.0.6",
            "matplotlib": "3.11.2", "scipy": "1.18.1", "psutil": "7.2.2", "pyarrow": "25.0.1", "tokenizers": "0.23.2",
            "safetensors": "0.8.0", "accelerate": "1.15.0", "scikit-learn": "1.9.1", "pytest": "9.1.1"}
    wheels = kit.build_kit(tmp_path, "3.12", kit.PLATFORMS, node)
    names = {n for n, _ in fetched}
    assert names == {"transformers", "hydra-core", "omegaconf", "antlr4-python3-runtime", "newdep"}
    assert ("transformers", "5.24.0") in fetched and len(wheels) == 5
    pins = kit.pins()
    assert ("hydra-core", pins["hydra-core"]) in fetched and ("newdep", None) in fetched  # no pin: the newest


def test_a_node_torch_outside_the_range_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"the node's torch 2.4.0 is outside specbench's range torch.*2\.11"):
        kit.build_kit(tmp_path, "3.12", kit.PLATFORMS, {"torch": "2.4.0"})


def test_a_kit_over_the_limit_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kit, "build_kit", lambda out, *a: [fake_wheel(out, "big", "1.0", size=2 * 2**20)])
    out = tmp_path / "kit"
    args = argparse.Namespace(out=str(out), python="3.12", platform=None, node=str(NODE), limit_mib=1.0)
    assert kit.cmd_kit(args) == 1
    assert "over --limit-mib 1.0" in capsys.readouterr().err and not list(out.glob("*.whl"))
    args.limit_mib = 48
    assert kit.cmd_kit(args) == 0
    printed = capsys.readouterr().out
    assert [w.name for w in out.glob("*.whl")] == ["big-1.0-py3-none-any.whl"]
    assert "--no-index --no-deps --no-build-isolation" in printed and f"{out}/*.whl -e ." in printed
