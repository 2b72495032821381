#!/usr/bin/env bash
# squeeze's GPTQ against llm-compressor 0.14's GPTQModifier on the same job, in interleaved rounds: W4A16 group 32
# symmetric, routed experts only, damping 1 %, blocks of 128, no act-order, the same --samples x --seq-len random
# calibration ids, on a synthetic Kimi-K2-shaped model (`squeeze synth --arch kimi-k2 --layers 4 --hidden 1024
# --experts 32 --moe-intermediate 512` by default). Rows: squeeze `--method gptq` (experts see their routed tokens),
# llm-compressor (every expert sees every token: its MoE calibration default), squeeze `--method gptq
# --force-route-all` (the same statistics as llm-compressor). Wall, user CPU and peak RSS from /usr/bin/time per
# process. Where the model has an MTP layer (`--arch glm5`), squeeze keeps its experts BF16 (the detected recipe
# with `mtp = "bf16"`): transformers' model, which llm-compressor calibrates, has no MTP layer, so quantizing it
# would be work llm-compressor does not do. Prints a table; asserts nothing. Outside CI: needs the llm-compressor venv
# (scripts/oracle/gptq/setup.sh, or LLMC_PYTHON=path/to/python of a venv with llmcompressor 0.14).
#
#   scripts/bench-gptq-vs-llmcompressor.sh [--rounds 3] [--samples 32] [--seq-len 256] [--layers 4] [--hidden 1024]
#                                          [--experts 32] [--moe-intermediate 512] [--arch kimi-k2] [--no-llmc] [WORKDIR]
#   SQUEEZE=path/to/squeeze runs that binary instead of building target/release/squeeze.
# WORKDIR (default a temporary folder, removed at the end) keeps the source, ids and outputs between runs.
set -euo pipefail

rounds=3 samples=32 seq_len=256 layers=4 hidden=1024 experts=32 inner=512 arch=kimi-k2 llmc=1 work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --samples) samples="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --hidden) hidden="$2"; shift 2 ;;
    --experts) experts="$2"; shift 2 ;;
    --moe-intermediate) inner="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --no-llmc) llmc=0; shift ;;
    -*) echo "unknown argument $1" >&2; exit 2 ;;
    *) work="$1"; shift ;;
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
source scripts/bench-lib.sh
squeeze="$(squeeze_binary "$repo_root")"
python="$(llmc_python "$repo_root")"
if [ -z "$work" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
src="$work/$arch-$layers-$hidden-$experts-$inner"
ids="$work/ids-$samples-$seq_len.safetensors"
machine_line
if [ ! -f "$src/config.json" ]; then
  "$squeeze" synth --arch "$arch" "$src" --layers "$layers" --hidden "$hidden" --experts "$experts" \
    --moe-intermediate "$inner" --force >/dev/null
fi
vocab=$(python3 -c "import json; print(json.load(open('$src/config.json'))['vocab_size'])")
if [ ! -f "$ids" ]; then
  # Random ids in the synth vocabulary, fixed seed: the same input_ids for both tools.
  python3 scripts/calibration_ids.py random "$ids" "$samples" "$seq_len" "$vocab"
fi
echo "source: $src ($(du -sh "$src" | cut -f1)); calibration: $samples x $seq_len random ids"

measure() {  # label, command...: one line of wall, user, peak RSS
  local label="$1"; shift
  timed "$work" "$@" || { echo "$label failed"; return 1; }
  printf '%-44s %5s %8s %8s %9s GB   load %s\n' "$label" "$round" "$WALL" "$USER_CPU" "$RSS_GB" "$LOAD"
}

if [ "$llmc" = 1 ]; then
  "$python" scripts/llmcompressor_gptq.py "$src" "$ids" "$work/llmc" --prepare
fi
calibration=(--method gptq --calibration "$ids" --samples "$samples" --engine none --force)
mtp_layers=$(python3 -c "import json; print(json.load(open('$src/config.json')).get('num_nextn_predict_layers', 0))")
if [ "$mtp_layers" != 0 ]; then
  recipe=$("$squeeze" quantize "$src" "$work/dry-run" --dry-run 2>&1 | sed -n 's/.* with recipe \([^:]*\):.*/\1/p' | head -1)
  { echo 'mtp = "bf16"'; cat "recipes/$recipe.toml"; } >"$work/recipe-no-mtp.toml"
  calibration+=(--recipe "$work/recipe-no-mtp.toml")
  echo "squeeze: recipe $recipe with the MTP layer's experts kept BF16 (llm-compressor's model has no MTP layer)"
fi
printf '%-44s %5s %8s %8s %12s\n' run round wall_s user_s peak_RSS
for round in $(seq 1 "$rounds"); do
  measure "squeeze --method gptq" "$squeeze" quantize "$src" "$work/out-default" "${calibration[@]}"
  if [ "$llmc" = 1 ]; then
    measure "llm-compressor GPTQModifier" "$python" scripts/llmcompressor_gptq.py "$src" "$ids" "$work/llmc"
  fi
  measure "squeeze --method gptq --force-route-all" "$squeeze" quantize "$src" "$work/out-all" "${calibration[@]}" \
    --force-route-all
done
