#!/usr/bin/env bash
# KDA's cost per token against context length, beside MLA: `squeeze serve-test` (CPU backend) on one-layer synthetic
# models — Kimi-Linear with its one layer KDA (a fixed-size state per request) and Kimi K2 with its one layer MLA
# (a KV cache that grows with the context), same hidden size and MLP — prefill tokens/s of a prompt of N tokens and
# decode tokens/s of 128 new tokens after it. KDA decode should stay flat in N; MLA decode grows with N. A third
# one-layer model, GLM-5.3-Flash's (`kda+mhc`: the same KDA layer and MLP with its safe gate, clamped SwiGLU and 4 mHC
# streams around both blocks), shows what mHC (computed on the host) adds per token.
# Usage: scripts/bench-kda.sh [KDA_CONTEXTS (default "1024 32768")] [MLA_CONTEXTS (default "1024 8192")]
# ($SQUEEZE names the binary to time, else target/release/squeeze, built first.)
set -euo pipefail
kda_contexts=${1:-"1024 32768"}
mla_contexts=${2:-"1024 8192"}
repo_root=$(cd "$(dirname "$0")/.." && pwd)
. "$repo_root/scripts/bench-lib.sh"
bin=$(squeeze_binary "$repo_root")
machine_line
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" synth --arch kimi-linear "$work/kda" --layers 1 >/dev/null
"$bin" synth --arch kimi-k2 "$work/mla" --layers 1 >/dev/null
"$bin" synth --arch glm5.3-flash "$work/hyb" --layers 1 >/dev/null
printf "%-7s %8s %14s %14s %16s\n" mixer context "prefill tok/s" "decode tok/s" "decode ms/token"
run() {
  local mixer=$1 model=$2 context=$3
  # The synthetic tokenizer is byte-level: a prompt of N bytes is N tokens.
  python3 -c "import sys; n=int(sys.argv[1]); t='paged caches and linear attention states ' * (n // 40 + 1); print(t[:n])" \
    "$context" >"$work/prompt.txt"
  "$bin" serve-test "$model" --prompts "$work/prompt.txt" --max-new-tokens 129 --page-size 64 \
    --allow-long-context --json >"$work/report.json"
  python3 - "$mixer" "$context" "$work/report.json" <<'PY'
import json, sys
mixer, context = sys.argv[1], int(sys.argv[2])
report = json.load(open(sys.argv[3]))
decode = report["decode_tokens_per_second"]
print(f"{mixer:<7} {context:8d} {report['prefill_tokens_per_second']:14.1f} {decode:14.1f} {1000 / decode:16.3f}")
PY
}
for context in $kda_contexts; do run kda "$work/kda" "$context"; done
for context in $mla_contexts; do run mla "$work/mla" "$context"; done
for context in $kda_contexts; do run kda+mhc "$work/hyb" "$context"; done
