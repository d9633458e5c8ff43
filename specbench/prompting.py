"""Prompts -> token ids: the tokenizer's chat template when it has one, plain text otherwise."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from specbench.data import Example


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
        raise ValueError(f"dataset.chat_template=true but tokenizer {tokenizer.name_or_path!r} has no chat template")
    if has and chat_template in (True, "auto"):
        text = tokenizer.apply_chat_template(messages(example, system_prompt), add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    parts = [system_prompt] if system_prompt else []
    parts += [example.prompt] if isinstance(example.prompt, str) else [m["content"] for m in example.prompt]
    return tokenizer("\n\n".join(parts))["input_ids"]
