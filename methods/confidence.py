"""`confidence`: transformers' assistant confidence stop with its ROC threshold update, native
(GammaTune's "AssistantThreshold"; DISCO without a classifier)."""

from __future__ import annotations

import logging

import numpy as np
import torch

from specbench.common.options import real
from specbench.decoding.method import METHODS, IterationRecord, Method, check_gamma, check_option

log = logging.getLogger(__name__)

MIN_SAMPLES = 5  # transformers refits only with more than 5 labelled drafts
FN_COST = 3.0  # cost = FPR + 3·FNR: a false negative (stopping before a good draft) costs 3x a false positive


def add_labels(probs: list[float], labels: list[int], accepted: int) -> None:
    """Label this iteration's drafts in place: accepted drafts 1, the first rejected 0, later ones dropped.

    `probs` already holds q_i(x_i) of every draft so far and `labels` one label per earlier draft
    (transformers' update_candidate_strategy: matches.extend([1] * n); a 0 if a draft is left
    unlabelled; probs cut to the labelled length).
    """
    labels.extend([1] * accepted)
    if len(probs) > len(labels):
        labels.append(0)
    del probs[len(labels):]


def roc_threshold(probs: list[float], labels: list[int]) -> float | None:
    """argmin over the ROC curve of FPR + 3·FNR (sklearn.metrics.roc_curve, as transformers), or None
    while there are at most 5 samples or only one label."""
    if len(probs) <= MIN_SAMPLES or not {0, 1}.issubset(labels):
        return None
    from sklearn.metrics import roc_curve

    fpr, tpr, thresholds = roc_curve(labels, probs)
    costs = fpr + FN_COST * (1 - tpr)
    return float(thresholds[np.argmin(costs)])  # the first minimum, as np.argmin in transformers


@METHODS.register("confidence")
class Confidence(Method):
    """Draft up to `gamma` tokens; stop after a token whose draft probability q_i(x_i) < threshold.

    Matches transformers' generation/candidate_generator.py, AssistedCandidateGenerator, and
    stopping_criteria.py, ConfidenceCriteria (the same code in 5.23 and 5.24; equal to hf_assisted iteration
    for iteration on 5.24.0, tests/test_fidelity.py) with num_assistant_tokens=gamma, schedule "constant":
      - the probability compared is q_i(x_i), the softmax of the draft's processed scores at the
        drafted token (temperature/top-k/top-p applied; softmax at T=1 when greedy): our engine's q_i;
      - the stop test is strict (p < threshold); the token just drafted is kept and verified;
      - every drafted token's probability is collected; after verification accepted drafts get label 1,
        the first rejected one 0, and later drafts are dropped (an iteration with all drafts accepted adds
        only 1s); the samples accumulate over the call;
      - after every iteration with more than 5 samples and both labels, the threshold becomes the ROC
        threshold minimising FPR + 3·FNR; roc_curve's first threshold is +inf (every draft then stops
        after one token), kept as transformers keeps it;
      - threshold 0 disables both the stop and the update (transformers tests the threshold's truth);
        `roc: false` keeps the stop at a fixed threshold (transformers does so without scikit-learn).
    Persistence: transformers' docs say the threshold persists across generate calls, but 5.24 fits it
    on a deepcopy of the assistant's generation_config and a candidate generator built per call, so
    threshold and samples restart every call; we do the same (per example).
    A drafted EOS is a sample too: the engine asks the policy about every drafted token, EOS included, so
    a drafted EOS that the target rejects after accepting every earlier draft adds (q(EOS), 0) as in
    transformers.
    Difference: transformers' softmax runs over the draft model's whole (possibly padded) vocab, ours
    over the tokenizer's range (hf_assisted suppresses the padding ids, which makes them equal).
    Rule `rejection` (built as `greedy` at temperature 0).
    """

    name = "confidence"

    def __init__(self, gamma: int = 20, threshold: float = 0.4, roc: bool = True, rule: str = "rejection",
                 **options) -> None:
        super().__init__(rule=rule, **options)
        self.max_window = check_gamma(self.name, gamma)
        self.threshold0 = check_option(self.name, real, threshold, "threshold", low=0, high=1)
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

    def policy_state(self) -> dict[str, float]:
        return {"threshold": self.threshold, "samples": len(self.labels)}
