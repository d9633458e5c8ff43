"""Decoders: the engine (one draft-verify loop for every native method) and, beside it, the decoder of a method
whose loop is another library's (`hf_assisted`: transformers' assisted generation). `make_decoder` picks one for
a bound method; both answer `generate` and `generate_batch` with the engine's `Generation`s.
"""

from __future__ import annotations

import torch

from specbench.decoding.engine import Engine
from specbench.decoding.records import Generation
from specbench.decoding.method import Method
from specbench.decoding.sampling import Sampler
from specbench.decoding.stopping import StopCriteria


class ExternalDecoder:
    """Decodes with a method's loop (Method.loop), one row at a time, stopping where the engine would (the same
    StopCriteria)."""

    compile = False

    def __init__(self, method: Method, stop_strings: tuple[str, ...] = ()) -> None:
        b = method.bound
        self.method = method
        self.sampler = Sampler(b.params, b.vocab_size)  # the decode settings' distributions (as the engine's)
        self.stop = StopCriteria(frozenset(b.eos_ids), b.tokenizer, tuple(stop_strings))
        self.context_length = b.context_length
        self.device = b.models["target"].device

    def generate(self, prompt_ids: list[int], max_new_tokens: int, generator: torch.Generator | None = None,
                 trace: bool = False) -> Generation:
        """Decode up to max_new_tokens new tokens after prompt_ids [P] with the method's loop."""
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        assert self.method.loop is not None  # make_decoder: a method with a loop
        return self.method.loop.generate(self.method.bound, prompt_ids, max_new_tokens, self.stop, generator, trace)

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       generators: list[torch.Generator | None] | None = None, trace: bool = False) -> list[Generation]:
        """One Generation per prompt [B][P_b] (a loop's plan may refuse B > 1: Plan.refuse)."""
        if not prompts:
            return []
        self.method.plan.refuse(self.method.name, len(prompts))
        gens = generators or [None] * len(prompts)
        return [self.generate(p, max_new_tokens, g, trace) for p, g in zip(prompts, gens)]


Decoder = Engine | ExternalDecoder


def make_decoder(method: Method, stop_strings: tuple[str, ...] = (), compile: bool = False) -> Decoder:
    """The decoder of a bound method: its loop's (compile refused), else the engine."""
    if method.loop is not None:
        method.plan.refuse(method.name, compile=compile)
        return ExternalDecoder(method, stop_strings)
    return Engine(method, stop_strings, compile)
