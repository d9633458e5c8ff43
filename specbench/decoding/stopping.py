"""Where a generation stops: the one definition every decode loop uses (the engine and `hf_assisted`).

An autoregressive decoder commits one token at a time and, after each token k (1-based count of
new tokens), checks in this order:
  1. EOS: token k is an EOS id                          -> "eos"
  2. stop string: decode(out[:k]) contains a stop string -> "stop_string"
  3. length: k == max_new_tokens                        -> "length"
  4. context: prompt + k == the model context           -> "context"
and stops at the first k where one holds. A speculative iteration commits a block of n + 1 tokens at once;
`StopCriteria.first_stop` runs the same checks at every token of the block, in order, so the generation ends at
exactly the token (and for the same reason) an autoregressive decode would; the tokens past it are dropped. Stop
strings are checked on the decoded prefix at each k, as decoding is not prefix-monotone (byte fallback, spaces).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

STOP_REASONS = ("eos", "stop_string", "length", "context")


def as_text(decoded: str | list[str]) -> str:
    """What a tokenizer's decode of one sequence of ids gives: its text (transformers types decode as returning
    str | list[str], the list for a batch of sequences, which one list of ids is not)."""
    if not isinstance(decoded, str):
        raise TypeError(f"decoding one sequence of ids gave a {type(decoded).__name__}, not its text")
    return decoded


@dataclass(frozen=True)
class StopCriteria:
    """EOS ids, stop strings (checked on text decoded without special tokens) and the two token limits."""

    eos_ids: frozenset[int]
    tokenizer: PreTrainedTokenizerBase | None = None
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the output")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ValueError(f"stop strings must be non-empty strings, got {list(self.stop_strings)!r}")

    def decode(self, out: list[int]) -> str:
        """The text of new tokens out [k] (special tokens skipped; '' without a tokenizer)."""
        return as_text(self.tokenizer.decode(out, skip_special_tokens=True)) if self.tokenizer is not None else ""

    def has_stop_string(self, out: list[int]) -> bool:
        """Does decode(out) contain a stop string?"""
        if not self.stop_strings:
            return False
        text = self.decode(out)
        return any(s in text for s in self.stop_strings)

    def first_stop(self, out: list[int], start: int, max_new: int, room: int) -> tuple[str, int]:
        """(reason, k) for the first k in start+1..len(out) at which an autoregressive decoder stops, else
        ('', len(out)). out [N]: the new tokens so far, of which out[start:] were committed just now;
        room: how many new tokens the context holds after the prompt (context - P)."""
        for k in range(start + 1, len(out) + 1):
            if out[k - 1] in self.eos_ids:
                return "eos", k
            if self.stop_strings and self.has_stop_string(out[:k]):  # no copy of out without stop strings
                return "stop_string", k
            if k >= max_new:
                return "length", k
            if k >= room:
                return "context", k
        return "", len(out)

    def text(self, out: list[int], reason: str) -> str:
        """The output text of the new tokens out [k]; at a stop string it ends before the string (as lm-eval)."""
        text = self.decode(out)
        if reason == "stop_string":
            text = text[: min(text.index(s) for s in self.stop_strings if s in text)]
        return text
