"""Early-exit views of a decoder: its first k layers, then its final norm and head, sharing its weights.

Self-speculation by layer skipping (LayerSkip, Elhoushi et al. 2024; transformers' `assistant_early_exit`): the draft
is h_k = layers_1..k(embed(x)), q = softmax(head(norm(h_k))) with the target's own modules. The view is a second
model object of the same class built on the meta device from the target's config with num_hidden_layers = k;
`load_state_dict(assign=True)` then makes its parameters the target's tensors and its non-persistent buffers (rotary
frequencies) are the target's too, so nothing is copied and it is an ordinary model with its own KV cache (as
transformers' early exit drafts). A separate object rather than switching the target's config.num_hidden_layers
around each draft call, as transformers does, so that no shared state changes during decoding.
"""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from specbench.common.options import OptionError


def exit_layers(model: PreTrainedModel) -> int:
    """The number of decoder layers of `model` (its text config's num_hidden_layers)."""
    return int(model.config.get_text_config().num_hidden_layers)


def early_exit(model: PreTrainedModel, layers: int, key: str = "method.exit_layer") -> PreTrainedModel:
    """A model computing `model`'s first `layers` decoder layers then its final norm and head (weights shared)."""
    n = exit_layers(model)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < n:
        raise OptionError(f"{key}={layers!r}: the target {model.name_or_path!r} has {n} decoder layers, so the exit "
                          f"layer must be an integer in [1, {n - 1}]")
    if getattr(model, "hf_quantizer", None) is not None:
        raise OptionError(f"{key}: the target {model.name_or_path!r} is quantized; an early-exit view shares "
                          "unquantized weights only: drop pair.target.quantization")
    cfg = copy.deepcopy(model.config)
    text = cfg.get_text_config()
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None) is not None:
        text.layer_types = text.layer_types[:layers]
    with torch.device("meta"):
        view = type(model)(cfg)
    own = view.state_dict()
    view.load_state_dict({k: v for k, v in model.state_dict().items() if k in own}, assign=True, strict=True)
    source = dict(model.named_buffers())
    for name, _ in list(view.named_buffers()):  # non-persistent buffers are not in the state dict
        module, _, attr = name.rpartition(".")
        setattr(view.get_submodule(module), attr, source[name])
    view.generation_config = model.generation_config
    view.name_or_path = f"{model.name_or_path}[:{layers} layers]"
    return view.eval()
