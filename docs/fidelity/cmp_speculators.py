"""Fidelity, speculators: specbench's Eagle3Head against vllm-project/speculators 0.9.0's Eagle3DraftModel, the head
saved by save_head(..., "speculators", ...) and loaded with Eagle3DraftModel.from_pretrained.

    /tmp/refs/venv-speculators/bin/python docs/fidelity/cmp_speculators.py WORK

Eagle3DraftModel.forward is speculators' training-time-test forward: step 0 reads (target states, tokens) at every
position; step j reads, at each position, the step-0 keys up to it plus its own keys of steps 1..j (a diagonal)
and the token j places further on (teacher forcing, original_input_ids[:, 1 + j:]). At the last committed position
c = L - 2 that is exactly a chain: step j reads x_{L-1+j}. With the inputs ids[1:L] + specbench's first 5 drafts,
step j's argmax at c is speculators' draft j given the drafts before it equal specbench's; if every step's argmax
equals specbench's draft, speculators' own greedy chain is specbench's (by induction over the steps).
(a) step 0: the draft logits at every committed pair; (b) the chain of 6 (tokens and q at every step).
Run with _attn_implementation "eager" and with the default "simple_flex_attention" (for which the chain's
sequence is padded to 128 positions: speculators' block-mask extension fails on shorter ones, a limitation of its
training code, unrelated to the head's math).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from safetensors.torch import load_file

from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from verdicts import Verdicts  # docs/fidelity/verdicts.py, beside this script

W = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fidelity-work")
ours = json.loads((W / "ours.json").read_text())
T = load_file(W / "ours.safetensors")
ids = ours["ids"]
L, n_chain = len(ids), len(ours["eagle3_chain"])
V = T["target_logits"].shape[-1]
folder = W / "head-speculators"
verdicts = Verdicts()
report = verdicts.report


def run(model, hidden, inp, steps):
    """Eagle3DraftModel.forward (no loss): its draft tokens per step and the logits each step computed."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda mod, a, out: seen.append(out.detach()))
    pre = []
    hook2 = model.norm.register_forward_hook(lambda mod, a, out: pre.append(a[0].detach()))
    with torch.no_grad():
        drafts = model(hidden_states=hidden, input_ids=inp, document_ids=torch.zeros_like(inp), ttt_steps=steps)
    hook.remove()
    hook2.remove()
    return drafts, seen, pre


for attn in ("eager", "simple_flex_attention"):
    cfg = Eagle3SpeculatorConfig.from_pretrained(folder)
    cfg.transformer_layer_config._attn_implementation = attn
    try:
        m = Eagle3DraftModel.from_pretrained(folder, config=cfg).float().eval()
    except Exception as err:  # noqa: BLE001
        report(f"[{attn}] Eagle3DraftModel.from_pretrained failed: {err!r}", False)
        continue
    sd = load_file(folder / "model.safetensors")
    same = all(torch.equal(m.state_dict()[k], v) for k, v in sd.items())
    report(f"[{attn}] loaded save_head(..., 'speculators'): every saved tensor equal in Eagle3DraftModel {same}; "
           f"aux layer ids {m.config.eagle_aux_hidden_state_layer_ids} (ours {ours['eagle3_layers']}); "
           f"norm_before_residual {m.config.norm_before_residual}; draft vocab {m.lm_head.weight.shape[0]}",
           same and list(m.config.eagle_aux_hidden_state_layer_ids) == ours["eagle3_layers"])
    n = L - 1
    hidden = T["eagle3_feats"][None]  # specbench's target states [1, L-1, 3H]
    d2t = m.d2t.long()

    def to_target(d):
        return d + d2t[d]

    def probs(dl):
        p = torch.zeros(dl.shape[:-1] + (V,))
        p[..., torch.arange(len(d2t)) + d2t] = torch.softmax(dl.float(), -1)
        return p

    # (a) step 0 at every committed pair
    drafts, seen, pre = run(m, hidden, torch.tensor([ids[1:]]), 1)
    d_o = (pre[0][0] - T["eagle3_step0_out"]).abs().max().item()
    d_l = (seen[0][0] - T["eagle3_step0_logits"]).abs().max().item()
    amax = int((drafts[0][0] == T["eagle3_step0_logits"].argmax(-1)).sum())
    scale = seen[0].abs().max().item()
    report(f"[{attn}] (a) step 0 over {n} committed pairs: layer output max abs diff {d_o:.1e}; draft logits max abs "
           f"diff {d_l:.1e} (|logits| <= {scale:.1f}); argmax equal at {amax}/{n}",
           d_l < 1e-5 * max(1.0, scale) and amax == n)
    # (b) greedy chain: steps 0..5 at c = L - 2, fed specbench's drafts 1..5 (teacher forcing)
    chain = ours["eagle3_chain"]
    # padded to 128 positions (rows after c are never read by c): speculators' flex-attention block mask is built
    # for multiples of 128 and its extend_mask_for_draft_tokens fails on a shorter sequence after step 0
    inp = torch.tensor([ids[1:] + chain[: n_chain - 1]])
    inp = torch.cat([inp, torch.zeros(1, 128 - inp.shape[1], dtype=torch.long)], 1)
    hid = torch.cat([hidden, torch.zeros(1, 128 - n, hidden.shape[-1])], 1)
    drafts, seen, _ = run(m, hid, inp, n_chain)
    c = L - 2
    theirs = [int(to_target(dr[0, c])) for dr in drafts]
    q = torch.stack([probs(s[0, c]) for s in seen])
    d_q = (q - T["eagle3_chain_q"]).abs().max().item()
    eq = sum(a == b for a, b in zip(theirs, chain))
    report(f"[{attn}] (b) greedy chain (TTT forward, {n_chain} steps at the last committed position): speculators "
           f"{theirs}, specbench {chain}: drafts {eq}/{n_chain} equal; q max abs diff {d_q:.1e}",
           eq == n_chain and d_q < 1e-5)

verdicts.finish("EAGLE-3 vs speculators", W / "result-speculators.txt")
