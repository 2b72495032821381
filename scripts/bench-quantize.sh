#!/usr/bin/env bash
# Quantize throughput against the I/O floor on this machine, for GLM-5 expert shapes ([2048, 6144] and
# [6144, 2048] FP8 blocks), at two checkpoint sizes, for the ct-minmax and mse scale rules of INT4 and for the
# FP4 formats (`--rules "ct-minmax nvfp4 mxfp4"`: the glm5-nvfp4 / glm5-mxfp4 recipes).
#
#   scripts/bench-quantize.sh [--ref BIN] [--sizes "0.1gb 2gb 8gb"] [--rules "ct-minmax mse"] [--rounds N] [WORKDIR]
#
# WORKDIR defaults to /tmp/squeeze-bench (needs ~25 GB free for the 8gb size). Sizes: 0.1gb (91 MB: 3 layers of
# 16 experts of [512, 1024]), 2gb, 8gb (default "2gb 8gb"); k3-2gb and k3-8gb are Kimi K3-shaped sources
# (`synth --arch kimi-k3`: MXFP4 experts of K3's [3072, 3584] / [3584, 3072], hidden 7168) whose rules nvfp4 (the
# lossless cast), mxfp4 (bytes passed through) and int4 run the kimi-k3-* recipes (`--sizes k3-2gb --rules
# "nvfp4 mxfp4 int4"`). With --ref, every quantize also runs with BIN (another
# squeeze binary, e.g. one built from main), interleaved with this tree's binary in each round, and the summary
# gives the speed ratio of the two per rule, and each binary's mse / ct-minmax time ratio, from the same run.
#
# Floor = time to read the input shards (cat > /dev/null) + time to write and fsync as many bytes as the
# output holds (dd). Both run right before quantize, so the page cache is in the same state for both.
# Prints one line per run: input GB/s, floor GB/s, ratio (floor time / quantize time), wall and user CPU
# seconds, peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=""
sizes="2gb 8gb"
rules="ct-minmax mse"
rounds=1
work=/tmp/squeeze-bench
while [ $# -gt 0 ]; do
  case $1 in
    --ref) ref=$(realpath "$2"); shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --rules) rules=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench-quantize: unknown option $1" >&2; exit 2 ;;
    *) work=$1; shift ;;
  esac
done
mkdir -p "$work"
cargo build --release --quiet
bin=$PWD/target/release/squeeze
binaries=("$bin")
[ -z "$ref" ] || binaries=("$ref" "$bin")

# name layers experts hidden intermediate: 1 dense layer + (layers-1) MoE layers + 1 MTP layer (also MoE) of
# `experts` experts; 2gb / 8gb are GLM-5-shaped ([2048, 6144] gate/up, [6144, 2048] down, 37.7 MB of FP8 each):
# 2.6 GB and 8.5 GB of shards.
declare -A shape=(["0.1gb"]="3 16 1024 512" ["2gb"]="2 26 6144 2048" ["8gb"]="4 52 6144 2048"
                  ["k3-2gb"]="3 64 7168 3072" ["k3-8gb"]="5 112 7168 3072")
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
results=$(mktemp)
printf '%-6s %-9s %-6s %-5s %9s %9s %10s %7s %8s %8s %9s\n' size rule binary round input_GB q_GB/s floor_GB/s ratio seconds user_s peak_RSS
for name in $sizes; do
  read -r layers experts hidden intermediate <<<"${shape[$name]}"
  src="$work/src-$name"
  arch=glm5
  case $name in k3-*) arch=kimi-k3 ;; esac
  if [ ! -f "$src/config.json" ]; then
    "$bin" synth --arch "$arch" "$src" --layers "$layers" --experts "$experts" --hidden "$hidden" \
      --moe-intermediate "$intermediate" --vocab 4096 --shards 8 --force >/dev/null
  fi
  input_bytes=$(cat "$src"/*.safetensors | wc -c)
  for round in $(seq "$rounds"); do
    for rule in $rules; do
      for binary in "${binaries[@]}"; do
        label=new
        [ "$binary" = "$bin" ] || label=ref
        out="$work/out-$name-$rule"
        rm -rf "$out"
        case $arch:$rule in
          kimi-k3:*) how=(--recipe "kimi-k3-$rule" --engine vllm) ;;
          *:nvfp4|*:mxfp4) how=(--recipe "glm5-$rule" --engine vllm) ;;
          *) how=(--scale-rule "$rule") ;;
        esac
        planned=$("$binary" quantize "$src" "$out" "${how[@]}" --dry-run --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_bytes"])')
        # Floor: read the input, write + fsync the output size.
        t0=$(date +%s.%N)
        cat "$src"/*.safetensors >/dev/null
        dd if=/dev/zero of="$work/floor.bin" bs=8M count=$(( (planned + 8388607) / 8388608 )) conv=fsync status=none
        t1=$(date +%s.%N)
        rm -f "$work/floor.bin"
        /usr/bin/time -f %U -o "$work/user.txt" "$binary" quantize "$src" "$out" "${how[@]}" --device cpu --json >"$work/report.json"
        python3 - "$name" "$rule" "$label" "$round" "$input_bytes" "$t0" "$t1" "$(cat "$work/user.txt")" "$work/report.json" <<'PY' | tee -a "$results"
import json, sys
name, rule, label, round_, input_bytes, t0, t1, user = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7]), float(sys.argv[8])
r = json.load(open(sys.argv[9]))
floor = t1 - t0
q = r["seconds"]
print(f"{name:<6} {rule:<9} {label:<6} {round_:<5} {input_bytes/1e9:9.2f} {input_bytes/1e9/q:9.3f} {input_bytes/1e9/floor:10.3f} {floor/q:7.2f} {q:8.2f} {user:8.2f} {r['peak_rss_bytes']/2**20:6.0f}MiB")
PY
        rm -rf "$out"
      done
    done
  done
done
# Summary from the lines above: per size, mean seconds of each (rule, binary), then the ratios.
python3 - "$results" <<'PY'
import collections, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    size, rule, label, _round, *_rest = line.split()
    runs[(size, rule, label)].append((float(line.split()[8]), float(line.split()[9])))
mean = lambda values: sum(values) / len(values)
for size in dict.fromkeys(key[0] for key in runs):
    for label in ("ref", "new"):
        if (size, "mse", label) in runs and (size, "ct-minmax", label) in runs:
            wall = mean([w for w, _ in runs[(size, "mse", label)]]) / mean([w for w, _ in runs[(size, "ct-minmax", label)]])
            user = mean([u for _, u in runs[(size, "mse", label)]]) / mean([u for _, u in runs[(size, "ct-minmax", label)]])
            print(f"{size} {label}: mse / ct-minmax time  wall {wall:.2f}x  user CPU {user:.2f}x")
        for fp4 in ("nvfp4", "mxfp4"):
            if (size, fp4, label) in runs and (size, "ct-minmax", label) in runs:
                wall = mean([w for w, _ in runs[(size, fp4, label)]]) / mean([w for w, _ in runs[(size, "ct-minmax", label)]])
                user = mean([u for _, u in runs[(size, fp4, label)]]) / mean([u for _, u in runs[(size, "ct-minmax", label)]])
                print(f"{size} {label}: {fp4} / int4 ct-minmax time  wall {wall:.2f}x  user CPU {user:.2f}x")
    for rule in dict.fromkeys(key[1] for key in runs):
        if (size, rule, "ref") in runs and (size, rule, "new") in runs:
            wall = mean([w for w, _ in runs[(size, rule, "ref")]]) / mean([w for w, _ in runs[(size, rule, "new")]])
            user = mean([u for _, u in runs[(size, rule, "ref")]]) / mean([u for _, u in runs[(size, rule, "new")]])
            print(f"{size} {rule}: ref / new time  wall {wall:.2f}x  user CPU {user:.2f}x")
PY
rm -f "$results" "$work/user.txt" "$work/report.json"
