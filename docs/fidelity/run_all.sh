#!/usr/bin/env bash
# Fidelity of specbench's EAGLE-3 and Medusa heads against the reference implementations (see README.md).
#   docs/fidelity/run_all.sh [WORK]          (from the repository root; about 30 s on 2 CPU cores)
# Interpreters and reference sources can be overridden: SPECBENCH_PY, EAGLE_PY, SPECULATORS_PY, MEDUSA_PY,
# EAGLE_SRC, MEDUSA_SRC.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="${1:-/tmp/fidelity-work}"
SPECBENCH_PY="${SPECBENCH_PY:-/tmp/v25/bin/python}"
EAGLE_PY="${EAGLE_PY:-/tmp/refs/venv-eagle/bin/python}"
SPECULATORS_PY="${SPECULATORS_PY:-/tmp/refs/venv-speculators/bin/python}"
MEDUSA_PY="${MEDUSA_PY:-/tmp/refs/venv-medusa/bin/python}"
EAGLE_SRC="${EAGLE_SRC:-/tmp/refs/src/SafeAILab+EAGLE}"
MEDUSA_SRC="${MEDUSA_SRC:-/tmp/refs/src/FasterDecoding+Medusa}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error PYTHONWARNINGS=ignore
quiet() { grep -E '^(   |!! |EAGLE-3 vs|Medusa vs|wrote |prompt |Traceback|[A-Za-z]*Error)' || true; }

( cd "$HERE/../.." && "$SPECBENCH_PY" "$HERE/make_work.py" "$WORK" 2>&1 ) | quiet
echo "== EAGLE-3 vs SafeAILab/EAGLE ($EAGLE_SRC)"
PYTHONPATH="$EAGLE_SRC" "$EAGLE_PY" "$HERE/cmp_eagle.py" "$WORK" 2>&1 | quiet
echo "== EAGLE-3 vs speculators"
"$SPECULATORS_PY" "$HERE/cmp_speculators.py" "$WORK" 2>&1 | quiet
echo "== Medusa vs FasterDecoding/Medusa ($MEDUSA_SRC)"
PYTHONPATH="$MEDUSA_SRC" "$MEDUSA_PY" "$HERE/cmp_medusa.py" "$WORK" 2>&1 | quiet
cat "$WORK"/result-eagle.txt "$WORK"/result-speculators.txt "$WORK"/result-medusa.txt > "$WORK/summary.txt"
echo "summary: $WORK/summary.txt"
