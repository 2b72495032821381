#!/usr/bin/env bash
# Benchmark of the layer-streamed CPU reference runtime: tokens/s of `squeeze eval` on a synthetic FP8 model of
# about 0.5 GB (Kimi K2 layout: 8 layers, hidden 1024, 48 experts of 512), and the split between loading /
# dequantizing weights and compute. Prints the numbers; asserts nothing (timings are not tests).
#
#   scripts/bench-runtime.sh [--arch kimi-k2|glm5|glm45] [--ctx 256] [--chunks 4] [--keep DIR]
set -euo pipefail

arch=kimi-k2 ctx=256 chunks=4 keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
cargo build --release --quiet
squeeze="$repo_root/target/release/squeeze"
work="${keep:-$(mktemp -d)}"
[ -n "$keep" ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"

if [ ! -f "$work/model/config.json" ]; then
  "$squeeze" synth --arch "$arch" "$work/model" --layers 8 --hidden 1024 --experts 48 --moe-intermediate 512 \
    --vocab 4096 --shards 4 --force >/dev/null
fi
# Text for the byte-level synthetic tokenizer: enough bytes for the chunks.
python3 - "$work/text.txt" "$((ctx * chunks * 2))" <<'PY'
import random, sys
random.seed(0)
words = "the of and to in a is that for it as was with be by on not he i this are or his from at which".split()
text = []
while sum(len(w) + 1 for w in text) < int(sys.argv[2]):
    text.append(random.choice(words))
open(sys.argv[1], "w").write(" ".join(text))
PY

echo "model: $(du -sh "$work/model" | cut -f1) on disk, $arch; ctx $ctx × $chunks chunks; $(nproc) cores"
"$squeeze" eval "$work/model" --data "$work/text.txt" --ctx "$ctx" --chunks "$chunks" --json > "$work/report.json"
python3 - "$work/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
total = r["load_seconds"] + r["compute_seconds"]
print(f"tokens/s            {r['tokens_per_second']:.1f}  ({r['chunks']} x {r['ctx']} tokens in {r['seconds']:.2f} s)")
print(f"load + dequantize   {r['load_seconds']:.2f} s  ({100 * r['load_seconds'] / total:.0f} %)")
print(f"compute             {r['compute_seconds']:.2f} s  ({100 * r['compute_seconds'] / total:.0f} %)")
print(f"perplexity          {r['ppl']:.2f}")
PY
