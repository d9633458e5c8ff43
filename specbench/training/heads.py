"""`task=distill task.kind=eagle3|medusa`: train a dependent head on the target's own samples and hidden states.

    python run.py task=distill task.kind=eagle3        toy pair, data results/synth/toy/toy_train/default
    python run.py task=distill task.kind=medusa

The loop, data, optimiser, checkpoints and loss positions (P - 1 .. len - 2) are task=distill's; this module gives its
trainer for heads: the target's features of each batch (specbench.training.features: hidden states cached once, or
the frozen target on the fly) and the head's loss terms. The loss of a batch is the sum of its weighted terms (each
step's or head's) over its loss positions.

EAGLE-3 (specbench.models.eagle3) with its training-time test, J = task.ttt_steps steps: step 0 reads the target's
features f_t and tokens x_{t+1} at every position t; step j reads at index t the head's step-(j-1) output at t as its
feature and x_{t+j+1} as its token, i.e. it drafts the (j+1)-th token after the committed position t, at rotary
position t + j, attending to step 0's keys at positions <= t (the committed ones) and to its own index's keys of
steps 1..j (its earlier drafts), which is the attention of the (j+1)-th draft at inference. Step j's loss at t is
KL(p || q) with p the target's distribution of x_{t+j+2} (its logits at t + j + 1) restricted to the draft vocabulary
and renormalised (EAGLE-3 trains on the target's softmax over the draft vocabulary), weighted 0.8^j, at the positions
whose target argmax is in the draft vocabulary (EAGLE-3's mask). The draft vocabulary is the task.draft_vocab most
frequent tokens of the training sequences (ties: lower id; filled with the lowest unseen ids), as EAGLE-3 chooses its
32k. Initialisation: the final norm and the head's rows from the target's final norm and lm_head; fc and the layer as
torch initialises them.
Medusa-1 (specbench.models.medusa), task.medusa_heads heads of task.medusa_layers blocks: head i at position t learns
KL(p_{t+i} || q_i), p_{t+i} the target's distribution at position t + i (Medusa's self-distillation: the target's own
samples and distributions), weighted 0.8^(i-1); each head's output layer starts as the target's lm_head and its
blocks as the identity (Medusa's initialisation).
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specbench.common.errors import InputError
from specbench.models.eagle3 import Eagle3Config, Eagle3Head
from specbench.models.heads import FORMATS, Head, save_head
from specbench.models.medusa import MedusaConfig, MedusaHeads
from specbench.models.pairs import Pair, input_embedding
from specbench.runs.job import example_seed
from specbench.training.features import Features

DECAY = 0.8  # per-step (EAGLE-3) and per-head (Medusa) loss weight


def kl_per_position(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax p || softmax q) in nats per row: [N, V], [N, V] -> [N]."""
    logp, logq = F.log_softmax(p_logits.float(), -1), F.log_softmax(q_logits.float(), -1)
    return F.kl_div(logq, logp, log_target=True, reduction="none").sum(-1)


Term = tuple[float, torch.Tensor, torch.Tensor]  # (weight, target logits [N, V], student logits [N, V]) of one step


def weighted_kl(terms: Iterator[Term], empty: torch.Tensor) -> torch.Tensor:
    """Every term's weight x KL per position, concatenated [Σ N] (`empty`'s zero-length tensor for none)."""
    out = [w * kl_per_position(p, q) for w, p, q in terms]
    return torch.cat(out) if out else empty.new_zeros(0)


def draft_vocabulary(seqs: list[tuple[list[int], int]], size: int, vocab: int) -> torch.Tensor:
    """The `size` most frequent token ids of the sequences (ties: lower id), then the lowest unseen ids, sorted."""
    counts = Counter(t for ids, _ in seqs for t in ids if t < vocab)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    seen = set(ranked)
    ranked += [t for t in range(vocab) if t not in seen][: size - len(ranked)]
    return torch.tensor(sorted(ranked))


def ttt_outputs(head: Eagle3Head, feats: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, steps: int
                ) -> list[torch.Tensor]:
    """The head's outputs [B, T, H] of each training-time-test step j < steps (index t: the (j+1)-th draft after the
    committed position t) from the target's features [B, T, 3 H_t], tokens ids and attention mask [B, T]."""
    B, T = ids.shape
    idx = torch.arange(T, device=ids.device)
    causal = (idx[None, :] <= idx[:, None])[None] & mask.bool()[:, None, :]  # [B, T, T] step 0's keys
    eye = torch.eye(T, dtype=torch.bool, device=ids.device)[None].expand(B, T, T)
    assert head.embed is not None, "attach() the target's input embedding first"
    f = head.fc(feats)
    past: list[tuple[torch.Tensor, torch.Tensor]] = []
    out: list[torch.Tensor] = []
    for j in range(steps):
        tok = torch.cat([ids[:, j + 1 :], ids.new_zeros((B, j + 1))], 1)  # x_{t+j+1} at index t
        allowed = torch.cat([causal] + [eye] * j, -1)  # step 0's keys causal, steps 1..j (this one last) diagonal
        f = head.midlayer(head.embed(tok).to(f.dtype), f, head.rope(f, (idx + j)[None].expand(B, T)), allowed, past)
        out.append(f)
    return out


class HeadTrainer:
    """A trainable head and the frozen target of one distill run (the trainer interface of distill's loop)."""

    def __init__(self, pair: Pair, kind: str, task: dict[str, Any], train: list[tuple[list[int], int]],
                 features: Features, layers: tuple[int, ...]) -> None:
        self.kind, self.vocab, self.k = kind, pair.vocab_size, 1
        self.features, self.layers = features, layers
        if task.get("checkpointing"):
            raise InputError(f"task.checkpointing applies to drafters (distilled, sd2), not to {kind} heads (one block "
                             "per step or head): set task.checkpointing=false")
        self.format = task.get("format") or FORMATS[kind][0]
        if self.format not in FORMATS[kind]:
            raise InputError(f"task.format for {kind} must be one of {', '.join(FORMATS[kind])}, got {self.format!r}")
        lm_head = pair.target.get_output_embeddings().weight.detach().float()
        with torch.random.fork_rng(devices=[]):  # the initial weights are a function of task.seed alone
            torch.manual_seed(example_seed(int(task.get("seed", 0)), f"{kind}-init"))
            head = self.build(pair.target, kind, task, train, lm_head)
        self.student: Head = head.float().train()
        self.groups: list[dict[str, Any]] = [{"params": list(head.parameters()),
                                              "lr": float(task.get("head_lr") or task["lr"])}]
        self.params: list[torch.nn.Parameter] = self.groups[0]["params"]
        self.modules: list[torch.nn.Module] = [head]

    def build(self, target: PreTrainedModel, kind: str, task: dict[str, Any], train: list[tuple[list[int], int]],
              lm_head: torch.Tensor) -> Head:
        """The initial head of `kind` (module docstring: initialisation)."""
        tc = target.config.get_text_config()
        dev, V = target.device, lm_head.shape[0]
        head: Head
        if kind == "eagle3":
            self.steps = int(task.get("ttt_steps") or 1)
            size = min(int(task.get("draft_vocab") or self.vocab), self.vocab)
            rope = getattr(tc, "rope_parameters", None) or {}  # transformers 5 keeps the target's rotary base here
            theta = float(rope.get("rope_theta") or getattr(tc, "rope_theta", None) or 10000.0)  # EAGLE-3's default
            c = Eagle3Config(tc.hidden_size, tc.intermediate_size, tc.num_attention_heads,
                             tc.num_key_value_heads or tc.num_attention_heads, V, size, self.layers,
                             head_dim=getattr(tc, "head_dim", None), rms_norm_eps=tc.rms_norm_eps, rope_theta=theta,
                             max_position_embeddings=tc.max_position_embeddings, hidden_act=tc.hidden_act)
            head = Eagle3Head(c).to(dev)
            head.set_vocab(draft_vocabulary(train, size, self.vocab).to(dev))
            with torch.no_grad():
                head.lm_head.weight.copy_(lm_head[head.target_ids()])
                norm = getattr(getattr(target, "model", None), "norm", None)
                if norm is not None:
                    head.norm.weight.copy_(norm.weight.float())
            head.attach(copy.deepcopy(input_embedding(target)))  # its own: the target may be released
        elif kind == "medusa":
            n, blocks = int(task.get("medusa_heads") or 4), int(task.get("medusa_layers") or 1)
            head = MedusaHeads(MedusaConfig(n, blocks, tc.hidden_size, V)).to(dev)
            with torch.no_grad():
                for layer in head.vocabulary_layers():
                    layer.weight.copy_(lm_head)
            self.steps = n
        else:
            raise InputError(f"unknown head kind {kind!r}; valid: eagle3, medusa")
        return head

    def loss(self, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor, P: torch.Tensor,
             delta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Weighted KL per loss position and step [N] for one batch (ids, mask, where [B, T]; P, δ unused)."""
        return weighted_kl(self.terms(ids, mask, where, P, delta, rows), P)

    def terms(self, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor, P: torch.Tensor,
              delta: torch.Tensor, rows: torch.Tensor) -> Iterator[Term]:
        """Each step's (EAGLE-3) or head's (Medusa) weighted pair of logits at its valid positions, one at a time."""
        dev = next(self.student.parameters()).device
        ids, mask, where = ids.to(dev), mask.to(dev), where.to(dev)
        out = self.features(ids, mask, rows)
        final = out.final.to(dev)
        p = self.features.logits(final).float()  # [B, T, V]
        if isinstance(self.student, MedusaHeads):  # kind medusa: the last hidden state, after the target's final norm
            return self.medusa_terms(final.float(), p, where)
        feats = out.states.to(dev).flatten(-2).float()  # [B, T, 3H]: the three layers' states side by side
        return self.eagle3_terms(feats, p, ids, mask, where)

    def eagle3_terms(self, feats: torch.Tensor, p: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                     where: torch.Tensor) -> Iterator[Term]:
        """The training-time test over J steps (module docstring): step j's (0.8^j, p, q) at its valid indices."""
        head, T = self.student, ids.shape[1]
        assert isinstance(head, Eagle3Head), "eagle3_terms trains an EAGLE-3 head"
        in_vocab = head.t2d[p.argmax(-1)]  # [B, T]: EAGLE-3 trains where the target's argmax is a draft token
        p = p[..., head.target_ids()]  # [B, T, V_d]: renormalised by the softmax in kl_per_position
        for j, o in enumerate(ttt_outputs(head, feats, ids, mask, self.steps)):
            n = T - j - 1  # indices whose target position t + j + 1 exists
            valid = where[:, j + 1 :] & in_vocab[:, j + 1 :]  # [B, n]: t + j + 1 predicts a continuation token
            if valid.any():
                yield DECAY**j, p[:, j + 1 :][valid], head.logits(o[:, :n])[valid]

    def medusa_terms(self, h: torch.Tensor, p: torch.Tensor, where: torch.Tensor) -> Iterator[Term]:
        """Head i's (0.8^(i-1), p_{t+i}, q_i(h_t)) at each valid position."""
        logits = self.student(h)[..., : self.vocab]  # [B, T, k, V]
        for i in range(1, self.steps + 1):
            valid = where[:, i:]  # [B, T - i]: position t + i predicts a continuation token
            if valid.any():
                yield DECAY ** (i - 1), p[:, i:][valid], logits[:, : -i, i - 1][valid]

    def state(self) -> dict[str, Any]:
        return {"head": self.student.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["head"])

    def save(self, run_dir: Path, pair: Pair) -> None:
        """head/ in task.format (the EAGLE-3 release layout, speculators, or Medusa's)."""
        embed = self.student.embed if isinstance(self.student, Eagle3Head) and self.format == "speculators" else None
        save_head(self.student, run_dir / "head", self.format, pair.target, embed)
