#!/usr/bin/env bash
# Time and peak RSS of each INT4 method (`quantize --scale-rule ct-minmax|mse`, `--method imatrix|gptq`) on a
# GLM-5-shaped synthetic checkpoint of >= 2 GB, at each thread count of --threads (RAYON_NUM_THREADS), so per-core
# scaling comes from one run. Default shape: `squeeze synth --arch glm5 --layers 2 --experts 26 --hidden 6144
# --moe-intermediate 2048 --vocab 4096` = 1 dense layer + 1 MoE layer + 1 MTP layer (MoE), 2.6 GB of shards, GLM-5's
# expert shapes ([2048, 6144] gate/up, [6144, 2048] down). The calibrated methods calibrate on
# eval/shakespeare-heldout.txt (--samples x --seq-len tokens); they run the MoE layer's 26 experts (the MTP layer
# is not run by the calibration pass: its experts fall back to mse). With --factor it also runs the GPTQ factor
# benchmark (`cargo test --release --lib factor_timing -- --ignored`: the Hessian of 2048 inputs and the inverse-Hessian
# factor (faer) at widths 6144 and 2048, at each thread count). Prints a table; asserts
# nothing.
#
#   scripts/bench-methods-large.sh [--experts 26] [--samples 8] [--seq-len 64] [--threads "2 1"]
#                                  [--methods "ct-minmax mse imatrix gptq"] [--factor] [WORKDIR]
#   SQUEEZE=path/to/squeeze runs that binary instead of building target/release/squeeze.
# WORKDIR (default a temporary folder, removed at the end) keeps the synthetic source between runs.
set -euo pipefail

experts=26 samples=8 seq_len=64 threads="2 1" methods="ct-minmax mse imatrix gptq" factor=0 work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --experts) experts="$2"; shift 2 ;;
    --samples) samples="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --methods) methods="$2"; shift 2 ;;
    --factor) factor=1; shift ;;
    -*) echo "unknown argument $1" >&2; exit 2 ;;
    *) work="$1"; shift ;;
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
if [ -z "${SQUEEZE:-}" ]; then
  cargo build --release --quiet
fi
squeeze="${SQUEEZE:-$repo_root/target/release/squeeze}"
if [ -z "$work" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
src="$work/glm5-$experts"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ ! -f "$src/config.json" ]; then
  "$squeeze" synth --arch glm5 "$src" --layers 2 --experts "$experts" --hidden 6144 --moe-intermediate 2048 \
    --vocab 4096 --shards 8 --force >/dev/null
fi
input_bytes=$(cat "$src"/*.safetensors | wc -c)
echo "source: $src, $(python3 -c "print(round($input_bytes / 1e9, 2))") GB; calibration: eval/shakespeare-heldout.txt," \
  "--samples $samples --seq-len $seq_len"
calibration=(--calibration eval/shakespeare-heldout.txt --samples "$samples" --seq-len "$seq_len")
printf '%-10s %7s %9s %9s %9s %10s %s\n' method threads wall_s user_s sys_s peak_RSS experts
for method in $methods; do
  case "$method" in
    ct-minmax | mse) flags=(--scale-rule "$method") ;;
    imatrix | gptq) flags=(--method "$method" "${calibration[@]}") ;;
    *) echo "unknown method $method" >&2; exit 2 ;;
  esac
  for count in $threads; do
    out="$work/out-$method-$count"
    rm -rf "$out"
    RAYON_NUM_THREADS=$count /usr/bin/time -f '%e %U %S %M' -o "$work/time.txt" \
      "$squeeze" quantize "$src" "$out" --force --device cpu --json "${flags[@]}" >"$work/report-$method-$count.json" \
      2>"$work/stderr-$method-$count.txt"
    python3 - "$method" "$count" "$work/time.txt" "$work/report-$method-$count.json" <<'PY'
import json, sys
method, count, times, report = sys.argv[1], sys.argv[2], open(sys.argv[3]).read().split(), json.load(open(sys.argv[4]))
_wall, user, system, _max_rss_kb = times[-4:]
coverage = report.get("expert_coverage")
experts = (f"{coverage['calibrated']} calibrated, {coverage['fell_back']} fell back to mse of {coverage['experts']}"
           if coverage else "")
print(f"{method:<10} {count:>7} {report['seconds']:9.1f} {float(user):9.1f} {float(system):9.1f} "
      f"{report['peak_rss_bytes'] / 2**20:7.0f}MiB {experts}")
PY
    rm -rf "$out"
  done
done
if [ "$factor" = 1 ]; then
  for count in $threads; do
    RAYON_NUM_THREADS=$count cargo test --release --quiet --lib quant::gptq_linalg::tests::factor_timing -- --ignored \
      --nocapture 2>/dev/null | grep '^factor'
  done
fi
