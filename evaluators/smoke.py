"""`smoke`: 24 built-in prompts so the whole loop runs with no data files; outputs are not scored."""

from __future__ import annotations

from specbench.data.dataset import DATASETS, Evaluator, Example

PROMPTS = [
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "What is 17 times 23? Show your work.",
    "Write a Python function that reverses a string.",
    "List three uses of a paperclip.",
    "Translate 'good morning' into French and German.",
    "Summarise the plot of Romeo and Juliet in one sentence.",
    "Why is the sky blue?",
    "Give a recipe for a simple omelette.",
    "What is the capital of Australia?",
    "Write a limerick about a cat.",
    "Explain recursion to a ten-year-old.",
    "Name the planets of the solar system in order.",
    "Write a SQL query that counts rows in a table named users.",
    "What are the primary colours?",
    "Describe the water cycle briefly.",
    "Write a short thank-you note to a colleague.",
    "How many days are there in a leap year?",
    "def fibonacci(n):",
    "Continue the sequence: 2, 4, 8, 16,",
    "What does HTTP stand for?",
    "Give two tips for writing clear documentation.",
    "Write one sentence using the word 'ephemeral'.",
    "If a train travels 60 km in 45 minutes, what is its speed in km/h?",
]


@DATASETS.register("smoke")
class Smoke(Evaluator):
    """Built-in prompts; ids smoke-00 .. smoke-23."""

    name = "smoke"

    def examples(self) -> list[Example]:
        return [Example(id=f"smoke-{i:02d}", prompt=p) for i, p in enumerate(PROMPTS)]
