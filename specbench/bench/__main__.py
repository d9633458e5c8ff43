"""`python -m specbench.bench`: the benchmarks' command line (specbench.bench.cli); a user error (an unknown name, a
bad option value) ends with its message, not a traceback."""

import sys

from specbench.bench.cli import main
from specbench.common.errors import UserError

if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as err:
        sys.exit(f"error: {err}")
