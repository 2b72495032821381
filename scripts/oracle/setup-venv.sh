#!/usr/bin/env bash
# Create the Python oracle venv at <repo>/.venv-oracle with pinned versions.
#
#   scripts/oracle/setup-venv.sh          # create or verify (idempotent)
#   PYTHON=python3.12 scripts/oracle/setup-venv.sh
#
# Pins (all available on PyPI as pinned; none had to be substituted):
#   torch==2.15.0 transformers==5.24.0 compressed-tensors==0.20.1
#   safetensors==0.8.0 accelerate==1.15.0 numpy (unpinned; whatever torch accepts)
# torch has no CPU-only wheel on the default index, so this pulls the CUDA wheel and
# its nvidia-* dependencies: ~4 min and ~5.6 GB. The oracle scripts only need the CPU.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${repo_root}/.venv-oracle"
python="${PYTHON:-python3}"

pins=(
  "torch==2.15.0"
  "transformers==5.24.0"
  "compressed-tensors==0.20.1"
  "safetensors==0.8.0"
  "accelerate==1.15.0"
)

check_installed() {
  [ -x "${venv}/bin/python" ] || return 1
  "${venv}/bin/python" - "${pins[@]}" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    have = version(name)
    if have != want:
        sys.exit(f"{name} {have} != {want}")
import numpy  # noqa: F401  (unpinned, must import)
PY
}

if check_installed; then
  echo "oracle venv ok: ${venv} (${pins[*]})"
  exit 0
fi

if [ ! -x "${venv}/bin/python" ]; then
  echo "creating ${venv} with $(${python} --version)" >&2
  "${python}" -m venv "${venv}"
fi

"${venv}/bin/python" -m pip install --upgrade --quiet pip
"${venv}/bin/python" -m pip install "${pins[@]}" numpy

if check_installed; then
  echo "oracle venv ok: ${venv}"
else
  echo "error: ${venv} does not hold the pinned versions after install" >&2
  "${venv}/bin/python" -m pip list 2>/dev/null | grep -Ei '^(torch|transformers|compressed-tensors|safetensors|accelerate|numpy) ' >&2 || true
  exit 2
fi
