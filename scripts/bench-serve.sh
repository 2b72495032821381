#!/usr/bin/env bash
# Decode tokens/s of `squeeze serve-test` at concurrency 1, 8 and 32 on a synthetic model, with mapping verification
# on and off, and the verification time as a share of decode step time (timed inside the verify-on run).
# Usage: scripts/bench-serve.sh [ARCH (kimi-k2|glm5|glm45)] [MAX_NEW_TOKENS]
set -euo pipefail
arch=${1:-kimi-k2}
new=${2:-32}
cargo build --release --quiet
bin=target/release/squeeze
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" synth --arch "$arch" "$work/model" >/dev/null
for i in $(seq 1 32); do echo "prompt number $i about paged caches and tags"; done >"$work/prompts.txt"
printf "%-6s %-11s %12s %12s %14s\n" arch concurrency "tok/s verify" "tok/s off" "verify share"
for concurrency in 1 8 32; do
  on=$("$bin" serve-test "$work/model" --prompts "$work/prompts.txt" --max-new-tokens "$new" \
    --concurrency "$concurrency" --page-size 16 --json)
  off=$("$bin" serve-test "$work/model" --prompts "$work/prompts.txt" --max-new-tokens "$new" \
    --concurrency "$concurrency" --page-size 16 --json --no-verify)
  python3 - "$arch" "$concurrency" "$on" "$off" <<'PY'
import json, sys
arch, concurrency, on, off = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
print(f"{arch:<6} {concurrency:<11} {on['decode_tokens_per_second']:12.1f} {off['decode_tokens_per_second']:12.1f} "
      f"{100 * on['verify_share']:13.4f}%")
PY
done
