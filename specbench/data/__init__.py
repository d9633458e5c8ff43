"""Datasets: the dataset registry and sources, prompting, the toy task, and the sandbox that runs generated code."""
