#!/usr/bin/env bash
# What requantizing a natively INT4 release costs (issue 31): the trained tiny Kimi K2 (eval/tiny-shakespeare-fp8)
# is first made INT4 g32 as Moonshot ships Kimi K2.5/K2.6 (the kimi-k2-int4 recipe: routed experts pack-quantized,
# rest BF16), then that INT4 folder is requantized by the kimi-k26-{nvfp4,mxfp4,w4a8} recipes (dequantized exactly,
# then quantized). Beside them, the same formats made directly from the FP8 source. Every output is scored against
# the FP8 source by `squeeze eval --reference FP8 --candidate OUT --modes weights` on The Tempest (held out of
# training): mean KLD ± stderr, same top-1 %, PPL ratio; and `report`'s sampled requantization weight error. W4A8
# is not measured: the tiny model's experts are 96 wide, which W4A8's group of 128 cannot divide (quantize refuses
# it). Written with --engine vllm: SGLang's FP4 rules refuse the tiny shapes. Prints one markdown table; asserts
# nothing.
#
#   scripts/bench-requantize.sh [--ctx 256] [--chunks 8] [--keep DIR]
#   SQUEEZE=path/to/squeeze runs that binary instead of building target/release/squeeze.
set -euo pipefail
cd "$(dirname "$0")/.."
ctx=256 chunks=8 keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ctx) ctx="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "${SQUEEZE:-}" ]; then
  cargo build --release --quiet
  SQUEEZE=target/release/squeeze
fi
work=${keep:-$(mktemp -d)}
mkdir -p "$work"
fp8=eval/tiny-shakespeare-fp8
int4="$work/int4-g32"
"$SQUEEZE" quantize "$fp8" "$int4" --recipe kimi-k2-int4 --force --json >/dev/null
score() {  # score LABEL MADE_FROM WEIGHT_ERROR FOLDER
  local report
  report=$("$SQUEEZE" eval --reference "$fp8" --candidate "$4" --data eval/shakespeare-heldout.txt \
    --ctx "$ctx" --chunks "$chunks" --modes weights --json || true)
  python3 - "$1" "$2" "$3" "$report" <<'PY'
import json, sys
label, source, error, report = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
w = report["modes"]["weights"]
print(f"| {label} | {source} | {error} | {w['mean_kld']:.3e} ± {w['mean_kld_stderr']:.1e} | {w['same_top']:.2f} | "
      f"{w['ppl_ratio']:.5f} |")
PY
}
printf '| output | made from | requantization weight error (report, 8 tensors) | mean KLD ± stderr vs FP8 | same top %% | PPL ratio |\n'
printf '| --- | --- | --- | ---: | ---: | ---: |\n'
score "INT4 g32 (as Moonshot ships)" "FP8" "-" "$int4"
for format in nvfp4 mxfp4; do
  engine=(--engine vllm)
  error=$("$SQUEEZE" report "$int4" --recipe "kimi-k26-$format" --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["requantization"]; print("%.4f mean, %.4f max" % (r["mean_relative_l2"], r["max_relative_l2"]))')
  "$SQUEEZE" quantize "$int4" "$work/k26-$format" --recipe "kimi-k26-$format" --force "${engine[@]}" --json >/dev/null
  score "$format" "INT4 g32" "$error" "$work/k26-$format"
  direct_recipe="kimi-k2-$format"
  "$SQUEEZE" quantize "$fp8" "$work/direct-$format" --recipe "$direct_recipe" --force "${engine[@]}" --json >/dev/null
  score "$format" "FP8" "-" "$work/direct-$format"
done
[ -n "$keep" ] || rm -rf "$work"
