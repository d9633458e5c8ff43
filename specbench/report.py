"""`python -m specbench.report results/`: the report CLI (specbench.analysis.report) at the package's top,
beside `specbench.bench` and `specbench.lm_eval`."""

import sys

from specbench.analysis.report import main

if __name__ == "__main__":
    sys.exit(main())
