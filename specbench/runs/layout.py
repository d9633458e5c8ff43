"""Where runs lie: one leaf folder per run, `<results>/<pair>/<dataset>/<method>/<decode>/<leaf>`.

conf/config.yaml builds the folders with the OmegaConf resolvers registered on import of this module:
- `specbench.leaf` (`${specbench.leaf:}`, no argument): the overrides that name the run's folder
  (specbench.runs.identity.folder_overrides: no path group, resumable key or key at its default value) as
  one folder name (`leaf`), `default` when there are none, so a run with overrides is never nested inside
  the default run's folder; a '/' in a value would nest folders, so a shard `i/n` reads `iofn` and any
  other '/' (a path, a model id) `--`.
- `specbench.method` (`${specbench.method:}`): the method folder, the method's name by its parts
  (`vanilla+drafter=suffix` when `method.parts.drafter=suffix` changed a part of the preset `vanilla`), so the
  leaf holds the other overrides only;
- `specbench.under`: a path below a base folder unless it is absolute (os.path.join). A sweep's own
  folder is `<results>/.sweeps/<start time>/` (its multirun.yaml and submitit logs, kept per sweep);
  its jobs' sub-folder is their `hydra.run.dir` made absolute, which os.path.join puts in place of the
  sweep folder, so a job of a sweep writes the folder the same command without -m writes.

`job_dir(cfg)` is that folder for a composed config (specbench.bench and the tests use it), and
`discard_job_dir` removes a failed job's folder when it holds no results: a job that fails before its
first row leaves nothing behind (its error is on stderr; under SLURM in the sweep's submitit logs).
"""

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
    """The run folder's name from its overrides: 'default' for none; i/n -> 'iofn', any other '/' -> '--'; a name
    longer than MAX_LEAF bytes keeps its shard and the start of the rest, then `~` and a hash of the rest
    (file systems refuse names over 255 bytes; config.json records every override)."""
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
    """The `specbench.leaf` resolver: the `leaf` of the overrides that name the folder of the config it is in."""
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


def under(base: str, path: str) -> str:
    """`path` below `base`, or `path` itself when it is absolute."""
    return os.path.join(base, path)


def register_resolvers() -> None:
    """Register `specbench.leaf` and `specbench.under` (conf/config.yaml's folder names) with OmegaConf."""
    OmegaConf.register_new_resolver("specbench.leaf", run_leaf, replace=True)
    OmegaConf.register_new_resolver("specbench.method", run_method, replace=True)
    OmegaConf.register_new_resolver("specbench.under", under, replace=True)


register_resolvers()


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


def holds_results(folder: Path, hydra_files: set[str]) -> bool:
    """Whether a job folder holds anything but what Hydra, the folder lock and an unfinished first row put there."""
    return any(p.name not in hydra_files | NOT_RESULTS for p in folder.iterdir())


def discard_job_dir(job_dir: Path, root: Path, hydra_files: set[str]) -> bool:
    """Remove a failed job's folder if it holds no results, then its parents left empty, up to but not
    including `root`; returns whether it was removed.

    Hydra creates the folder, `.hydra/` and the job's log before the job runs, and the runner writes
    config.json before the first example, so a job that fails before its first row (bad input, a model
    that does not load, an interrupt) would otherwise leave a folder with no results that a report lists.
    A folder holding anything else (rows, a summary, a training task's files) is kept, and so is one
    another run holds the lock of.
    """
    job_dir, root = job_dir.resolve(), root.resolve()
    if job_dir == root or not job_dir.is_dir():
        return False
    try:
        with folder_lock(job_dir, timeout=0):  # not while another run is using the folder
            if holds_results(job_dir, hydra_files):
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
