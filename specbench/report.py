"""`python -m specbench.report results/`: the report CLI (specbench.analysis.report), beside `specbench.bench`."""

import sys

from specbench.analysis.report import main

if __name__ == "__main__":
    sys.exit(main())
