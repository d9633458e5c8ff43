"""Prompts -> token ids: the tokenizer's chat template when it has one, plain text otherwise.

Plain text is the example's messages joined by blank lines, unless the evaluator gives its own plain-text prompt in
`example.meta["plain_prompt"]`: HumanEval's (the code to complete rather than an instruction) and few-shot prompts,
whose chat form has the examples as turns (as lm-eval's `--fewshot_as_multiturn`) and whose plain form joins them as
lm-eval does (`fewshot_text`).
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from specbench.common.errors import InputError
from specbench.data.dataset import Example


def messages(example: Example, system_prompt: str | None) -> list[dict[str, str]]:
    """The example as chat messages, with an optional system prompt first."""
    msgs = [{"role": "user", "content": example.prompt}] if isinstance(example.prompt, str) else list(example.prompt)
    if system_prompt:
        msgs = [{"role": "system", "content": system_prompt}] + msgs
    return msgs


def encode(tokenizer: PreTrainedTokenizerBase, example: Example, system_prompt: str | None = None,
           chat_template: str | bool = "auto") -> list[int]:
    """Token ids of the prompt [P]. chat_template: 'auto' (use it if the tokenizer has one), True, False."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if chat_template is True and not has:
        raise InputError(f"dataset.chat_template=true but tokenizer {tokenizer.name_or_path!r} has no chat template")
    if has and chat_template in (True, "auto"):
        text = tokenizer.apply_chat_template(messages(example, system_prompt), add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    parts = [system_prompt] if system_prompt else []
    if isinstance(example.meta.get(PLAIN_PROMPT), str):
        parts.append(example.meta[PLAIN_PROMPT])
    else:
        parts += [example.prompt] if isinstance(example.prompt, str) else [m["content"] for m in example.prompt]
    return tokenizer("\n\n".join(parts))["input_ids"]


PLAIN_PROMPT = "plain_prompt"  # Example.meta key: the prompt text used when no chat template is applied
TARGET_DELIMITER = " "  # between a few-shot question and its answer (lm-eval's default)
FEWSHOT_DELIMITER = "\n\n"  # between few-shot examples (lm-eval's default)


def fewshot_text(msgs: list[dict[str, str]]) -> str:
    """Few-shot chat turns as lm-eval's plain prompt: each answer after its question and a space, then a blank line."""
    text = ""
    for i, m in enumerate(msgs):
        if i:
            after_question = m["role"] == "assistant" and msgs[i - 1]["role"] == "user"
            text += TARGET_DELIMITER if after_question else FEWSHOT_DELIMITER
        text += m["content"]
    return text


def fewshot_example(ident: str, head: str, shots: list[dict[str, str]], question: str, reference: Any,
                    meta: dict[str, Any] | None = None) -> Example:
    """The question after the few-shot turns `shots` (user, assistant, ...), `head` before the first turn: the
    question alone as the prompt without shots, else the chat turns with their plain form (fewshot_text) in meta."""
    msgs = shots + [{"role": "user", "content": question}]
    msgs[0] = {**msgs[0], "content": head + msgs[0]["content"]}
    if len(msgs) == 1:
        return Example(id=ident, prompt=msgs[0]["content"], reference=reference, meta=meta or {})
    return Example(id=ident, prompt=msgs, reference=reference, meta={**(meta or {}), PLAIN_PROMPT: fewshot_text(msgs)})
