#!/usr/bin/env bash
# Create the llm-compressor GPTQ oracle venv (outside CI; ~6 GB) with pinned versions.
#
#   scripts/oracle/gptq/setup.sh                 # create or verify (idempotent)
#   VENV=/big/disk/venv PYTHON=python3.12 scripts/oracle/gptq/setup.sh
#
# llmcompressor 0.14.0.1 pins compressed-tensors==0.19.0, torch<=2.14.0 and transformers<=5.17.0,
# so these are the newest versions it accepts; all exist on PyPI as pinned. torch has no CPU-only
# wheel on PyPI, so this pulls the CUDA wheel and its nvidia-* dependencies; the oracle runs on
# the CPU. The resolved set is written to ${VENV}/freeze.txt; scripts/oracle/gptq/freeze.txt is
# the copy the committed goldens were made with.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${VENV:-${here}/.venv}"
python="${PYTHON:-python3}"

pins=(
  "llmcompressor==0.14.0.1"
  "compressed-tensors==0.19.0"
  "torch==2.14.0"
  "transformers==5.17.0"
  "safetensors==0.8.0"
  "numpy==2.4.6"
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
from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight  # noqa: F401
PY
}

if check_installed; then
  echo "gptq oracle venv ok: ${venv} (${pins[*]})"
  exit 0
fi

start=$(date +%s)
if [ ! -x "${venv}/bin/python" ]; then
  echo "creating ${venv} with $(${python} --version)" >&2
  "${python}" -m venv "${venv}"
fi
"${venv}/bin/python" -m pip install --upgrade --quiet pip
"${venv}/bin/python" -m pip install "${pins[@]}"
"${venv}/bin/python" -m pip freeze > "${venv}/freeze.txt"

if check_installed; then
  echo "gptq oracle venv ok: ${venv} (installed in $(( $(date +%s) - start )) s)"
else
  echo "error: ${venv} does not hold the pinned versions after install" >&2
  "${venv}/bin/python" -m pip list 2>/dev/null | grep -Ei '^(llmcompressor|compressed-tensors|torch|transformers|safetensors|numpy) ' >&2 || true
  exit 2
fi
