"""`task=distill`: fine-tune the drafter on the verifier's samples with KL(π_V || π_D), for `distilled` and `sd2`
(and train the heads of `eagle3` and `medusa` in the same loop: specbench.training.heads).

    python run.py task=distill task.kind=distilled           toy pair, data results/synth/toy/toy_train/default
    python run.py task=distill task.kind=sd2 task.seed=1     + SD² steering (specbench.models.steering)

Data (SD² 3.3): a finished `task=synth` folder (`task.data`), each row prompt_ids + token_ids cut to
`task.max_length` tokens (paper: 256), the last `task.val_n` rows held out for the validation KL.

Loss: KL(π_V || π_D) = sum_v π_V(v) (log π_V(v) - log π_D(v)), temperature 1, averaged over the positions that
predict a continuation token (the prompt's last position up to the second-to-last token; the prompt itself is never
drafted). π_V = softmax(lm_head(h)) from the verifier's final hidden state h, cached once with sd2's steering layers
(task.features, specbench.training.features: the verifier is released before training) or computed on every batch
(task.features=null); its distributions are never stored (V floats per token do not scale to real vocabularies).
Logits past the shared tokenizer range (embedding padding) are dropped.
`sd2`: steering hooks on the drafter, one offset δ ~ U[1, task.k] per sequence; W_hml, W_s and the whole drafter are
trained, the verifier stays frozen.

Optimiser (A.3): AdamW (β = 0.9, 0.999; weight decay `task.weight_decay`, which the paper does not give), learning
rate warmed up linearly from lr/10 to lr over `task.warmup_steps`, then cosine to lr/10 at the last step (the paper's
"starting and ending at 1/10th the learning rate"; torch's LambdaLR), gradient-norm clipping at 0.5. Steps:
`task.epochs` x ceil(train rows / batch_size), or `task.max_steps`; `task.accumulate` micro-batches a step.
`task.autocast: bfloat16` runs the forwards under accelerate's mixed precision with float32 drafter weights (the
paper's setting on GPU); default off. `task.checkpointing` recomputes the drafter's activations in the backward. The
loop, on one process or many: specbench.training.loop.

sd2's steering weights may have their own learning rate `task.steering_lr` (default: lr, the paper's single rate). An
Adam step moves each W_s entry by up to about lr, so each bias entry by up to lr * sum_i |g_i|, and the verifier's
residual states are large (toy pair, one training sequence: mean norms 110, 116, 128 at layers 3, 4, 6, |g| = 162 in
128 dimensions). Measured on the toy pair (2000 synth rows, 714 steps, seed 0): with lr = steering_lr = 1e-3 the
held-out KL first rose (0.136 at step 0, 0.165 at step 50), then ended below the distilled drafter's (0.0902 vs
0.0926); with steering_lr = 2e-5 it did not rise, but removing the steering afterwards barely changed the drafter's
greedy predictions, i.e. the steering had learnt little.

Checkpoints: every `task.save_every` steps the main process writes checkpoint.pt (the trainer's state, optimiser,
scheduler, step, log, every process's RNG states) atomically and a rerun, on as many processes, resumes from it; data
order and δ are functions of (seed, step), so a resumed run ends in the state of an uninterrupted one. The end writes the trainer's weights
(Distiller.save), train_log.jsonl and last distill.json, whose presence marks a finished run.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Protocol

import torch
from accelerate import Accelerator
from omegaconf import DictConfig
from safetensors.torch import save_file
from transformers import PreTrainedModel

from specbench.common.errors import InputError
from specbench.runs import provenance
from specbench.runs.identity import TASK_RESUMABLE
from specbench.models.pairs import Pair, free_pairs, load_pair, resolve_device
from specbench.common.configs import plain
from specbench.common.files import atomic_folder, atomic_path, write_json_atomic, write_text_atomic
from specbench.common.progress import switch_progress
from specbench.runs.job import example_seed
from specbench.runs.runner import TASKS, output_dir
from specbench.runs.validation import set_threads
from specbench.models.drafters import INFO, KINDS, verifier_identity
from specbench.models.heads import KINDS as HEAD_KINDS, eagle3_layers
from specbench.training import loop
from specbench.training.curve import plot_curve
from specbench.training.features import Cached, Features, Seqs, check_folder, make_batch, shell, target_features
from specbench.training.heads import HeadTrainer, Term, kl_per_position, weighted_kl
from specbench.models.steering import (SteeredDrafter, Steering, check_layers, check_swiglu, default_layers,
                                       training_steering)
from specbench.training.synth import check_task_resume, read_synth, task_record

log = logging.getLogger(__name__)

CHECKPOINT, LOG = "checkpoint.pt", "train_log.jsonl"


def sequences(rows: list[dict], max_length: int) -> list[tuple[list[int], int]]:
    """(prompt + continuation ids cut to max_length, prompt length P) for rows with a continuation token left."""
    out = [((r["prompt_ids"] + r["token_ids"])[:max_length], len(r["prompt_ids"])) for r in rows]
    return [(ids, P) for ids, P in out if len(ids) > P]


class Trainer(Protocol):
    """What distill's loop drives: Distiller (a drafter) or specbench.training.heads.HeadTrainer (a head)."""

    k: int  # δ ~ U[1, k] per sequence (sd2; 1 otherwise)
    groups: list[dict[str, Any]]  # the optimiser's parameter groups
    params: list[torch.nn.Parameter]  # every trained parameter (gradient clipping)
    modules: list[torch.nn.Module]  # the modules that hold them (what DDP synchronises)

    @property
    def student(self) -> torch.nn.Module: ...
    def loss(self, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor, P: torch.Tensor,
             delta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor: ...
    def terms(self, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor, P: torch.Tensor,
              delta: torch.Tensor, rows: torch.Tensor) -> Iterator[Term]: ...
    def state(self) -> dict[str, Any]: ...
    def load_state(self, state: dict[str, Any]) -> None: ...
    def save(self, run_dir: Path, pair: Pair) -> None: ...


class Distiller:
    """The trainable drafter (plus steering for sd2) of one distill run, on the verifier's features."""

    def __init__(self, pair: Pair, kind: str, task: dict[str, Any], features: Features,
                 layers: tuple[int, ...]) -> None:
        self.kind, self.features, self.k = kind, features, int(task["k"])
        self.student: PreTrainedModel = copy.deepcopy(pair.model("draft")).float().train()
        if task.get("checkpointing"):  # activations recomputed in the backward (the steering stays set until then)
            self.student.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        self.steered: SteeredDrafter | None = None
        self.groups: list[dict[str, Any]] = [{"params": list(self.student.parameters()), "lr": float(task["lr"])}]
        if kind == "sd2":
            mlps = check_swiglu(self.student)
            steering = Steering(pair.target.config.get_text_config().hidden_size, len(mlps),
                                mlps[0].up_proj.out_features, layers)
            self.steered = SteeredDrafter(self.student, steering.to(self.student.device))
            lr = float(task.get("steering_lr") or task["lr"])
            self.groups.append({"params": list(steering.parameters()), "lr": lr})
        self.params: list[torch.nn.Parameter] = [p for g in self.groups for p in g["params"]]
        self.modules: list[torch.nn.Module] = [self.student, *([self.steered.steering] if self.steered else [])]

    def loss(self, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor, P: torch.Tensor,
             delta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """KL(π_V || π_D) per loss position [N] for one batch (δ [B] is used by sd2 only)."""
        return weighted_kl(self.terms(ids, mask, where, P, delta, rows), P)

    def terms(self, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor, P: torch.Tensor,
              delta: torch.Tensor, rows: torch.Tensor) -> Iterator[Term]:
        """The one term (1, π_V's logits, π_D's) at the loss positions. The steering positions stay set after the
        forward (a checkpointed backward recomputes it); the next batch replaces them."""
        sdev = self.student.device
        out = self.features(ids, mask, rows)
        where = where.to(sdev)
        p_logits = self.features.logits(out.final.to(sdev)[where])
        if self.steered is not None:
            g = training_steering(self.steered.steering, out.states.float().to(sdev), delta.to(sdev), P.to(sdev))
            self.steered.set_positions(g)
        q_logits = self.student(input_ids=ids.to(sdev), attention_mask=mask.to(sdev)).logits[..., : p_logits.shape[-1]]
        yield 1.0, p_logits, q_logits[where]

    def state(self) -> dict[str, Any]:
        """Trainable weights."""
        return {"drafter": self.student.state_dict(),
                "steering": self.steered.steering.state_dict() if self.steered else None}

    def load_state(self, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["drafter"])
        if self.steered:
            self.steered.steering.load_state_dict(state["steering"])

    def save(self, run_dir: Path, pair: Pair) -> None:
        """drafter/ (save_pretrained + tokenizer), for sd2 steering.safetensors + steering.json."""
        with atomic_folder(run_dir / "drafter", replace=True) as tmp:
            self.student.save_pretrained(tmp)
            pair.tokenizer.save_pretrained(tmp)
        if self.steered:
            s = self.steered.steering
            with atomic_path(run_dir / "steering.safetensors") as tmp:
                save_file({k: v.contiguous() for k, v in s.state_dict().items()}, tmp)
            write_json_atomic(run_dir / "steering.json", s.config())


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Multiplier of each group's lr (SD² A.3): 0.1 + 0.9 step/warmup during warm-up, then
    0.1 + 0.9 (1 + cos(π t)) / 2 with t = (step - warmup) / (steps - warmup): from 1 down to 0.1."""
    if step < warmup:
        return 0.1 + 0.9 * step / warmup
    t = min(1.0, (step - warmup) / max(1, steps - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))


def batch_indices(n: int, bs: int, step: int, seed: int) -> list[int]:
    """Training rows of `step`: epoch = step // ceil(n / bs), shuffled from (seed, epoch)."""
    per_epoch = math.ceil(n / bs)
    epoch, b = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(example_seed(seed, f"epoch-{epoch}")))
    return order[b * bs : (b + 1) * bs].tolist()


def deltas(n: int, k: int, seed: int, key: str) -> torch.Tensor:
    """n offsets δ ~ U[1, k] from (seed, key)."""
    return torch.randint(1, k + 1, (n,), generator=torch.Generator().manual_seed(example_seed(seed, key)))


@torch.no_grad()
def validation(d: Trainer, val: list[tuple[list[int], int]], first: int, bs: int, pad: int, seed: int
               ) -> dict[str, float | list[float]]:
    """On the held-out rows (fixed δ per sequence; val's rows are first, first + 1, ... of the data): `val_kl`, the
    loss per loss position, and `val_top1`, per term (an EAGLE-3 step, a Medusa head; one for a drafter) the share of
    its positions where the student's argmax is the target's (restricted to the draft vocabulary for EAGLE-3): the
    greedy acceptance of that draft, given the earlier ones were accepted."""
    d.student.eval()
    total, count, agree, seen = 0.0, 0, Counter[int](), Counter[int]()
    for b in range(0, len(val), bs):
        ids, mask, where, P = make_batch(val[b : b + bs], pad)
        rows = torch.arange(first + b, first + b + len(P))
        for j, (w, p, q) in enumerate(d.terms(ids, mask, where, P, deltas(len(P), d.k, seed, f"val-{b}"), rows)):
            total += w * kl_per_position(p, q).double().sum().item()
            agree[j] += int((p.argmax(-1) == q.argmax(-1)).sum())
            seen[j] += len(p)
        count += int(where.sum())
    d.student.train()
    return {"val_kl": total / max(1, count), "val_top1": [agree[j] / seen[j] for j in sorted(seen)]}


def save_atomic(obj: object, path: Path) -> None:
    """torch.save via atomic_path (a crash mid-save leaves the previous checkpoint)."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def training_data(task: dict[str, Any], pair_cfg: dict[str, Any]
                  ) -> tuple[list[tuple[list[int], int]], list[tuple[list[int], int]]]:
    """(train, held-out) sequences of the synth folder task.data, checked to come from this pair."""
    rows, synth_record = read_synth(task["data"])
    if synth_record["config"]["pair"] != pair_cfg:
        raise InputError(f"synth data {task['data']} was sampled from pair {synth_record['config']['pair']['name']!r} "
                         f"with another configuration than this run's pair {pair_cfg['name']!r}")
    seqs, val_n = sequences(rows, int(task["max_length"])), int(task["val_n"])
    if not 0 < val_n < len(seqs):
        raise InputError(f"task.val_n must be in 1..{len(seqs) - 1} (the data has {len(seqs)} usable rows), "
                         f"got {val_n}")
    return seqs[:-val_n], seqs[-val_n:]


def restore(path: Path, d: Trainer, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler,
            n_train: int, process: int, processes: int) -> tuple[int, list[dict[str, Any]], float]:
    """Load checkpoint.pt into the weights, optimiser, scheduler and this process's RNG; returns (step, log,
    seconds)."""
    ck = torch.load(path, map_location="cpu", weights_only=True)  # load_state copies onto the weights' device
    if ck["train_rows"] != n_train:
        raise InputError(f"{path} was trained on {ck['train_rows']} rows, the data now has {n_train}; refusing to "
                         "resume on other data")
    if ck["processes"] != processes:
        raise InputError(f"{path} was written by a run on {ck['processes']} process(es); resume it on as many (this "
                         f"run has {processes}), or delete it to start again")
    loop.set_rng_states(ck["rng"][process])
    d.load_state(ck["weights"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])
    return ck["step"], ck["log"], ck["seconds"]


def target_layers(kind: str, task: dict[str, Any], L: int) -> tuple[int, ...]:
    """The target's hidden_states indices the trainer reads: sd2's steering layers, an EAGLE-3 head's, else none."""
    default = {"sd2": default_layers, "eagle3": eagle3_layers}.get(kind)
    return () if default is None else check_layers(task.get("layers") or default(L), L, default, kind)


def trainer(acc: Accelerator, pair: Pair, task: dict[str, Any], train: Seqs, val: Seqs, pad: int,
            progress: str | bool | None) -> tuple[Trainer, Features, Pair]:
    """The run's trainer on the target's features (features.target_features), and the pair it goes on with: with
    cached features its target is an empty shell (features.shell), its draft gone, once the trainer has copied what it
    needs; the process's cache of loaded pairs lets go of them, so their weights are freed."""
    kind = task["kind"]
    layers = target_layers(kind, task, pair.target.config.get_text_config().num_hidden_layers)
    features = target_features(acc, pair, task.get("features"), train + val, layers, pad, int(task["batch_size"]),
                               progress)
    d: Trainer = (HeadTrainer(pair, kind, task, train, features, layers) if kind in HEAD_KINDS
                  else Distiller(pair, kind, task, features, layers))
    free_pairs()
    return d, features, replace(pair, target=shell(pair.target) if isinstance(features, Cached) else pair.target,
                                draft=None)


@TASKS.register("distill")
def run_distill(cfg: DictConfig, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Train a `distilled` or `sd2` drafter or an `eagle3` or `medusa` head on a synth folder, on one process or the
    processes of a torchrun / accelerate launch (specbench.training.loop); returns distill.json."""
    task = plain(cfg.task)
    kind, bs, seed = task["kind"], int(task["batch_size"]), int(task["seed"])
    if kind not in KINDS + HEAD_KINDS:
        raise InputError(f"unknown task.kind {kind!r}; valid: {', '.join(KINDS + HEAD_KINDS)}")
    run_dir, device = output_dir(out_dir), resolve_device(cfg.get("device", "auto"))
    acc = loop.accelerator(task.get("autocast"), device)
    record = task_record(cfg, device)
    if (run_dir / INFO).exists():
        check_task_resume(run_dir, record, resumable=TASK_RESUMABLE["distill"])
        log.info("%s: already trained (%s); delete it to train again", run_dir, INFO)
        return json.loads((run_dir / INFO).read_text())
    pair_cfg = plain(cfg.pair)
    train, val = training_data(task, pair_cfg)
    A = int(task.get("accumulate", 1))
    loop.check_split(bs, len(train), acc.num_processes, A)
    if task.get("features") is not None:
        check_folder(task["features"])  # before anything is written
    steps = int(task.get("max_steps") or int(task["epochs"]) * math.ceil(len(train) / bs))
    set_threads(cfg.get("threads", "auto"))
    pair = load_pair(pair_cfg, acc.device)
    if acc.is_main_process:
        check_task_resume(run_dir, record, resumable=TASK_RESUMABLE["distill"])
    pad = pair.pad_id([pair.target])
    d, features, pair = trainer(acc, pair, task, train, val, pad, cfg.get("progress", "auto"))
    opt = torch.optim.AdamW(d.groups, betas=(0.9, 0.999), weight_decay=float(task["weight_decay"]))
    warmup = min(int(task["warmup_steps"]), steps - 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, steps, warmup))  # every group
    model, opt = acc.prepare(loop.Objective(d.modules, d.loss), opt)  # the scheduler stays ours: one step a step

    def held_out() -> dict[str, float | list[float]]:
        """The held-out figures, on the main process alone (the one that logs them; the weights are the same
        everywhere)."""
        if not acc.is_main_process:
            return {"val_kl": float("nan")}
        with acc.autocast():
            return validation(d, val, len(train), bs, pad, seed)

    def batch_of(step: int) -> tuple[list[loop.Micro], int]:
        """This process's micro-batches of step's global batch, and the global batch's loss positions."""
        idx = batch_indices(len(train), bs, step, seed)
        delta = deltas(len(idx), d.k, seed, f"step-{step}")
        micros: list[loop.Micro] = [(*make_batch([train[idx[j]] for j in part], pad), delta[part],
                                     torch.tensor([idx[j] for j in part])) for part in loop.split(acc, len(idx), A)]
        return micros, sum(len(train[i][0]) - train[i][1] for i in idx)

    def save(at: loop.Progress, rngs: list) -> None:
        save_atomic({"step": at.step, "weights": d.state(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                     "log": at.history, "seconds": at.seconds, "train_rows": len(train), "rng": rngs,
                     "processes": acc.num_processes}, run_dir / CHECKPOINT)

    if (run_dir / CHECKPOINT).exists():
        at = loop.Progress(*restore(run_dir / CHECKPOINT, d, opt, sched, len(train), acc.process_index,
                                    acc.num_processes))
        log.info("%s: resuming at step %d of %d", run_dir, at.step, steps)
    else:
        at = loop.Progress(0, [{"step": 0, **held_out()}], 0.0)
    switch_progress(cfg.get("progress", "auto"))
    when = loop.Schedule(steps, int(task["eval_every"]), int(task["save_every"]))
    at = loop.fit(acc, model, opt, sched, d.params, batch_of, held_out, save, at, when, cfg.get("progress", "auto"),
                  f"distill {kind}")
    info = finish(run_dir, d, pair, task, at, record, device, len(train), len(val), acc.num_processes, steps,
                  features) if acc.is_main_process else {}
    acc.wait_for_everyone()  # the others return once the main process has written the results
    return info


def finish(run_dir: Path, d: Trainer, pair: Pair, task: dict[str, Any], at: loop.Progress, record: dict[str, Any],
           device: torch.device, n_train: int, n_val: int, processes: int, steps: int, features: Features
           ) -> dict[str, Any]:
    """Write the trained weights, train_log.jsonl and last distill.json (whose presence marks a finished run)."""
    d.save(run_dir, pair)
    write_text_atomic(run_dir / LOG, "".join(json.dumps(h) + "\n" for h in at.history))
    with atomic_path(run_dir / "curve.png") as tmp:
        plot_curve(tmp, at.history, f"{task['kind']} on {pair.name}")
    vals = [h["val_kl"] for h in at.history if "val_kl" in h]
    info = {"task": "distill", "kind": task["kind"], "pair": pair.name, "verifier": pair.target.name_or_path,
            "verifier_identity": verifier_identity(pair.target), "data": str(task["data"]), "train_rows": n_train,
            "val_rows": n_val, "steps": steps, "processes": processes,
            "features": features.meta if isinstance(features, Cached) else None, "val_kl_initial": vals[0],
            "val_kl_final": vals[-1], "val_top1_final": at.history[-1].get("val_top1"), "train_seconds": at.seconds, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **provenance.peak_memory(device), **record}
    write_json_atomic(run_dir / INFO, info)  # last: marks the run finished
    (run_dir / CHECKPOINT).unlink(missing_ok=True)
    log.info("distill %s: %d steps on %d process(es) in %.0f s; held-out KL %.4f -> %.4f", task["kind"], steps,
             processes, at.seconds, vals[0], vals[-1])
    return info
