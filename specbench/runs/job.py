"""One run's decoding job: the bound decoder, the pair, the evaluator and the settings; prompts fitted to the
context, an example's turns decoded one after another and merged into its row's Generation."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from specbench.common.errors import UserError
from specbench.data.dataset import Evaluator, Example
from specbench.data.prompting import encode
from specbench.decoding import speedup
from specbench.decoding.decoders import Decoder
from specbench.decoding.method import Method
from specbench.decoding.records import Generation, concat_generations
from specbench.models.pairs import Pair


def example_seed(seed: int, example_id: str) -> int:
    """Per-example RNG seed: the same for an example whether or not the run was resumed."""
    return zlib.crc32(f"{seed}:{example_id}".encode())


class PromptTooLong(UserError, ValueError):
    """A prompt does not fit the model context and on_long_prompt=error; the message names the example."""


def fit_prompt(ids: list[int], context: int | None, max_new: int, on_long: str, where: str
               ) -> tuple[list[int], int | None]:
    """The prompt ids [P] if they fit the context; else an error, or its last tokens when truncating."""
    if context is None or len(ids) < context:
        return ids, None
    if on_long == "error":
        raise PromptTooLong(f"{where}: the prompt has {len(ids)} tokens but the model context is {context} (the "
                            "models' max_position_embeddings) and on_long_prompt=error; set on_long_prompt=truncate "
                            "to keep its last tokens, or select other examples (limit, shard)")
    keep = max(1, context - max_new) if context > max_new else context // 2
    return ids[-keep:], len(ids)


@dataclass
class Job:
    """Everything needed to decode and score the examples of one run."""

    engine: Decoder
    method: Method
    pair: Pair
    evaluator: Evaluator
    dataset_cfg: dict
    max_new: int
    seed: int
    on_long: str
    trace: bool

    def encode(self, ex: Example, answers: list[str]) -> list[int]:
        """Prompt ids for the next turn: the example's prompt, or its turns interleaved with the answers so far."""
        if ex.turns:
            msgs = []
            for turn, ans in zip(ex.turns, answers + [None]):
                msgs.append({"role": "user", "content": turn})
                if ans is not None:
                    msgs.append({"role": "assistant", "content": ans})
            ex = Example(id=ex.id, prompt=msgs)
        return encode(self.pair.tokenizer, ex, self.dataset_cfg.get("system_prompt"),
                      self.dataset_cfg.get("chat_template", "auto"))

    def check_prompts(self, examples: list[Example]) -> None:
        """Fail before any decoding if a first-turn prompt does not fit and on_long_prompt=error."""
        for ex in examples:
            fit_prompt(self.encode(ex, []), self.engine.context_length, self.max_new, self.on_long,
                       f"example {ex.id!r} of dataset {self.evaluator.name!r}")


@dataclass
class Dialogue:
    """One example of a batch being decoded: its own generator and the Generation of each turn done so far."""

    example: Example
    generator: torch.Generator
    turns: list[Generation] = field(default_factory=list)
    prompt_tokens: int = 0  # summed over its turns' prompts
    truncated_from: int | None = None  # the first truncated prompt's length (on_long_prompt=truncate)

    @property
    def n_turns(self) -> int:
        """How many turns the example has (1 for a single prompt)."""
        return len(self.example.turns) if self.example.turns else 1


def next_prompt(job: Job, d: Dialogue) -> list[int]:
    """The prompt ids [P] of d's next turn (the earlier turns and their answers included), fitted to the context."""
    ids, cut = fit_prompt(job.encode(d.example, [g.text for g in d.turns]), job.engine.context_length, job.max_new,
                          job.on_long, f"example {d.example.id!r} turn {len(d.turns) + 1}")
    d.prompt_tokens += len(ids)
    d.truncated_from = d.truncated_from or cut
    return ids


def finish(d: Dialogue) -> tuple[Generation, dict[str, Any]]:
    """d's turns merged into one Generation, and its row fields: prompt tokens, call stats (each turn's first
    iteration includes its prompt: speedup.call_stats leaves it out)."""
    answers = [g.text for g in d.turns]
    info = {"prompt_tokens": d.prompt_tokens, "prompt_truncated_from": d.truncated_from,
            **speedup.row_fields(speedup.merge_stats(speedup.call_stats(g.records) for g in d.turns))}
    if d.example.turns:
        return concat_generations(d.turns, answers[-1]), {**info, "turn_outputs": answers}
    return d.turns[0], info

