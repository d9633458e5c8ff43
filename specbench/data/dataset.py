"""Datasets: the registry of evaluators, examples, and the limit / shard selection.

A dataset config (conf/dataset/*.yaml) is a `name`, the prompt keys (PROMPT_KEYS; conf/dataset_base/), its new-token
budget `max_new_tokens` (what decode.max_new_tokens: null runs with) and the options of its evaluator: the one
registered under its `evaluator` key (e.g. the generic `files`, a dataset with a YAML alone), else under its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from specbench.common.errors import InputError
from specbench.common.options import BUDGET_KEY, OptionError, check_options, choice, integer, shown, text
from specbench.common.registry import Registry, UnknownNameError
from specbench.data.sources import DataSourceError, NoLocalCopyError, Row, Source, load_source, read_local

__all__ = ["DATASETS", "NAME_KEYS", "PROMPT_KEYS", "SELECTION_KEYS", "Evaluator", "Example", "build_dataset",
           "check_prompt_keys", "check_selection", "evaluator_class", "parse_shard", "select",
           # re-exported: benchmarks (evaluators/, speed_local, training.synth) import their data sources from here
           "DataSourceError", "NoLocalCopyError", "Row", "Source", "load_source", "read_local"]

DATASETS: Registry = Registry("dataset", plugins="specbench.evaluators")


@dataclass
class Example:
    """One benchmark item: `prompt` is a user message (str) or a list of chat messages. Multi-turn items (MT-bench)
    also set `turns`, the user turns in order: the runner asks turn k after the model's own answers to turns 1..k-1
    (`prompt` is then the first turn)."""

    id: str
    prompt: str | list[dict[str, str]]
    reference: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    turns: list[str] | None = None


class Evaluator:
    """Base evaluator: examples -> prompts -> scores. One subclass per benchmark under evaluators/."""

    name = "base"
    stop_strings: tuple[str, ...] = ()
    meta_fields: tuple[str, ...] = ()  # the Example.meta keys the base `score` copies into each row

    def __init__(self, data_dir: str | None = None, **options: Any) -> None:
        if options:
            raise InputError(f"dataset {self.name!r} got unknown options {sorted(options)}")
        self.data_dir = data_dir  # local copies folder; None: the hub

    def examples(self) -> list[Example]:
        raise NotImplementedError

    def score(self, example: Example, output: str) -> dict[str, Any]:
        """Metrics of an output: `score` (None: unscored, with the meta_fields), if scored `reference`, `extracted`."""
        return {"score": None, **{k: example.meta[k] for k in self.meta_fields}}

    def reference(self, example: Example) -> str | None:
        """An output that `score` gives full marks (the set's own answer), or None (not scored, or no answer)."""
        return None

    def stratum(self, example: Example) -> str | None:
        """The group within which `limit` and `shard` select (None: the whole dataset is one)."""
        return None

    def answer_complete(self, example: Example, output: str) -> bool:
        """Whether `output` holds the task's whole answer (a benchmark that can tell overrides it). Default False:
        free text cannot tell, so a free-text output stopped by max_new_tokens counts as cut."""
        return False

    def truncated(self, example: Example, output: str, stop_reasons: list[str]) -> bool:
        """Did max_new_tokens cut the answer? stop_reasons [turns]: why each turn ended (one for a single turn).
        truncated = some earlier turn stopped at "length" (the later turns answer a cut answer), or the last
        turn did and its output (the final answer) is not complete (answer_complete)."""
        *earlier, last = stop_reasons
        return "length" in earlier or (last == "length" and not self.answer_complete(example, output))


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    """'i/n' -> (i, n) with 0 <= i < n."""
    if shard in (None, ""):
        return None
    try:
        i, n = (int(s) for s in str(shard).split("/"))
    except ValueError:
        raise OptionError(f"shard must look like 'i/n' (e.g. 0/4), got {shown(shard)}") from None
    if not 0 <= i < n:
        raise OptionError(f"shard={shard}: need 0 <= i < n in shard=i/n (shard i of n, counted from 0: 0/4, 1/4, 2/4 "
                          "and 3/4 are the 4 shards of 4)")
    return i, n


def check_selection(limit: Any, shard: Any) -> tuple[int | None, tuple[int, int] | None]:
    """limit (an integer >= 1 or null) and shard ('i/n' or null), checked."""
    return integer(limit, "limit", low=1, null=True), parse_shard(shard)


def select(examples: list[Example], limit: int | None, shard: str | None,
           stratum: Callable[[Example], str | None] | None = None) -> list[Example]:
    """The first `limit` examples (in the dataset's fixed order), then every n-th from i for shard i/n; with a `stratum`
    (Evaluator.stratum), both within each stratum, the strata in order of first appearance."""
    limit, s = check_selection(limit, shard)
    if not examples:
        raise InputError("the dataset has no examples")
    strata: dict[str | None, list[Example]] = {}
    for e in examples:
        strata.setdefault(stratum(e) if stratum else None, []).append(e)
    picked = []
    for name, members in strata.items():
        of = "" if name is None else f" of stratum {name!r}"
        if limit is not None:
            members = members[:limit]
        if s:
            if s[0] >= len(members):
                raise OptionError(f"shard={shard} selects no examples{of}: there are only {len(members)} to "
                                  f"share (after limit); use at most {len(members)} shards")
            members = members[s[0] :: s[1]]
        picked += members
    examples = picked
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise InputError("dataset has duplicate example ids; results could not be resumed safely")
    return examples


# The prompt keys of every dataset node (conf/dataset_base/default.yaml): never options of the evaluator.
PROMPT_KEYS = ("system_prompt", "chat_template")
SELECTION_KEYS = ("limit", "shard")  # the runner's top-level keys (conf/config.yaml), never in a dataset node
NAME_KEYS = ("name", "evaluator")  # the dataset's name, and the registered evaluator it runs (default: the name)


def check_prompt_keys(cfg: dict) -> None:
    """system_prompt and chat_template checked; a selection key in the dataset node is refused naming its place."""
    for key in SELECTION_KEYS:
        if key in cfg:
            raise OptionError(f"dataset.{key} is not a dataset option: examples are selected by the top-level key "
                              f"`{key}` (e.g. {key}=8 on the command line)")
    text(cfg.get("system_prompt"), "dataset.system_prompt", null=True)
    choice(cfg.get("chat_template", "auto"), "dataset.chat_template", ("auto", True, False))


def evaluator_class(cfg: dict) -> type[Evaluator]:
    """The evaluator registered under cfg['evaluator'] (a dataset that only needs a YAML), else under cfg['name']."""
    if cfg.get("evaluator") is None:
        return DATASETS.get(cfg["name"])
    key = text(cfg["evaluator"], "dataset.evaluator")
    try:
        return DATASETS.get(key)
    except UnknownNameError as err:
        raise UnknownNameError(f"dataset.evaluator of dataset {cfg['name']!r}: {err}") from None


def build_dataset(cfg: dict) -> Evaluator:
    """The evaluator of dataset cfg['name'] (whose name rows and summaries record), built with its options: every key
    but the prompt keys, the names and the budget; every key is checked (its type against the evaluator's constructor,
    the budget as an integer >= 1 or null) before any data is loaded."""
    cls = evaluator_class(cfg)
    check_prompt_keys(cfg)
    integer(cfg.get(BUDGET_KEY), f"dataset.{BUDGET_KEY}", low=1, null=True)
    options = {k: v for k, v in cfg.items() if k not in (*PROMPT_KEYS, *NAME_KEYS, BUDGET_KEY)}
    evaluator = cls(**check_options(cls, options, "dataset", f"dataset {cfg['name']!r}"))
    evaluator.name = cfg["name"]
    return evaluator
