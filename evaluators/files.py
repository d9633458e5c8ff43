"""`files`: a set of prompts (and optional reference answers) from a local file or the hub, chosen by a YAML alone.

lm-eval's `dataset_path: json` is the model: a YAML in conf/dataset/ selects this evaluator with `evaluator: files`
(conf/dataset/local_prompts.yaml documents every key). Exactly one of `path` (a .jsonl, .json list of objects, either
gzipped, or .parquet file; relative to the working directory, which run.py keeps) and `hub` (a Hugging Face set,
`subset` its config, `split` default train) is set. Ids: the `id_field` column as a string, else `<name>-<row index>`.
A reference is a string, a number or a non-empty list of them (any one counts), compared as text by `scoring`
(SCORINGS); a scored row keeps `reference` (the list) and `extracted` (the stripped output, or for contains the first
reference found in it, null when none is). A bad row fails naming the file and line (or row) and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbench.common.options import OptionError, choice, shown
from specbench.data.dataset import DATASETS, DataSourceError, Evaluator, Example, Row, Source, load_source, read_local


SCORINGS = ("none", "exact_match", "contains")


def extracted(scoring: str, output: str, references: list[str]) -> str | None:
    """What scoring compares: the stripped output (exact_match), the first reference found in it (contains)."""
    if scoring == "exact_match":
        return output.strip()
    return next((r.strip() for r in references if r.strip() in output), None)


def answers(row: Row, key: str) -> list[str]:
    """The reference(s) in field `key`: a string, a number or a non-empty list of them, as strings."""
    value = row[key]
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in items):
        raise row.error(f"field {key!r} must be a string, a number or a non-empty list of them, got {shown(value)}")
    return [str(v) for v in items]


@DATASETS.register("files")
class Files(Evaluator):
    """Prompts from a local file or a hub set; score = exact match or containment of a reference (or none)."""

    name = "files"

    def __init__(self, path: str | None = None, hub: str | None = None, split: str | None = None,
                 subset: str | None = None, prompt_field: str = "prompt", reference_field: str | None = None,
                 id_field: str | None = None, scoring: str = "none", stop_strings: list[str] | None = None) -> None:
        super().__init__()
        if (path is None) == (hub is None):
            raise OptionError("set exactly one of dataset.path (a local .jsonl, .json or .parquet file) and "
                              f"dataset.hub (a Hugging Face set), got path={shown(path)}, hub={shown(hub)}")
        if path is not None and (split, subset) != (None, None):
            raise OptionError("dataset.split and dataset.subset choose part of a hub set (dataset.hub); "
                              f"dataset.path={path} is read whole")
        self.scoring = choice(scoring, "dataset.scoring", SCORINGS)
        if self.scoring != "none" and reference_field is None:
            raise OptionError(f"dataset.scoring={scoring} needs dataset.reference_field (the field holding the answer)")
        self.path, self.hub, self.split, self.subset = path, hub, split, subset
        self.prompt_field, self.reference_field, self.id_field = prompt_field, reference_field, id_field
        self.stop_strings = self.stop_strings if stop_strings is None else tuple(stop_strings)

    def rows(self) -> list[Row]:
        """The rows of dataset.path (a missing file fails naming it), or of the hub set."""
        if self.path is not None:
            file = Path(self.path).expanduser()
            if not file.is_file():
                raise DataSourceError(f"dataset {self.name!r}: file {file.resolve()} not found "
                                      f"(dataset.path={self.path})")
            return read_local(file)
        return load_source(Source(f"dataset {self.name!r}", hub=self.hub, hub_config=self.subset, hub_split=self.split),
                           None)

    def example(self, row: Row, index: int) -> Example:
        """One row as an Example: its prompt, id and references (every field checked, naming the row)."""
        ident = str(row[self.id_field]) if self.id_field else f"{self.name}-{index:05d}"
        refs = answers(row, self.reference_field) if self.reference_field else None
        return Example(id=ident, prompt=row.text(self.prompt_field), reference=refs)

    def examples(self) -> list[Example]:
        return [self.example(r, i) for i, r in enumerate(self.rows())]

    def score(self, example: Example, output: str) -> dict[str, Any]:
        """exact_match: 1.0 if the stripped output is a stripped reference; contains: 1.0 if a stripped reference is in
        the output; else 0.0."""
        if self.scoring == "none":
            return {"score": None}
        refs, got = example.reference, extracted(self.scoring, output, example.reference)
        hit = got in {r.strip() for r in refs} if self.scoring == "exact_match" else got is not None
        return {"score": float(hit), "reference": refs, "extracted": got}

    def reference(self, example: Example) -> str | None:
        """The first reference answer, when the dataset is scored."""
        return example.reference[0] if self.scoring != "none" else None
