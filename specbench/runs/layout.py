"""Where runs lie: one leaf folder per run, `<results>/<pair>/<dataset>/<method>/<decode>/<leaf>`, built by
conf/config.yaml with the OmegaConf resolvers registered on import of this module. A sweep's own folder is
`<results>/.sweeps/<start time>/`; its jobs' `hydra.run.dir` is absolute, which os.path.join puts in place of the
sweep folder, so a job of a sweep writes the folder the same command without -m writes."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.common.configs import plain
from specbench.runs.identity import folder_overrides
from specbench.runs.results import CONFIG, LOCK, FolderLocked, folder_lock

DEFAULT_LEAF = "default"  # the leaf of a run without overrides (an override name always holds '=')
SHARD_VALUE = re.compile(r"(?<==)(\d+)/(\d+)(?=,|$)")  # a value i/n (shard=0/40)
SHARD_ITEM = re.compile(r"(^|,)shard=\d+of\d+(?=,|$)")  # the shard in a leaf (shard=0of40)
MAX_LEAF = 200  # bytes of a leaf name before it is shortened (leaf)
# What a failed job may leave in its folder without it holding results: the runner's record of the
# config, the folder lock and traces of an example whose row was never written.
NOT_RESULTS = {CONFIG, LOCK, "traces"}


def leaf(override_dirname: str) -> str:
    """The run folder's name from its overrides: 'default' for none (so a run with overrides is never nested in the
    default run's folder); i/n -> 'iofn', any other '/' -> '--' (a '/' would nest folders); a name longer than
    MAX_LEAF bytes keeps its shard and the start of the rest, then `~` and a hash of the rest (file systems refuse
    names over 255 bytes; config.json records every override)."""
    if not override_dirname:
        return DEFAULT_LEAF
    name = SHARD_VALUE.sub(r"\1of\2", override_dirname).replace("/", "--")
    if len(name.encode()) <= MAX_LEAF:
        return name
    shard = SHARD_ITEM.search(name)
    rest = SHARD_ITEM.sub("", name).lstrip(",")
    short = rest.encode()[: MAX_LEAF - 60].decode(errors="ignore") + "~" + hashlib.sha1(rest.encode()).hexdigest()[:12]
    return short + ("," + shard.group(0).lstrip(",") if shard else "")


def run_leaf(*, _root_: DictConfig) -> str:
    """The `specbench.leaf` resolver: the `leaf` of the overrides that name the folder of the config it is in
    (specbench.runs.identity.folder_overrides)."""
    return leaf(",".join(folder_overrides(_root_)))


def run_method(*, _root_: DictConfig) -> str:
    """The `specbench.method` resolver: the method's name by its parts (specbench.decoding.compose.method_label:
    `vanilla`, or `vanilla+drafter=suffix` when the command line changed a part of the preset)."""
    from specbench.decoding.compose import method_label

    return method_label(plain(_root_.method, resolve=False))


def unsharded(name: str) -> str | None:
    """The leaf of the same overrides without `shard=iofn` (None unless the name holds exactly one)."""
    rest, hits = SHARD_ITEM.subn("", name)
    return (rest.lstrip(",") or DEFAULT_LEAF) if hits == 1 else None


OmegaConf.register_new_resolver("specbench.leaf", run_leaf, replace=True)
OmegaConf.register_new_resolver("specbench.method", run_method, replace=True)
OmegaConf.register_new_resolver("specbench.under", os.path.join, replace=True)  # path below base unless absolute


def job_dir(cfg: DictConfig) -> Path:
    """The folder `python run.py` writes for a config composed with its hydra node (its hydra.run.dir)."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.instance()
    saved = hc.cfg
    hc.set_config(cfg)  # ${hydra:...} resolves through this singleton, as inside a running app
    try:
        return Path(cfg.hydra.run.dir)
    finally:
        hc.cfg = saved


def discard_job_dir(job_dir: Path, root: Path, hydra_files: set[str]) -> bool:
    """Remove a failed job's folder if it holds no results (nor another run's lock), then its parents left empty, up
    to but not including `root`; returns whether it was removed (Hydra and the runner write the folder before the
    first row: a job that fails before it would leave a folder with no results that a report lists)."""
    job_dir, root = job_dir.resolve(), root.resolve()
    if job_dir == root or not job_dir.is_dir():
        return False
    try:
        with folder_lock(job_dir, timeout=0):  # not while another run is using the folder
            if any(p.name not in hydra_files | NOT_RESULTS for p in job_dir.iterdir()):
                return False
            shutil.rmtree(job_dir)
    except FolderLocked:
        return False
    for parent in job_dir.parents:  # only inside the results root, and only empty folders
        if parent == root or root not in parent.parents:
            break
        try:
            parent.rmdir()
        except OSError:  # not empty (other results) or already gone
            break
    return True
