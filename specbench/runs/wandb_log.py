"""Optional Weights & Biases logging of a finished run (`logger=wandb`, conf/logger/wandb.yaml): one wandb run with
the run's config and provenance, the summary's numbers and the rows as the table `rows`. Best effort: any exception
(wandb not installed, no network or login, a bad setting) is logged as a warning, so wandb never fails a run nor
touches its files. Offline (`WANDB_MODE=offline` or `logger.mode=offline`) it writes `<dir>/wandb/offline-run-*`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from specbench.common import configs

log = logging.getLogger(__name__)

LOGGERS = ("none", "wandb")
ROW_SKIP = ("token_ids", "turn_outputs", "top2_margins", "off_top1")  # long lists: they stay in rows.jsonl
PROVENANCE = ("config", "choices", "seed", "git_hash", "git_dirty", "versions", "device_info")


def flatten(d: dict[str, Any]) -> dict[str, Any]:
    """Nested dict -> {"a/b": scalar}; lists and other non-scalars are left out."""
    return {k: v for k, v in configs.flatten(d, sep="/").items() if v is None or isinstance(v, (bool, int, float, str))}


def rows_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Columns and data of the rows table: every key seen in any row except ROW_SKIP, in first-seen order."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in ROW_SKIP and k not in cols]
    data = [[r.get(c) if not isinstance(r.get(c), (dict, list)) else str(r.get(c)) for c in cols] for r in rows]
    return cols, data


def log_run(logger_cfg: dict[str, Any] | None, run_dir: Path, summary: dict[str, Any],
            rows: list[dict[str, Any]]) -> bool:
    """Log one finished run to wandb when logger_cfg asks for it; True if logged. Never raises an Exception."""
    c = logger_cfg or {}
    name = c.get("name", "none")
    if name == "none":
        return False
    if name != "wandb":
        log.warning("logger %r is not known (valid: %s); nothing logged", name, ", ".join(LOGGERS))
        return False
    run = None
    try:
        import wandb

        choices = summary.get("choices") or {}
        run = wandb.init(
            project=c.get("project") or "specbench", entity=c.get("entity"), mode=c.get("mode"),
            tags=list(c.get("tags") or []), group=c.get("group") or f"{summary.get('pair')}/{summary.get('dataset')}",
            name=str(run_dir), job_type=str(choices.get("method") or summary.get("method")),
            dir=str(c.get("dir") or run_dir), config={k: summary.get(k) for k in PROVENANCE},
            settings=wandb.Settings(console="off", silent=True),
        )
        run.summary.update(flatten({k: v for k, v in summary.items() if k not in PROVENANCE}))  # provenance: config
        if c.get("rows", True) and rows:
            cols, data = rows_table(rows)
            run.log({"rows": wandb.Table(columns=[*cols], data=data)})
        run.finish()
        log.info("%s: logged to wandb (mode %s)", run_dir, run.settings.mode)
        return True
    except Exception as e:  # noqa: BLE001 - a logger failure must never fail or change the run
        log.warning("%s: wandb logging failed, the run's files are unaffected: %s: %s", run_dir, type(e).__name__, e)
        if run is not None:
            try:
                run.finish(exit_code=1)
            except Exception as e2:  # noqa: BLE001
                log.warning("wandb: could not finish the failed run: %s", e2)
        return False
