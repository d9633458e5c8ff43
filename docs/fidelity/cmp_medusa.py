"""Fidelity, Medusa: specbench's MedusaHeads / MedusaDraft against FasterDecoding/Medusa's own code (GitHub source,
medusa/model/{medusa_model,utils,kv_cache}.py), the heads saved by save_head(..., "medusa", ...) loaded by Medusa's
release loader (MedusaModel.from_pretrained, its "MEDUSA-v0.1" branch) on the tiny target of make_work.py.

    PYTHONPATH=$MEDUSA_SRC /tmp/refs/venv-medusa/bin/python docs/fidelity/cmp_medusa.py WORK

- the heads' logits at the target's last hidden state (Medusa's own prefill: its KV Llama, transformers 4.34)
- the candidate tree of mc_sim_7b_63: generate_buffers + generate_candidates (temperature 0) vs MedusaDraft with
  StaticShape(mc_sim_7b_63), node by node (rank path -> token) and as token paths
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from safetensors.torch import load_file

import medusa.model.medusa_model as mm
from medusa.model.kv_cache import initialize_past_key_values
from medusa.model.medusa_choices import mc_sim_7b_63
from medusa.model.utils import generate_candidates, generate_medusa_buffers, initialize_medusa, reset_medusa_mode
from verdicts import Verdicts  # docs/fidelity/verdicts.py, beside this script

mm.AutoTokenizer.from_pretrained = staticmethod(lambda *a, **k: None)  # the tiny target has no tokenizer

W = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fidelity-work")
ours = json.loads((W / "ours.json").read_text())
T = load_file(W / "ours.safetensors")
verdicts = Verdicts()
report = verdicts.report


folder = W / "head-medusa"
model = mm.MedusaModel.from_pretrained(str(folder), torch_dtype=torch.float32).eval()
report("Medusa's MedusaModel.from_pretrained loads save_head(..., 'medusa') as written (medusa_lm_head.pt)")
saved = torch.load(folder / "medusa_lm_head.pt", map_location="cpu", weights_only=True)
k = len({key.split(".")[0] for key in saved})
same = all(torch.equal(model.medusa_head.state_dict()[key], v) for key, v in saved.items())
report(f"loaded: {model.medusa} heads (Medusa's v0.1 loader forces 5), the file has {k}; every saved tensor equal in "
       f"model.medusa_head {same}", same and model.medusa == k)

prompt = torch.tensor([ours["prompt"]])
buffers = generate_medusa_buffers(mc_sim_7b_63, device="cpu")
pkv, pkv_data, cur_len = initialize_past_key_values(model)
reset_medusa_mode(model)
with torch.no_grad():
    medusa_logits, logits = initialize_medusa(prompt, model, buffers["medusa_attn_mask"], pkv)
d_t = (logits[0] - T["target_logits"]).abs().max().item()
root = int(logits[0, -1].argmax())
report(f"target (Medusa KV Llama, transformers 4.34 vs specbench transformers 5.24): logits max abs diff {d_t:.1e}; "
       f"greedy token {root} vs {ours['root']}", d_t < 1e-4 and root == ours["root"])
ml = medusa_logits[:, 0, -1]  # [heads, V] at the last prompt position
d_m = (ml - T["medusa_logits"]).abs().max().item()
top_eq = sum(torch.equal(torch.topk(ml[i], 10).indices, torch.topk(T["medusa_logits"][i], 10).indices)
             for i in range(k))
report(f"heads' logits at the last hidden state: max abs diff {d_m:.1e} (|logits| <= {ml.abs().max():.1f}); top-10 "
       f"equal for {top_eq}/{k} heads", d_m < 1e-5 * max(1.0, ml.abs().max().item()) and top_eq == k)

with torch.no_grad():  # the heads alone, on specbench's own target state
    h = T["target_last_hidden"][len(ours["ids"]) - 2]
    iso = torch.stack([model.medusa_head[i](h) for i in range(k)])
d_iso = (iso - T["medusa_logits"]).abs().max().item()
report(f"heads alone on specbench's last hidden state: logits max abs diff {d_iso:.1e}", d_iso < 1e-5)

with torch.no_grad():
    cart, tree = generate_candidates(medusa_logits, logits, buffers["tree_indices"], buffers["retrieve_indices"],
                                     temperature=0)
tree = tree[0].tolist()  # [1 + 63]: the root (base model's token), then the nodes in sorted(choices) order
choices = sorted(mc_sim_7b_63, key=lambda x: (len(x), x))
medusa_node = {tuple(c): tree[i + 1] for i, c in enumerate(choices)}
medusa_path = {}
for c in choices:
    medusa_path[tuple(c)] = tuple(medusa_node[tuple(c[: j + 1])] for j in range(len(c)))
ours_tree = ours["medusa_tree"]
ours_node = {tuple(p): x for p, x in zip(ours_tree["rank_paths"], ours_tree["tokens"])}
ours_path = {tuple(p): tuple(tp) for p, tp in zip(ours_tree["rank_paths"], ours_tree["token_paths"])}
n_eq = sum(ours_node.get(c) == x for c, x in medusa_node.items())
p_eq = sum(ours_path.get(c) == tp for c, tp in medusa_path.items())
report(f"mc_sim_7b_63 tree: {len(medusa_node)} Medusa nodes vs {len(ours_node)} specbench nodes; root token "
       f"{tree[0]} vs committed {ours['root']}; node tokens {n_eq}/{len(medusa_node)} equal; root paths as token "
       f"tuples {p_eq}/{len(medusa_path)} equal; specbench's node order = Medusa's sorted (len, ranks) order: "
       f"{[tuple(p) for p in ours_tree['rank_paths']] == [tuple(c) for c in choices]}",
       n_eq == p_eq == len(medusa_node) == len(ours_node) and tree[0] == ours["root"])
# the verify rows Medusa builds (cart = tree candidates at retrieve_indices, padding -1): each is the root token then
# a leaf's token path, which must be one of specbench's root paths
rows = [tuple(x for x, i in zip(row[1:], ri[1:]) if i != -1)
        for row, ri in zip(cart.tolist(), buffers["retrieve_indices"].tolist())]
r_eq = sum(r in set(ours_path.values()) for r in rows)
report(f"Medusa's verify rows (retrieve_indices): {r_eq}/{len(rows)} are specbench root paths "
       f"({len(rows)} leaves)", r_eq == len(rows))
verdicts.finish("Medusa vs FasterDecoding/Medusa", W / "result-medusa.txt")
