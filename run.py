"""The only entry point: python run.py [overrides]; python run.py -m ... for sweeps; python run.py --help."""

import logging
import re
import sys
from pathlib import Path

CONF = Path(__file__).resolve().parent / "conf"


def described(group: str) -> list[str]:
    """Each config of conf/<group>/ with its file's first comment line."""
    out = []
    for f in sorted((CONF / group).glob("*.yaml")):
        lines = f.read_text().splitlines()
        notes = [line.lstrip("# ") for line in lines if line.startswith("#") and "@package" not in line]
        out.append(f"  {f.stem:<22} {(notes or [''])[0][:94]}")
    return out


def keys(path: Path, prefix: str = "") -> list[str]:
    """The top-level keys of a YAML file with their defaults and comments (conf/config.yaml's run keys)."""
    found = [re.match(r"^([a-z_]+):\s*([^#]*?)\s*(?:#\s*(.*))?$", line) for line in path.read_text().splitlines()]
    return [f"  {prefix}{m[1]}={m[2] or '...'}  {m[3] or ''}".rstrip()[:118] for m in found
            if m and m[1] not in ("defaults", "hydra", "engine")]


def brief_help(args: list[str]) -> str:
    """`python run.py --help` (no torch import: quick) or, with method=NAME, that method's parts and options."""
    name = next((a.split("=", 1)[1] for a in args if a.startswith("method=")), None)
    if name is not None:
        from specbench.decoding.compose import method_names, part_names, part_options, preset

        if name not in method_names():
            return f"unknown method {name!r}; methods: {', '.join(method_names())}"
        values = preset(name)
        lines = [f"method {name}: parts {part_names({'name': name})}; options (method.<key>=value):"]
        lines += [f"  {part}: " + (", ".join(f"{o}={values.get(o, '(default)')}" for o in opts) or "none")
                  for part, opts in part_options({"name": name}).items()]
        return "\n".join(lines)
    usage = ["usage: python run.py [group=name ...] [key=value ...]      one run, resumable, into results/",
             "       python run.py -m method=ar,vanilla limit=20 ...        a sweep: one job per combination",
             "       python run.py -m hydra/launcher=slurm ...              the sweep on SLURM (README, SLURM)",
             "       python run.py -m ... --dry-run                         every job, its folder, what it lacks",
             "       python run.py --help method=NAME                       a method's parts and options"]
    groups = [(g, f"{g}=NAME") for g in ("method", "pair", "dataset", "decode", "experiment", "task")]
    body = [line for g, head in groups for line in [f"\n{head}:", *described(g)]]
    run_keys = ["\nrun keys:", *keys(CONF / "config.yaml"), "  engine.compile=false  static caches and torch.compile",
                "\ndecode keys:", *keys(CONF / "decode/greedy.yaml", "decode.")]
    return "\n".join(usage + body + run_keys)


if __name__ == "__main__" and any(a in ("--help", "-h") for a in sys.argv[1:]):
    text = brief_help(sys.argv[1:])
    sys.exit(text if text.startswith("unknown method") else print(text))

import hydra  # noqa: E402 - after the help, which needs neither Hydra nor torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specbench.common.errors import UserError
from specbench.runs.layout import discard_job_dir  # also registers the resolvers conf/config.yaml's folders use
from specbench.runs.overrides import check_option_overrides
from specbench.runs.runner import run
from specbench.runs.sweep import for_hydra, log_job_error

log = logging.getLogger(__name__)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except BaseException as err:
        log_job_error(err)  # with its traceback, into the job's log; Hydra shows the message on stderr
        hc = HydraConfig.get()
        if discard_job_dir(Path(hc.runtime.output_dir), Path(hc.runtime.cwd) / cfg.paths.results,
                           {hc.output_subdir or "", f"{hc.job.name}.log"}):
            log.info("removed %s: the job failed before its first row", hc.runtime.output_dir)
        raise for_hydra(err) from err  # a user error: its message, without a traceback


if __name__ == "__main__":
    try:  # a mistyped method or dataset option key: its message with the valid keys, before Hydra composes
        sys.argv[1:] = check_option_overrides(sys.argv[1:])  # method.<key> overrides as ++method.<key>
    except UserError as err:  # also a plugin file that does not import, named with its line
        sys.exit(str(err))
    if "--dry-run" in sys.argv[1:]:  # every job, its folder and what it lacks; nothing loaded or written
        from specbench.runs.dryrun import main as dry_run

        sys.exit(dry_run(sys.argv[1:]))
    main()
