"""specbench: a benchmark harness for speculative decoding.

Packages, each importing only those before it: common (registries, option checks, files, progress),
decoding (the engine and its parts), data (datasets, prompting, sandbox), models (pairs, drafters),
methods and evaluators (the plugins), runs (runner, results, provenance, SLURM), training (synth,
distill), analysis (report, tables, figures); bench and lm_eval are entry points.
"""

import logging as _logging

from specbench.common.versions import VersionError as _VersionError, require_installed as _require_installed

try:  # every entry point (run.py, python -m specbench.report / .bench, the lm-eval adapter) imports this first
    for _warning in _require_installed():  # a newer release than the tested one: one line, and it runs
        _logging.getLogger(__name__).warning(_warning)
except _VersionError as _err:  # an older one: its one line on stderr and exit status 1, no traceback
    raise SystemExit(f"specbench: {_err}") from None
