"""A method built from its config and bound to the pair it runs on: the decoder of a run."""

from __future__ import annotations

from typing import cast

import torch

from specbench.decoding.decoders import Decoder, make_decoder
from specbench.decoding.method import Binding, Method
from specbench.decoding.sampling import SamplingParams
from specbench.models.pairs import Pair


def build_method(cfg: dict) -> Method:
    """The method cfg describes, composed from the parts it names (specbench.decoding.compose), each option first
    checked against the type hints of its part's constructor (`method.gamma=true` is not γ=1)."""
    from specbench.decoding.compose import build

    return build(cfg)


def pair_binding(pair: Pair, method: Method, params: SamplingParams) -> Binding:
    """The pair as `method` runs on it: the models of its roles, the tokenizer and vocabulary range, the EOS ids
    and context over those models, and the decode settings."""
    models: dict[str, torch.nn.Module] = {role: pair.model(role) for role in method.plan.roles}
    used = [pair.model(role) for role in models]  # the same models, as the pair's (PreTrainedModel)
    same = [m for role, m in zip(models, used) if pair.same_tokenizer(role)]  # EOS ids: the target tokenizer's
    return Binding(models, pair.tokenizer, pair.vocab_size, frozenset(pair.eos_ids(same)), params,
                   pair.context_length(used), pair)


def make_engine(pair: Pair, method: Method, params: SamplingParams, stop_strings: tuple[str, ...],
                compile: bool = False) -> Decoder:
    """Bind `method` to `pair` (Method.bind, once per engine) and build the engine that runs it (compiled: the
    static-cache, torch.compile path)."""
    return make_decoder(method.bind(pair_binding(pair, method, params)), stop_strings, compile)


def decoder_device(decoder: Decoder) -> torch.device:
    """The device a decoder runs on (its verifier model's): a cast, as torch's stubs type a module's `.device` as
    Tensor | Module; the verifier is a PreTrainedModel, whose device is a torch.device."""
    return cast(torch.device, decoder.device)
