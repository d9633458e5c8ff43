"""specbench.common's one-per-concept helpers: flat configs and their differences, atomic files, progress switch."""

from __future__ import annotations

import pytest
from transformers.utils import logging as hf_logging

from specbench.common import configs, files, progress


def test_flatten_nested_configs():
    cfg = {"a": {"b": 1, "c": {"d": [1, {"x": 2}]}, "e": {}}, "f": None, "g": "s"}
    assert configs.flatten(cfg) == {"a.b": 1, "a.c.d": [1, {"x": 2}], "f": None, "g": "s"}
    assert configs.flatten(cfg, sep="/")["a/c/d"] == [1, {"x": 2}]
    assert configs.flatten({}) == {}
    assert type(configs.flatten({"a": {"b": 1}})["a.b"]) is int  # plain Python values, not numpy's


def test_differences_name_every_differing_key():
    a = {"method": {"name": "vanilla", "gamma": 5}, "decode": {"temperature": 0.0}, "seed": 0}
    b = {"method": {"name": "vanilla", "gamma": 3}, "decode": {"temperature": 0.0}, "extra": True}
    assert configs.differing(a, b) == {"extra": (configs.MISSING, True), "method.gamma": (5, 3),
                                       "seed": (0, configs.MISSING)}
    assert configs.differences(a, b) == ["extra ('<missing>' vs True)", "method.gamma (5 vs 3)",
                                         "seed (0 vs '<missing>')"]
    assert configs.differences(a, a) == []


def test_write_text_atomic_leaves_one_whole_file(tmp_path):
    path = files.write_text_atomic(tmp_path / "t.md", "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["t.md"]

    with pytest.raises(TypeError):
        files.write_text_atomic(path, None)  # a failed write keeps the old file and leaves no temporary one
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["t.md"]


def test_atomic_folder_keeps_or_replaces_a_folder_written_meanwhile(tmp_path):
    final = tmp_path / "pair"
    with files.atomic_folder(final) as tmp:
        (tmp / "a").write_text("first")
    assert (final / "a").read_text() == "first"
    with files.atomic_folder(final) as tmp:  # another process finished first: its copy stays
        (tmp / "a").write_text("second")
    assert (final / "a").read_text() == "first"
    with files.atomic_folder(final, replace=True) as tmp:
        (tmp / "a").write_text("third")
    assert (final / "a").read_text() == "third"
    with pytest.raises(RuntimeError), files.atomic_folder(final, replace=True) as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError("crash while filling")
    assert (final / "a").read_text() == "third" and [p.name for p in tmp_path.iterdir()] == ["pair"]


def test_one_progress_switch():
    assert progress.progress_bar([], progress=False).disable and not progress.progress_bar([], progress=True).disable
    was_on = hf_logging.is_progress_bar_enabled()
    try:
        progress.switch_progress(False)  # a run with progress=false: transformers' bars and the toy's follow
        assert progress.library_progress() is False and progress.progress_bar([], progress.library_progress()).disable
        progress.switch_progress(True)
        assert progress.library_progress() == "auto"
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()
