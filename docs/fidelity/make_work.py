"""Fidelity, part 1 (specbench's python, transformers 5.x): build the tiny target and the random heads into WORK, and
dump what specbench computes from them, for the reference scripts to compare against.

    /tmp/v25/bin/python docs/fidelity/make_work.py WORK

WORK/target/            tiny random Llama (8 layers, H 64, 4 heads, 2 kv heads, V 256), a config.json written by hand
                        with fields transformers 4.34, 4.53 and 5.x all read, model.safetensors (+ an index, which
                        EAGLE's embedding loader needs)
WORK/head-eagle3/       a random Eagle3Head (draft vocabulary 96 of 256 ids), save_head(..., "eagle3")
WORK/head-speculators/  the same head, save_head(..., "speculators", embed=target embedding)
WORK/head-medusa/       random MedusaHeads (5 heads, 1 layer), save_head(..., "medusa")
WORK/ours.json          prompt, tokens, drafts, trees (specbench)
WORK/ours.safetensors   tensors (target states and logits, head outputs, logits, q)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from specbench.decoding.drafts import Drafting
from specbench.decoding.head_drafts import DraftHead, Eagle3Draft, MedusaDraft
from specbench.decoding.sampling import Sampler, SamplingParams
from specbench.methods.dyn_tree import DynamicShape
from specbench.methods.spec_tree import StaticShape, check_paths
from specbench.models.eagle3 import Eagle3Config, Eagle3Head
from specbench.models.heads import eagle3_layers, read_head, save_head
from specbench.models.medusa import MedusaConfig, MedusaHeads

H, HEADS, KV, I, L_T, V, DV = 64, 4, 2, 128, 8, 256, 96
PROMPT_LEN = 12
CHAIN = 6
# EAGLE's topK_genrate (depth, top_k, total_tokens): EAGLE counts total_tokens with the root and runs `depth` head
# forwards after the root's, so its trees are depth + 1 drafts deep: ours is DynamicShape(depth + 1, top_k, total - 1)
TREES = [(5, 8, 60), (3, 4, 16), (6, 10, 50)]
MEDUSA_HEADS = 5  # Medusa's release loader forces medusa_num_heads = 5 (medusa_model.py:143, "TODO: fix the uploaded")
MC_SIM_7B_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
                [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8],
                [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0],
                [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0],
                [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1],
                [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0]]  # medusa/model/medusa_choices.py:1


def target_config() -> dict:
    """Fields every transformers version in play (4.34.1 Medusa, 4.53.3 EAGLE, 5.19 speculators, 5.24 specbench)
    reads the same way: top-level rope_theta and rope_scaling null (5.x folds them into rope_parameters), no head_dim
    (4.34 has none; H / heads everywhere), torch_dtype."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
            "num_hidden_layers": L_T, "num_attention_heads": HEADS, "num_key_value_heads": KV, "vocab_size": V,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
            "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "pretraining_tp": 1,
            "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
            "torch_dtype": "float32", "use_cache": True}


def build_target(folder: Path) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in target_config().items() if k != "torch_dtype"}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.1) if "norm" in name else p.normal_(0, 0.08)  # spread-out hidden states and logits
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    # EAGLE's Model(load_emb=True) finds the embedding through model.safetensors.index.json
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model.safetensors" for k in state}}, indent=1))
    (folder / "config.json").write_text(json.dumps(target_config(), indent=1))
    loaded = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, state[k]), k
    return loaded


class Keep:
    def keep_drafting(self, i, q, x):
        return True


def drafting(L: int, cap: int, **sampling) -> Drafting:
    return Drafting([L], [cap], [Keep()], [None], Sampler(SamplingParams(**(sampling or {"temperature": 0.0})), V),
                    frozenset())


class Capture:
    """A grower wrapper that keeps the grown tree (node ranks, scores) of the last proposal."""

    def __init__(self, g):
        self.g, self.depth = g, g.depth

    def children(self, t, node, q):
        return self.g.children(t, node, q)

    def expand(self, t, new):
        return self.g.expand(t, new)

    def select(self, t, cap):
        self.t = t
        self.keep = self.g.select(t, cap)
        return self.keep


def token_paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for x, a in zip(tokens, parents):
        out.append((out[a] if a >= 0 else []) + [x])
    return out


def main(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    target = build_target(work / "target")
    target.name_or_path = str((work / "target").resolve())  # named in the heads' configs (verifier, base model)
    torch.manual_seed(1)
    prompt = torch.randint(3, V, (PROMPT_LEN,)).tolist()
    with torch.no_grad():
        out = target(torch.tensor([prompt]), output_hidden_states=True)
    hs = out.hidden_states
    root = int(out.logits[0, -1].argmax())  # the target's greedy token: committed = prompt + [root]
    ids = prompt + [root]
    L = len(ids)
    tensors: dict[str, torch.Tensor] = {"target_logits": out.logits[0], "target_last_hidden": hs[L_T][0]}
    res: dict = {"prompt": prompt, "root": root, "ids": ids}

    # ---- EAGLE-3 head
    layers = eagle3_layers(L_T)  # (2, 4, 5): the inputs of decoder layers 2, L//2, L-3
    torch.manual_seed(2)
    head = Eagle3Head(Eagle3Config(H, I, HEADS, KV, V, DV, layers, rms_norm_eps=1e-5))
    draft_ids = torch.sort(torch.randperm(V)[:DV]).values
    head.set_vocab(draft_ids)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.normal_(1.0, 0.2) if "norm" in name else p.normal_(0, 1.0 if name == "lm_head.weight" else 0.1)
    head.attach(target.get_input_embeddings()).eval()
    save_head(head, work / "head-eagle3", "eagle3", target)
    save_head(head, work / "head-speculators", "speculators", target, target.get_input_embeddings())
    for fmt in ("eagle3", "speculators"):  # specbench reads its own folders back unchanged
        _, back, _ = read_head(work / f"head-{fmt}", L_T)
        for k, v in head.state_dict().items():
            assert torch.equal(back.state_dict()[k], v), (fmt, k)
    feats = torch.stack([hs[k][0] for k in layers])  # [3, T, H]
    flat = feats.transpose(0, 1).flatten(1)  # [T, 3H]: low, middle, high
    tensors["eagle3_feats"] = flat[: L - 1].contiguous()
    res["eagle3_layers"], res["draft_ids"] = list(layers), draft_ids.tolist()
    # (a) step 0: the head over the committed pairs (f_t, x_{t+1}), t = 0..L-2, causal, no cache
    n = L - 1
    with torch.no_grad():
        o = head.step(flat[None, :n], torch.tensor([ids[1:]]), torch.arange(n)[None],
                      torch.ones((1, n, n), dtype=torch.bool).tril())
        tensors["eagle3_step0_out"] = o[0]
        tensors["eagle3_step0_logits"] = head.logits(o)[0]
    # (b) greedy chain of CHAIN drafts (Eagle3Draft, temperature 0)
    src = Eagle3Draft(DraftHead(head, "fidelity").new_state(1))
    src.observe(feats[:, : L - 1])
    [prop] = src.propose(torch.tensor([ids + [0] * 16]), drafting(L, CHAIN))
    assert prop.is_chain and len(prop) == CHAIN
    res["eagle3_chain"] = prop.tokens
    tensors["eagle3_chain_q"] = prop.q  # [6, V]: q of draft i (softmax at T = 1 over the target vocabulary)
    # (c) EAGLE-2 dynamic trees
    res["eagle3_trees"] = []
    for depth, top_k, total in TREES:
        g = Capture(DynamicShape(depth + 1, top_k, total - 1))
        src = Eagle3Draft(DraftHead(head, "fidelity").new_state(1), g)
        src.observe(feats[:, : L - 1])
        [prop] = src.propose(torch.tensor([ids + [0] * 128]), drafting(L, 1024))
        res["eagle3_trees"].append({"eagle": [depth, top_k, total], "ours": [depth + 1, top_k, total - 1],
                                    "tokens": prop.tokens, "parents": prop.parents,
                                    "paths": token_paths(prop.tokens, prop.parents),
                                    "scores": [g.t.scores[j] for j in g.keep], "grown": len(g.t.tokens)})

    # (c') the first tree again under sampling settings: specbench grows it from the processed q (temperature, top-p),
    # EAGLE's topK_genrate always from the head's raw log-softmax (T = 1), whatever its logits_processor
    res["eagle3_trees_sampling"] = []
    depth, top_k, total = TREES[0]
    for sampling in ({"temperature": 0.5}, {"temperature": 1.0, "top_p": 0.8}):
        g = Capture(DynamicShape(depth + 1, top_k, total - 1))
        src = Eagle3Draft(DraftHead(head, "fidelity").new_state(1), g)
        src.observe(feats[:, : L - 1])
        [prop] = src.propose(torch.tensor([ids + [0] * 128]), drafting(L, 1024, **sampling))
        res["eagle3_trees_sampling"].append({"eagle": [depth, top_k, total], "sampling": sampling,
                                             "paths": token_paths(prop.tokens, prop.parents)})

    # ---- Medusa heads
    torch.manual_seed(3)
    medusa = MedusaHeads(MedusaConfig(MEDUSA_HEADS, 1, H, V))
    with torch.no_grad():
        for p in medusa.parameters():
            p.normal_(0, 0.3)
    medusa.eval()
    save_head(medusa, work / "head-medusa", "medusa", target)
    with torch.no_grad():
        tensors["medusa_logits"] = medusa(hs[L_T][0, L - 2])  # [k, V] at the last prompt position (final-normed)
    paths = check_paths("medusa", MC_SIM_7B_63)
    g = Capture(StaticShape(paths))
    src = MedusaDraft(DraftHead(medusa, "fidelity").new_state(1), g)
    src.observe(hs[L_T][0, : L - 1][None])
    [prop] = src.propose(torch.tensor([ids + [0] * 128]), drafting(L, 1024))
    res["medusa_tree"] = {"tokens": prop.tokens, "parents": prop.parents,
                          "rank_paths": [list(g.t.path(j)) for j in g.keep],
                          "token_paths": token_paths(prop.tokens, prop.parents)}
    tensors = {k: v.detach().float().contiguous() for k, v in tensors.items()}
    save_file(tensors, work / "ours.safetensors")
    (work / "ours.json").write_text(json.dumps(res, indent=1))
    print(f"wrote {work}: target, head-eagle3, head-speculators, head-medusa, ours.json, ours.safetensors")
    print(f"prompt {prompt}; target greedy token {root}; EAGLE-3 chain {res['eagle3_chain']}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fidelity-work"))
