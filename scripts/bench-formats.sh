#!/usr/bin/env bash
# Accuracy of the 4-bit formats side by side (issue 31): each trained tiny model's FP8 source quantized by its
# built-in INT4 recipe (round to nearest, ct-minmax; and GPTQ calibrated on the sonnets), its NVFP4 recipe (weights
# only, W4A4 with activation scales calibrated on the sonnets, and `-nvfp4-mlp`: shared experts and dense MLP NVFP4 as
# well), its MXFP4 recipe (routed experts only unless said) and its W4A8 recipe (INT4 g128, FP8 per-token
# activations; rtn and GPTQ), each output scored against the source by
# `squeeze eval --reference FP8 --candidate OUT --modes weights` on The Tempest (held out of training): mean KLD
# ± stderr, same top-1 %, PPL ratio, and the output's tensor bytes. A recipe refused for the model's shapes (W4A8
# needs widths that are multiples of 256; the shipped tiny models are 192 wide) gets a row saying so. Prints one
# markdown table; asserts nothing.
#
#   scripts/bench-formats.sh [--ctx 256] [--chunks 8] [--keep DIR] [--model ARCH:DIR]...
#   SQUEEZE=path/to/squeeze runs that binary instead of building target/release/squeeze.
# --model (repeatable) measures the models given instead of the three shipped ones, e.g. `--model kimi-k2:DIR` for one
# trained by `scripts/train-tiny.sh --width 256 DIR` (W4A8's shapes).
set -euo pipefail
cd "$(dirname "$0")/.."
ctx=256 chunks=8 keep=""
models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ctx) ctx="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    --model) models+=("$2"); shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "${SQUEEZE:-}" ]; then
  cargo build --release --quiet
  SQUEEZE=target/release/squeeze
fi
[ ${#models[@]} -gt 0 ] ||
  models=(kimi-k2:eval/tiny-shakespeare-fp8 glm45:eval/tiny-shakespeare-glm45-fp8 glm5:eval/tiny-shakespeare-glm5-fp8)
work=${keep:-$(mktemp -d)}
mkdir -p "$work"
printf '| model | format | method | mean KLD ± stderr | same top %% | PPL ratio | MLP bytes (routed + shared + dense) |\n'
printf '| --- | --- | --- | ---: | ---: | ---: | ---: |\n'
for pair in "${models[@]}"; do
  arch=${pair%%:*} model=${pair#*:}
  for variant in int4:rtn int4:gptq nvfp4:rtn nvfp4-w4a4:rtn nvfp4-mlp:rtn mxfp4:rtn w4a8:rtn w4a8:gptq; do
    format=${variant%%:*} method=${variant#*:}
    out="$work/$arch-$format-$method"
    # --engine vllm: SGLang's FP4 MoE rules (fp4-moe-engine) refuse these tiny shapes and MXFP4 experts.
    args=(quantize "$model" "$out" --recipe "$arch-$format" --force --json --engine vllm)
    [ "$method" = gptq ] && args+=(--method gptq --calibration eval/sonnets.txt)
    # W4A4: the activation global scales are calibrated on the same text.
    [ "$format" = nvfp4-w4a4 ] && args+=(--calibration eval/sonnets.txt)
    if ! quantized=$("$SQUEEZE" "${args[@]}" 2>"$work/stderr"); then
      printf '| %s | %s | %s | refused: %s | | | |\n' "$(basename "$model")" "$format" "$method" \
        "$(grep -m1 -o 'hidden_size.*\|row length [0-9]*' "$work/stderr" || head -c 120 "$work/stderr")"
      continue
    fi
    # Parity gates may fail on a tiny model (exit 1): the report is what is read.
    report=$("$SQUEEZE" eval --reference "$model" --candidate "$out" --data eval/shakespeare-heldout.txt \
      --ctx "$ctx" --chunks "$chunks" --modes weights --json || true)
    python3 - "$model" "$format" "$method" "$quantized" "$report" <<'PY'
import json, os, sys
model, form, method, quantized, report = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5])
w = report["modes"]["weights"]
experts = sum(quantized["classes"].get(c, {}).get("bytes_out", 0) for c in ("routed_experts", "shared_experts", "dense_mlp"))
print(f"| {os.path.basename(model)} | {form} | {method} | {w['mean_kld']:.3e} ± {w['mean_kld_stderr']:.1e} | "
      f"{w['same_top']:.2f} | {w['ppl_ratio']:.5f} | {experts:,} |")
PY
  done
done
