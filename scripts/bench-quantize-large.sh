#!/usr/bin/env bash
# Quantize throughput on a synthetic GLM-5-shaped checkpoint larger than RAM (opt-in, not run by CI: it writes
# ≈ 30 GB of input and ≈ 17 GB of output), against a cold-I/O floor measured in the same run.
#
#   scripts/bench-quantize-large.sh [--rule RULE] [--layers N] [--keep] WORKDIR
#
# WORKDIR must be on the disk to measure and hold input + output (+ the floor's output-sized file, removed before
# quantize runs): ≈ 50 GB at the default 12 layers × 64 experts (29.6 GB of FP8 input, 37.7 MB per expert).
# The input is deleted at the end unless --keep is given (a rerun with --keep reuses it).
#
# Floor = O_DIRECT read of every input shard (dd iflag=direct, so the page cache cannot serve it) + write of as
# many bytes as the output holds, fsync'd (dd conv=fsync) — the least I/O any conversion must do. The quantize run
# fsyncs each shard itself (io/writer.rs). Since the input is larger than RAM, quantize reads it from disk too.
# Prints: input GB, floor seconds (read + write), quantize seconds, GB/s of each, ratio floor / quantize, peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
rule=ct-minmax
layers=12
experts=64
keep=0
work=""
while [ $# -gt 0 ]; do
  case $1 in
    --rule) rule=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench-quantize-large: unknown option $1" >&2; exit 2 ;;
    *) work=$1; shift ;;
  esac
done
[ -n "$work" ] || { echo "usage: scripts/bench-quantize-large.sh [--rule RULE] [--layers N] [--keep] WORKDIR" >&2; exit 2; }
cargo build --release --quiet
bin=$PWD/target/release/squeeze
mkdir -p "$work"
src="$work/src"
out="$work/out-$rule"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(df -h "$work" | awk 'NR==2{print $4}') free, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ ! -f "$src/config.json" ]; then
  t0=$(date +%s.%N)
  "$bin" synth --arch glm5 "$src" --layers "$layers" --experts "$experts" --hidden 6144 --moe-intermediate 2048 \
    --vocab 4096 --shards 24 --force >/dev/null
  echo "synth: $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$t0" "$(date +%s.%N)") s"
fi
input_bytes=$(cat "$src"/*.safetensors | wc -c)
rm -rf "$out"
planned=$("$bin" quantize "$src" "$out" --scale-rule "$rule" --dry-run --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_bytes"])')
avail=$(df --output=avail -B1 "$work" | tail -1)
[ "$avail" -gt $((planned * 11 / 10)) ] || { echo "bench-quantize-large: $avail bytes free, output needs $planned" >&2; exit 2; }

t0=$(date +%s.%N)
for shard in "$src"/*.safetensors; do dd if="$shard" of=/dev/null bs=16M iflag=direct status=none; done
t1=$(date +%s.%N)
dd if=/dev/zero of="$work/floor.bin" bs=16M count=$(( (planned + 16777215) / 16777216 )) conv=fsync status=none
t2=$(date +%s.%N)
rm -f "$work/floor.bin"
"$bin" quantize "$src" "$out" --scale-rule "$rule" --device cpu --json >"$work/report.json"
python3 - "$rule" "$input_bytes" "$planned" "$t0" "$t1" "$t2" "$work/report.json" <<'PY'
import json, sys
rule, input_bytes, output_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0, t1, t2 = map(float, sys.argv[4:7])
r = json.load(open(sys.argv[7]))
read, write, q = t1 - t0, t2 - t1, r["seconds"]
floor = read + write
print(f"rule {rule}: input {input_bytes/1e9:.2f} GB, output {output_bytes/1e9:.2f} GB")
print(f"floor: O_DIRECT read {read:.1f} s ({input_bytes/1e9/read:.3f} GB/s) + fsync'd write {write:.1f} s ({output_bytes/1e9/write:.3f} GB/s) = {floor:.1f} s")
print(f"quantize: {q:.1f} s ({input_bytes/1e9/q:.3f} GB/s of input), ratio floor/quantize {floor/q:.2f}, peak RSS {r['peak_rss_bytes']/2**20:.0f} MiB")
PY
rm -rf "$out" "$work/report.json"
[ "$keep" = 1 ] || rm -rf "$src"
