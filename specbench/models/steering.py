"""SD² steering (sd2.md section 3): a drafter whose SwiGLU MLPs are biased by the verifier's hidden states.

    g   = W_hml [h; m; l]                         h, m, l: verifier hidden states at `layers`, [3 H_v] -> [H_v]
    b_l = W_s^(l) g                               one bias per drafter layer l, [I_D]
    MLP_l(a) = W_d ((W_u a + b_l) * act(W_g a))   the up-projection is biased before gating (Eq. 2)

Init (section 3.3): W_s = 0 (the steered drafter starts as the plain drafter) and W_hml = [I I I] (g = h + m + l).
W_s is one linear map H_v -> L_D * I_D whose output is split into the L_D layer biases (Figure 2: "transformed by
another linear layer into a set of biases"), so each layer gets its own bias from the same g.

A forward hook on each layer's `mlp.up_proj` returns `up_proj(a) + b_l`; Llama, Qwen2 and Qwen3 MLPs compute
`down_proj(act_fn(gate_proj(a)) * up_proj(a))`, so this is exactly Eq. 2 with transformers' code untouched, the
drafter's state dict keeps its keys (save_pretrained / from_pretrained), and removing the hooks restores it.

Layers (default_layers): the paper's (3, L // 2, L - 2), "inspired by EAGLE-3", as 1-based hidden_states indices
(0 is the embeddings; the paper gives no base, its training command passes [3, 16, 29] for 32 layers).

Which positions are steered (decided here; the paper gives the rule only as "offset δ"):
- Inference: a drafting block's steering vector comes from the verifier's states at the last accepted position s
  (whose distribution gave the block's first token; the first rejected draft in the paper's wording). Drafting the
  i-th token of the block queries the drafter at s + i, so δ = i in [1, k]. The tokens the drafter reads at the
  start of a block (the correction or bonus token, and the last draft when all were accepted) are read with the
  new block's bias, and their keys and values keep it (the paper: steering also reaches attention through earlier
  positions). The first block of a generation is drafted before the verifier has run, so it is not steered (b = 0).
- Training: one δ ~ U[1, k] per sequence; the drafter's position j is steered with g from the verifier's position
  j - δ when j - δ >= P - 1 (P = prompt length: the verifier has read the whole prompt, as after the first verify
  at inference) and not otherwise, so prompt positions are never steered, as at inference.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Callable, Protocol

import torch
from torch import nn
from transformers import PreTrainedModel

from specbench.common.errors import InputError

SWIGLU_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def default_layers(num_layers: int) -> tuple[int, ...]:
    """(3, L // 2, L - 2): the low, middle and high hidden_states indices of an L-layer verifier
    (each clamped to 1..L, for the tiny verifiers of tests with fewer than 5 layers)."""
    return tuple(min(max(k, 1), num_layers) for k in (3, num_layers // 2, num_layers - 2))


def check_layers(layers: Iterable[int], num_layers: int,
                 default: Callable[[int], tuple[int, ...]] = default_layers, kind: str = "sd2") -> tuple[int, ...]:
    """Three verifier hidden_states indices in 1..L (0 would be the embeddings): sd2's steering layers, or with
    `default` and `kind` another reader's (an EAGLE-3 head's)."""
    layers = tuple(int(k) for k in layers)
    if len(layers) != 3 or not all(1 <= k <= num_layers for k in layers):
        raise InputError(f"task.layers for {kind} must be three hidden_states indices in 1..{num_layers} (the "
                         f"verifier's layers), got {list(layers)}; the default is {list(default(num_layers))}")
    return layers


class SwiGLUMLP(Protocol):
    """A decoder layer's MLP as check_swiglu finds it: down_proj(act_fn(gate_proj(a)) * up_proj(a))."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear


def check_swiglu(drafter: PreTrainedModel) -> list[SwiGLUMLP]:
    """The drafter's decoder-layer MLPs, after checking they are SwiGLU MLPs of a supported architecture."""
    kind = drafter.config.model_type
    layers = getattr(getattr(drafter, "model", None), "layers", None)
    if kind not in SWIGLU_MODEL_TYPES or layers is None:
        raise ValueError(f"sd2 steers SwiGLU drafters of the architectures {', '.join(SWIGLU_MODEL_TYPES)}; "
                         f"drafter {drafter.name_or_path!r} is {kind!r}")
    mlps: list[SwiGLUMLP] = [layer.mlp for layer in layers]  # checked below
    for m in mlps:
        if not all(isinstance(getattr(m, a, None), nn.Linear) for a in ("gate_proj", "up_proj", "down_proj")):
            raise ValueError(f"sd2: drafter {drafter.name_or_path!r} has an MLP without gate/up/down projections")
    return mlps


class Steering(nn.Module):
    """W_hml [3 H_v -> H_v] and W_s [H_v -> L_D * I_D], initialised to g = h + m + l and b = 0."""

    def __init__(self, verifier_hidden: int, draft_layers: int, draft_intermediate: int,
                 layers: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = tuple(layers)
        self.draft_layers, self.draft_intermediate = draft_layers, draft_intermediate
        self.w_hml = nn.Linear(3 * verifier_hidden, verifier_hidden, bias=False)
        self.w_s = nn.Linear(verifier_hidden, draft_layers * draft_intermediate, bias=False)
        with torch.no_grad():
            self.w_hml.weight.copy_(torch.eye(verifier_hidden).repeat(1, 3))  # [I I I]
            self.w_s.weight.zero_()

    def config(self) -> dict:
        """The constructor arguments (saved next to the weights)."""
        return {"verifier_hidden": self.w_hml.out_features, "draft_layers": self.draft_layers,
                "draft_intermediate": self.draft_intermediate, "layers": list(self.layers)}

    def vector(self, states: torch.Tensor) -> torch.Tensor:
        """g = W_hml [h; m; l]: states [..., 3, H_v] -> [..., H_v]."""
        return self.w_hml(states.flatten(-2).to(self.w_hml.weight.dtype))

    def bias(self, g: torch.Tensor, layer: int) -> torch.Tensor:
        """b_l = W_s^(l) g: [..., H_v] -> [..., I_D] (rows l*I_D .. (l+1)*I_D of W_s)."""
        rows = slice(layer * self.draft_intermediate, (layer + 1) * self.draft_intermediate)
        return nn.functional.linear(g, self.w_s.weight[rows])


class SteeredDrafter:
    """A drafter with steering hooks on every MLP up-projection, and the steering module that feeds them. Each hook
    adds the current block's b_l [I_D] (or [B, 1, I_D], one per row; inference: computed once per block by
    `set_block`), or b_l of per-position vectors g [B, T, H_v] (training: `set_positions`; computed in the hook, so
    gradients reach W_s and W_hml), or nothing (`clear`)."""

    def __init__(self, model: PreTrainedModel, steering: Steering) -> None:
        mlps = check_swiglu(model)
        if len(mlps) != steering.draft_layers or mlps[0].up_proj.out_features != steering.draft_intermediate:
            raise ValueError(f"steering was built for {steering.draft_layers} drafter layers of width "
                             f"{steering.draft_intermediate}; drafter {model.name_or_path!r} has {len(mlps)} of "
                             f"width {mlps[0].up_proj.out_features}")
        self.model, self.steering = model, steering
        self.g: torch.Tensor | None = None
        self._block: list[torch.Tensor] | None = None  # b_l of the current block (inference)
        self._hooks = [m.up_proj.register_forward_hook(self._hook(i)) for i, m in enumerate(mlps)]

    def _hook(self, layer: int) -> Callable[[nn.Module, tuple, torch.Tensor], torch.Tensor | None]:
        def add_bias(module: nn.Module, args: tuple, up: torch.Tensor) -> torch.Tensor | None:
            if self._block is not None:
                return up + self._block[layer]  # [I_D] broadcast over positions
            if self.g is not None:
                return up + self.steering.bias(self.g, layer)  # [B, T, I_D]
            return None  # unsteered: the module's own output

        return add_bias

    def set_block(self, states: torch.Tensor) -> None:
        """Steer the next block from the verifier's states [3, H_v] at the last accepted position, or each row of a
        batch from its own, states [B, 3, H_v] (biases [B, 1, I_D], broadcast over the row's positions)."""
        with torch.no_grad():
            g = self.steering.vector(states)  # [H_v] or [B, H_v]
            if g.dim() == 2:
                g = g[:, None]  # [B, 1, H_v]
            self._block = [self.steering.bias(g, i).to(self.model.dtype) for i in range(self.steering.draft_layers)]
        self.g = None

    def set_positions(self, g: torch.Tensor | None) -> None:
        """Steer each position with its own g [B, T, H_v] (zeros where unsteered), or None."""
        self.g, self._block = g, None

    def clear(self) -> None:
        """No steering (the start of a generation: the first block is drafted before any verify)."""
        self.g, self._block = None, None

    def remove(self) -> None:
        """Remove the hooks: the model is the plain drafter again."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.clear()


def training_steering(steering: Steering, states: torch.Tensor, delta: torch.Tensor, prompt_len: torch.Tensor
                      ) -> torch.Tensor:
    """Per-position steering vectors [B, T, H_v] for a training batch from the verifier's hidden states
    [B, T, 3, H_v], delta [B] in [1, k] and prompt_len [B]: position j gets g_{j - δ} if j - δ >= P - 1, else 0."""
    g = steering.vector(states)  # [B, T, H_v]
    T = g.shape[1]
    src = torch.arange(T, device=g.device)[None, :] - delta[:, None]  # [B, T]
    valid = src >= (prompt_len[:, None] - 1)
    idx = src.clamp(min=0)[..., None].expand(-1, -1, g.shape[-1])
    return g.gather(1, idx) * valid[..., None].to(g.dtype)
