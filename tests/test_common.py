"""specbench.common's one-per-concept helpers: flat configs and their differences, atomic files, progress switch."""

from __future__ import annotations

from specbench.common import configs


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
