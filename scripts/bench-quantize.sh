#!/usr/bin/env bash
# Quantize throughput against the I/O floor on this machine, for GLM-5 expert shapes ([2048, 6144] and
# [6144, 2048] FP8 blocks), at two checkpoint sizes, for the ct-minmax and mse scale rules.
#
#   scripts/bench-quantize.sh [WORKDIR]        (default WORKDIR: /tmp/squeeze-bench; needs ~25 GB free)
#
# Floor = time to read the input shards (cat > /dev/null) + time to write and fsync as many bytes as the
# output holds (dd). Both run right before quantize, so the page cache is in the same state for both.
# Prints one line per run: input GB/s, floor GB/s, ratio (floor time / quantize time), peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/squeeze-bench}
mkdir -p "$work"
cargo build --release --quiet
bin=target/release/squeeze

# name layers experts: 1 dense layer + (layers-1) MoE layers + 1 MTP layer (also MoE) of `experts` GLM-5-shaped
# experts ([2048, 6144] gate/up, [6144, 2048] down, 37.7 MB of FP8 each): 2.1 GB and 8.1 GB of shards.
sizes=("2gb 2 26" "8gb 4 52")
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(date -u +%F)"
printf '%-5s %-9s %10s %10s %10s %8s %8s %10s\n' size rule input_GB q_GB/s floor_GB/s ratio seconds peak_RSS
for entry in "${sizes[@]}"; do
  read -r name layers experts <<<"$entry"
  src="$work/src-$name"
  if [ ! -f "$src/config.json" ]; then
    "$bin" synth --arch glm5 "$src" --layers "$layers" --experts "$experts" --hidden 6144 \
      --moe-intermediate 2048 --vocab 4096 --shards 8 --force >/dev/null
  fi
  for rule in ct-minmax mse; do
    out="$work/out-$name-$rule"
    rm -rf "$out"
    input_bytes=$(cat "$src"/*.safetensors | wc -c)
    planned=$("$bin" quantize "$src" "$out" --scale-rule "$rule" --dry-run --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_bytes"])')
    # Floor: read the input, write + fsync the output size.
    t0=$(date +%s.%N)
    cat "$src"/*.safetensors >/dev/null
    dd if=/dev/zero of="$work/floor.bin" bs=8M count=$(( (planned + 8388607) / 8388608 )) conv=fsync status=none
    t1=$(date +%s.%N)
    rm -f "$work/floor.bin"
    report=$("$bin" quantize "$src" "$out" --scale-rule "$rule" --json)
    python3 - "$name" "$rule" "$input_bytes" "$t0" "$t1" <<PY
import json, sys
name, rule, input_bytes, t0, t1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
r = json.loads('''$report''')
floor = t1 - t0
q = r["seconds"]
print(f"{name:<5} {rule:<9} {input_bytes/1e9:10.2f} {input_bytes/1e9/q:10.3f} {input_bytes/1e9/floor:10.3f} {floor/q:10.2f} {q:8.1f} {r['peak_rss_bytes']/2**20:8.0f}MiB")
PY
    rm -rf "$out"
  done
done
