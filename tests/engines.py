"""Engines for tests that set the binding by hand (EOS ids, stop strings, context) instead of taking the pair's."""

from __future__ import annotations

from typing import Any

from specbench.decoding.engine import Engine
from specbench.decoding.method import Binding, Method
from specbench.decoding.sampling import SamplingParams
from specbench.runs.runner import build_method


def bound_engine(method: Method, models: dict[str, Any], vocab_size: int, temperature: float = 0.0,
                 eos_ids=(), tokenizer: Any = None, stop_strings=(), context: int | None = None,
                 pair: Any = None) -> Engine:
    """An engine running `method` bound to `models` (pair role -> model) with these settings."""
    method.bind(Binding(models, tokenizer, vocab_size, frozenset(eos_ids), SamplingParams(temperature), context, pair))
    return Engine(method, tuple(stop_strings))


def pair_engine(pair: Any, method: dict | Method, eos_ids=(), stop_strings=(), context: int | None = 512,
                temperature: float = 0.0) -> Engine:
    """An engine running `method` (a method config or a built method) on the roles it needs of `pair`."""
    m = build_method(method) if isinstance(method, dict) else method
    models = {role: pair.model(role) for role in m.roles}
    return bound_engine(m, models, pair.vocab_size, temperature, eos_ids, pair.tokenizer, stop_strings, context, pair)
