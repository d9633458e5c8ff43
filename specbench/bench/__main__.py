"""`python -m specbench.bench`: the benchmarks' command line (specbench.bench.cli)."""

import sys

from specbench.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
