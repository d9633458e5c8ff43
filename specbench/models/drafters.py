"""Trained drafters: loading the drafter a `task=distill` run wrote (plain or SD²-steered) onto a pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from transformers import PreTrainedModel

from specbench.common.errors import UserError
from specbench.common.pair_view import PairView
from specbench.common.options import OptionError
from specbench.models.pairs import check_vocab, load_model, load_tokenizer
from specbench.models.steering import SteeredDrafter, Steering

KINDS = ("distilled", "sd2")
INFO = "distill.json"  # written last by a distill run: marks its folder finished

class DrafterMissing(UserError, FileNotFoundError):
    """method.drafter names no finished distill run; the message says how to train one."""


_LOADED: dict[str, tuple[PreTrainedModel, SteeredDrafter | None]] = {}


def finished_info(folder: str | Path | None, kind: str, key: str = "method.drafter") -> tuple[Path, dict[str, Any]]:
    """(folder, its distill.json) of the finished distill run there, for any pair; errors say how to train a `kind`."""
    how = f"train one with `python run.py task=distill task.kind={kind}` and set {key} to its folder"
    what = "head" if key == "method.head" else "drafter"
    if folder is None or folder == "":
        raise OptionError(f"{key}: method {kind!r} needs {key}, the folder of a trained {what}: {how}")
    folder = Path(folder)
    if not (folder / INFO).exists():
        raise DrafterMissing(f"{key}: {folder} is not a finished distill run (no {INFO}): {how}")
    return folder, json.loads((folder / INFO).read_text())


def trained_folder(folder: str | Path | None, pair: PairView, kind: str, key: str = "method.drafter"
                   ) -> dict[str, Any]:
    """distill.json of the finished `task=distill task.kind=kind` run in `folder`, for this pair; the errors name
    `key` and how to train one."""
    folder, info = finished_info(folder, kind, key)
    what = "head" if key == "method.head" else "drafter"
    if info["kind"] != kind:
        raise OptionError(f"{key}: {folder} holds a {info['kind']!r} {what}; method {kind!r} needs one trained with "
                          f"task.kind={kind}")
    same = info.get("verifier_identity") == verifier_identity(pair.target)
    if info["pair"] != pair.name or not (same or info["verifier"] == pair.target.name_or_path):
        raise OptionError(f"{key}: {folder} was trained for pair {info['pair']!r} (verifier {info['verifier']!r}); "
                          f"this run's pair is {pair.name!r} (verifier {pair.target.name_or_path!r})")
    return info


def verifier_identity(model: PreTrainedModel) -> str:
    """What names the verifier a drafter or head was trained against wherever it was loaded from: the sha256 of the
    weights where its loader checked one (the toy pairs, whose folder differs by machine), else name_or_path."""
    sha = getattr(model.config, "weights_sha256", None)
    return f"sha256:{sha}" if sha else model.name_or_path or ""  # typed str | None; a loaded model's is a str


def load_trained(folder: str | Path | None, pair: PairView, kind: str) -> tuple[PreTrainedModel, SteeredDrafter | None]:
    """The drafter a `task=distill` run of `kind` wrote to `folder` (refused for another kind or pair), on the pair's
    draft device and dtype, and for sd2 its SteeredDrafter; the last one loaded is kept for the process's next job."""
    info = trained_folder(folder, pair, kind)
    assert folder is not None  # trained_folder refuses None
    folder = Path(folder)
    draft = pair.model("draft")
    key = json.dumps([str(folder.resolve()), info["finished"], str(draft.device), str(draft.dtype)])
    if key not in _LOADED:
        _LOADED.clear()
        drafter_tok = load_tokenizer(str(folder / "drafter"))
        check_vocab(pair.target.name_or_path or "", pair.tokenizer, str(folder), drafter_tok)
        # transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to), whose type loses the method binding
        model = load_model({"path": str(folder / "drafter")}, draft.device).to(draft.dtype)  # type: ignore[arg-type]
        steered = None
        if kind == "sd2":
            steering = Steering(**json.loads((folder / "steering.json").read_text()))
            steering.load_state_dict(load_file(folder / "steering.safetensors"))
            steered = SteeredDrafter(model, steering.to(draft.device, draft.dtype).eval())
        _LOADED[key] = (model, steered)
    return _LOADED[key]
