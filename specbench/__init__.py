"""specbench: a benchmark harness for speculative decoding.

Packages, each importing only those before it: common (registries, option checks, files, progress),
decoding (the engine and its parts), data (datasets, prompting, sandbox), models (pairs, drafters),
methods and evaluators (the plugins), runs (runner, results, provenance, SLURM), training (synth,
distill), analysis (report, tables, figures); bench and lm_eval are entry points.
"""

import logging as _logging

from specbench.common.versions import require_installed as _require_installed

for _warning in _require_installed():  # a release outside the tested range fails here (VersionError)
    _logging.getLogger(__name__).warning(_warning)
