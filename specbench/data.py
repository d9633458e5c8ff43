"""Datasets: the registry of evaluators, examples, and the limit / shard selection."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbench.registry import Registry

DATASETS: Registry = Registry("dataset")


@dataclass
class Example:
    """One benchmark item: `prompt` is a user message (str) or a list of chat messages.

    Multi-turn items (MT-bench) also set `turns`, the user turns in order: the runner asks turn k
    after the model's own answers to turns 1..k-1 (`prompt` is then the first turn).
    """

    id: str
    prompt: str | list[dict[str, str]]
    reference: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    turns: list[str] | None = None


class Evaluator:
    """Base evaluator: examples -> prompts -> scores. One subclass per benchmark under evaluators/."""

    name = "base"
    stop_strings: tuple[str, ...] = ()

    def __init__(self, **options: Any) -> None:
        if options:
            raise ValueError(f"dataset {self.name!r} got unknown options {sorted(options)}")

    def examples(self) -> list[Example]:
        raise NotImplementedError

    def score(self, example: Example, output: str) -> dict[str, Any]:
        """Task metrics for one output; `score` is the headline number (None: not scored)."""
        return {"score": None}


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    """'i/n' -> (i, n) with 0 <= i < n."""
    if shard in (None, ""):
        return None
    try:
        i, n = (int(s) for s in str(shard).split("/"))
    except ValueError:
        raise ValueError(f"dataset.shard must look like 'i/n' (e.g. 0/4), got {shard!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"dataset.shard {shard!r}: need 0 <= i < n")
    return i, n


def select(examples: list[Example], limit: int | None, shard: str | None) -> list[Example]:
    """The first `limit` examples (in the dataset's fixed order), then every n-th from i for shard i/n."""
    if limit is not None:
        if limit < 1:
            raise ValueError(f"dataset.limit must be >= 1 or null, got {limit}")
        examples = examples[:limit]
    s = parse_shard(shard)
    if s:
        examples = examples[s[0] :: s[1]]
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise ValueError("dataset has duplicate example ids; results could not be resumed safely")
    return examples


def build_dataset(cfg: dict) -> Evaluator:
    """The evaluator named cfg['name'], built with the dataset options it understands."""
    import evaluators  # noqa: F401  (import registers)

    skip = {"name", "limit", "shard", "system_prompt", "chat_template"}
    return DATASETS.get(cfg["name"])(**{k: v for k, v in cfg.items() if k not in skip})
