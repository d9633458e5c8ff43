"""The Hugging Face hub side of loading a model: is it a local folder, in the local cache, or can the hub
supply it (asked once, without retries), and the error with the download command of the installed
huggingface_hub, the gated-licence and token hints when none of them can."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

import huggingface_hub
from huggingface_hub import HfApi, constants as hf_constants, try_to_load_from_cache
from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError,
                                    RevisionNotFoundError)
from huggingface_hub.utils import validate_repo_id
from packaging.version import Version

from specbench.common.errors import UserError

log = logging.getLogger(__name__)


HUB_TIMEOUT_S = 10.0  # the one request that asks the hub for a model missing from the local cache
OFFLINE_HINT = "For the offline Qwen2.5-Coder / SmolLM2 models run ../shared/tools/prepare-offline-models."
_HUB_DOWN: dict[str, str] = {}  # endpoint -> why it could not be reached: asked once per process


class ModelUnavailable(UserError, RuntimeError):
    """A model is neither a local folder nor in the Hugging Face cache, and the hub cannot supply it."""


def hf_cli() -> str:
    """The command-line tool of the installed huggingface_hub: `hf` (0.34 and later; 1.0 dropped
    `huggingface-cli`), else `huggingface-cli`."""
    return "hf" if Version(huggingface_hub.__version__) >= Version("0.34") else "huggingface-cli"


def download_command(repo_id: str, revision: str | None = None) -> str:
    """The shell command that downloads `repo_id` into the local cache with the installed huggingface_hub."""
    return f"{hf_cli()} download {repo_id}" + (f" --revision {revision}" if revision else "")


def access_hints(repo_ids: list[str]) -> str:
    """How to get gated models: accept the licence on each model page, then log in or set HF_TOKEN."""
    login = "hf auth login" if hf_cli() == "hf" else "huggingface-cli login"
    pages = ", ".join(f"{hf_constants.ENDPOINT}/{r}" for r in repo_ids)
    return (f"Gated models (e.g. meta-llama/*) need their licence accepted on the model page ({pages}) "
            f"and a token: `{login}` or HF_TOKEN=<token>.")


def hub_offline() -> bool:
    """Is HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set? Read now: huggingface_hub reads it once, on import."""
    flags = (os.environ.get(k, "").upper() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return hf_constants.HF_HUB_OFFLINE or any(f in hf_constants.ENV_VARS_TRUE_VALUES for f in flags)


def cached_config(repo_id: str, revision: str | None = None) -> Path | None:
    """The model's config.json in the local Hugging Face cache at `revision` (default: main), None if absent."""
    found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return Path(found) if isinstance(found, str) else None


def in_hf_cache(repo_id: str, revision: str | None) -> bool:
    """Is the model's config.json in the local Hugging Face cache at `revision` (default: main)?"""
    return cached_config(repo_id, revision) is not None


def ask_hub(repo_id: str, revision: str | None) -> str | None:
    """One request for the model's metadata, without retries: None if the hub serves it, else why not. A hub
    found unreachable is not asked again in this process."""
    endpoint = hf_constants.ENDPOINT
    if endpoint in _HUB_DOWN:
        return _HUB_DOWN[endpoint]
    log.info("asking %s for %s (one request, %.0f s timeout)", endpoint, repo_id, HUB_TIMEOUT_S)
    try:
        HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return "it is gated and this account has not accepted its licence (or no token is set)"
    except RevisionNotFoundError:
        return f"the hub has no revision {revision!r} of it"
    except HfHubHTTPError as err:  # RepositoryNotFoundError too: the hub answers 401 for a missing repo
        status = err.response.status_code if err.response is not None else None
        if status in (401, 403):
            return f"the hub refused it (HTTP {status}): it does not exist, or it is private or gated and needs a token"
        missing = isinstance(err, RepositoryNotFoundError)
        return "the hub has no such model" if missing else f"the hub answered HTTP {status}"
    except Exception as err:  # noqa: BLE001 - no answer at all (the HTTP client's error types differ by version)
        _HUB_DOWN[endpoint] = f"the hub ({endpoint}) is unreachable: {type(err).__name__}: {err}"
        return _HUB_DOWN[endpoint]
    return None


def hub_source(path: str, revision: str | None = None) -> str:
    """Where from_pretrained reads `path`: 'local' (a folder), 'cache' (the local Hugging Face cache only) or
    'hub'; raises ModelUnavailable with the reason when none can supply it."""
    if Path(path).is_dir():
        return "local"
    label = f"{path} (revision {revision or 'main'})"
    cached = in_hf_cache(path, revision)
    if hub_offline():
        if cached:
            return "cache"
        raise ModelUnavailable(f"{label} is not in the local Hugging Face cache ({hf_constants.HF_HUB_CACHE}) "
                               "and HF_HUB_OFFLINE is set")
    why = ask_hub(path, revision)
    if why is None:
        return "hub"
    if cached:
        log.warning("%s: %s; loading it from the local Hugging Face cache", label, why)
        return "cache"
    raise ModelUnavailable(f"{label} is not in the local Hugging Face cache ({hf_constants.HF_HUB_CACHE}), "
                           f"and {why}")


def unavailable(problems: list[str], models: list[tuple[str, str | None]], needs: str = "") -> ModelUnavailable:
    """One error for the models that cannot be loaded: each reason, how to download them, the access hints,
    the offline models' tool and what the pair needs."""
    ids = [r for r, _ in models]
    lines = [*problems, f"Download with the installed huggingface_hub {huggingface_hub.__version__}, where the hub "
             "is reachable:", *(f"  {download_command(r, rev)}" for r, rev in models), access_hints(ids),
             OFFLINE_HINT]
    return ModelUnavailable("\n".join(lines + ([needs] if needs else [])))


def check_hub_id(path: str) -> None:
    """Fail unless `path` is a local folder or has the form of a hub id (owner/name)."""
    if Path(path).is_dir():
        return
    try:
        validate_repo_id(path)
    except HFValidationError:
        raise ModelUnavailable(f"could not load model or tokenizer {path!r}: it is neither a local folder nor a hub "
                               f"id (owner/name). {OFFLINE_HINT}") from None


def source_of(path: str, revision: str | None) -> str:
    """hub_source for one model, its error completed with the download and access hints."""
    check_hub_id(path)
    try:
        return hub_source(path, revision)
    except ModelUnavailable as err:
        raise unavailable([f"could not load model or tokenizer: {err}"], [(path, revision)]) from None


def pretrained(load: Callable[..., Any], path: str, revision: str | None, source: str | None, **kwargs: Any) -> Any:
    """load(path, ...) (a from_pretrained) from `source` (hub_source's answer, asked here when None): 'cache'
    reads the local Hugging Face cache alone; an OSError becomes ModelUnavailable with the download hints."""
    source = source or source_of(path, revision)
    try:
        return load(path, revision=revision, local_files_only=source == "cache", **kwargs)
    except OSError as err:
        problem = f"could not load model or tokenizer {path!r}: {err}. It must be a local folder or a hub id"
        raise unavailable([problem], [(path, revision)]) from err
