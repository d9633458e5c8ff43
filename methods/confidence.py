"""`confidence`: transformers' assistant confidence stop with its ROC threshold update, native
(GammaTune's "AssistantThreshold"; DISCO without a classifier)."""

from __future__ import annotations

import logging

import numpy as np
import torch

from specbench.common.options import real
from specbench.decoding.policy import POLICIES, Policy, check_gamma
from specbench.decoding.records import IterationRecord

log = logging.getLogger(__name__)

MIN_SAMPLES = 5  # transformers refits only with more than 5 labelled drafts
FN_COST = 3.0  # cost = FPR + 3·FNR: a false negative (stopping before a good draft) costs 3x a false positive


def add_labels(probs: list[float], labels: list[int], accepted: int) -> None:
    """Label this iteration's drafts in place (probs holds every draft's q_i(x_i), labels the earlier ones'):
    accepted 1, the first rejected 0, later ones dropped (transformers' update_candidate_strategy)."""
    labels.extend([1] * accepted)
    if len(probs) > len(labels):
        labels.append(0)
    del probs[len(labels):]


def roc_threshold(probs: list[float], labels: list[int]) -> float | None:
    """argmin over the ROC curve of FPR + 3·FNR (roc_curve, as transformers); None with <= 5 samples or one label."""
    if len(probs) <= MIN_SAMPLES or not {0, 1}.issubset(labels):
        return None
    from sklearn.metrics import roc_curve

    fpr, tpr, thresholds = roc_curve(labels, probs)
    costs = fpr + FN_COST * (1 - tpr)
    return float(thresholds[np.argmin(costs)])  # the first minimum, as np.argmin in transformers


@POLICIES.register("confidence")
class Confidence(Policy):
    """Draft up to `gamma` tokens; stop after a token whose draft probability q_i(x_i) < threshold.

    Matches transformers' AssistedCandidateGenerator (generation/candidate_generator.py) and ConfidenceCriteria
    (stopping_criteria.py), the same in 5.23 and 5.24 and equal to hf_assisted iteration for iteration on 5.24.0
    (tests/test_fidelity.py), with num_assistant_tokens=gamma, schedule "constant":
      - the probability compared is q_i(x_i), the softmax of the draft's processed scores at the drafted token
        (softmax at T=1 when greedy): the engine's q_i; the test is strict, the token just drafted kept and verified;
      - after verification accepted drafts get label 1, the first rejected one 0, later ones are dropped; the
        samples accumulate over the call; a drafted EOS is a sample too, as in transformers;
      - after every iteration with more than 5 samples and both labels, the threshold becomes the ROC threshold
        minimising FPR + 3·FNR; roc_curve's first threshold, +inf (every draft then stops after one token), is kept
        as transformers keeps it;
      - threshold 0 disables the stop and the update (transformers tests its truth); `roc: false` keeps the stop at
        a fixed threshold (transformers without scikit-learn).
    Persistence: despite transformers' docs, 5.24 fits the threshold on a per-call deepcopy of the assistant's
    generation_config and candidate generator, so threshold and samples restart every call; here every example.
    Difference: transformers' softmax runs over the draft's whole (possibly padded) vocab, ours over the tokenizer's
    range (hf_assisted suppresses the padding ids, which makes them equal).
    """

    def __init__(self, gamma: int = 20, threshold: float = 0.4, roc: bool = True) -> None:
        self.max_window = check_gamma(gamma)
        self.threshold0 = real(threshold, "method.threshold", low=0, high=1)
        self.roc = bool(roc)
        self.reset()

    def reset(self) -> None:
        self.threshold = self.threshold0
        self.probs: list[float] = []  # q_i(x_i) of drafts, labelled or pending
        self.labels: list[int] = []  # 1 accepted, 0 first rejected

    def window(self) -> int:
        return self.max_window

    def keep_drafting(self, i: int, q_i: torch.Tensor, token: int) -> bool:
        p = float(q_i[token])
        if self.threshold and self.roc:
            self.probs.append(p)
        return not p < self.threshold  # stop after this token when p < threshold

    def update(self, record: IterationRecord) -> None:
        if not (self.threshold and self.roc):
            return
        add_labels(self.probs, self.labels, record.accepted)  # probs holds q_i(x_i) of every draft, EOS included
        best = roc_threshold(self.probs, self.labels)
        if best is not None:
            self.threshold = best

    def state(self) -> dict[str, float]:
        return {"threshold": self.threshold, "samples": len(self.labels)}
