"""The Hugging Face hub side of loading a model or a hub dataset: is it a local folder, in the local cache, or can the
hub supply it (asked once, without retries; an unreachable hub is remembered for the process), and the error with the
download command and the gated-licence and token hints when none can. Models and datasets share hub_source."""

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


HUB_TIMEOUT_S = 10.0  # the one request that asks the hub about a model or dataset before it is loaded
OFFLINE_HINT = ("A node without network: download on a connected machine and copy its Hugging Face cache (HF_HOME) "
                "to the node (docs/gpu.md, offline nodes).")
_HUB_DOWN: dict[str, str] = {}  # endpoint -> why it could not be reached: asked once per process


class HubUnavailable(UserError, RuntimeError):
    """A model or dataset is neither local nor in the local cache, and the hub cannot supply it."""


class ModelUnavailable(HubUnavailable):
    """A model is neither a local folder nor in the Hugging Face cache, and the hub cannot supply it."""


def hf_cli() -> str:
    """The installed huggingface_hub's command-line tool: `hf` from 0.34 (1.0 dropped `huggingface-cli`), else that."""
    return "hf" if Version(huggingface_hub.__version__) >= Version("0.34") else "huggingface-cli"


def download_command(repo_id: str, revision: str | None = None, repo_type: str = "model") -> str:
    """The shell command that downloads `repo_id` (a model, or a `repo_type` repository) into the local cache."""
    kind = "" if repo_type == "model" else f" --repo-type {repo_type}"
    return f"{hf_cli()} download{kind} {repo_id}" + (f" --revision {revision}" if revision else "")


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


def cached_snapshot(repo_id: str, repo_type: str = "model", revision: str | None = None) -> Path | None:
    """The folder of the repository's snapshot at `revision` (default: main) in the local Hugging Face cache (what
    `hf download` fills, possibly in part), None if absent."""
    folder = Path(hf_constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    ref = folder / "refs" / (revision or "main")
    snapshot = folder / "snapshots" / (ref.read_text().strip() if ref.is_file() else (revision or "main"))
    return snapshot if snapshot.is_dir() else None


def cache_names(repo_type: str = "model") -> str:
    """The local caches a model (the hub cache) or a dataset (also the datasets cache) is looked up in."""
    hub_cache = f"the local Hugging Face cache ({hf_constants.HF_HUB_CACHE})"
    if repo_type == "model":
        return hub_cache
    datasets_cache = os.environ.get("HF_DATASETS_CACHE") or os.path.join(hf_constants.HF_HOME, "datasets")
    return f"{hub_cache} or the datasets cache ({datasets_cache})"


def ask_hub(repo_id: str, revision: str | None, repo_type: str = "model") -> str | None:
    """One request for the metadata of a model (or a `repo_type` repository), without retries: None if the hub
    serves it, else why not. A hub found unreachable is not asked again in this process."""
    endpoint = hf_constants.ENDPOINT
    if endpoint in _HUB_DOWN:
        return _HUB_DOWN[endpoint]
    log.info("asking %s for %s %s (one request, %.0f s timeout)", endpoint, repo_type, repo_id, HUB_TIMEOUT_S)
    try:
        HfApi(endpoint=endpoint).repo_info(repo_id, repo_type=repo_type, revision=revision, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return "it is gated and this account has not accepted its licence (or no token is set)"
    except RevisionNotFoundError:
        return f"the hub has no revision {revision!r} of it"
    except HfHubHTTPError as err:  # RepositoryNotFoundError too: the hub answers 401 for a missing repo
        status = err.response.status_code if err.response is not None else None
        if status in (401, 403):
            return f"the hub refused it (HTTP {status}): it does not exist, or it is private or gated and needs a token"
        missing = isinstance(err, RepositoryNotFoundError)
        return f"the hub has no such {repo_type}" if missing else f"the hub answered HTTP {status}"
    except Exception as err:  # noqa: BLE001 - no answer at all (the HTTP client's error types differ by version)
        _HUB_DOWN[endpoint] = f"the hub ({endpoint}) is unreachable: {type(err).__name__}: {err}"
        return _HUB_DOWN[endpoint]
    return None


def hub_source(path: str, revision: str | None = None, repo_type: str = "model", cached: bool | None = None) -> str:
    """Where a model (or a `repo_type` repository) `path` is read from: 'local' (a folder), 'cache' (the local
    caches only) or 'hub'; `cached`: whether a local cache holds it (default: the model's config.json is in the
    Hugging Face cache). Raises ModelUnavailable (HubUnavailable for a dataset) with the reason when none can."""
    if Path(path).is_dir():
        return "local"
    label = f"{path} (revision {revision or 'main'})"
    cached = cached_config(path, revision) is not None if cached is None else cached
    error = ModelUnavailable if repo_type == "model" else HubUnavailable
    if hub_offline():
        if cached:
            return "cache"
        raise error(f"{label} is not in {cache_names(repo_type)} and HF_HUB_OFFLINE is set")
    why = ask_hub(path, revision, repo_type)
    if why is None:
        return "hub"
    if cached:
        log.warning("%s: %s; loading it from %s", label, why, cache_names(repo_type))
        return "cache"
    raise error(f"{label} is not in {cache_names(repo_type)}, and {why}")


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
