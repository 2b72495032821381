#!/usr/bin/env bash
# DeepSeek-V4's decode cost per token by layer type against context length on the CPU runtime: one token through a
# V4-Flash-sized attention layer (hidden 4096, 64 heads of 512, window 128, CSA indexer 64 × 128 top-512; random
# weights) of each type — sliding window only, HCA (ratio 128), CSA (ratio 4 with its indexer) — over a cache as
# after N tokens. Sliding should stay flat in N, HCA grow by N/128 entries, CSA by its indexer's N/4 keys.
# Usage: scripts/bench-v4.sh [CONTEXTS (default "1024,32768")] [RUNS (default 2)]
set -euo pipefail
contexts=${1:-"1024,32768"}
runs=${2:-2}
repo_root=$(cd "$(dirname "$0")/.." && pwd)
. "$repo_root/scripts/bench-lib.sh"
machine_line
cd "$repo_root"
for run in $(seq "$runs"); do
  echo "run $run"
  V4_BENCH_CONTEXTS="$contexts" cargo test --release --lib v4_decode_timing -- --ignored --nocapture 2>/dev/null |
    grep '^v4-flash'
done
