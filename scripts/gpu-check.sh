#!/usr/bin/env bash
# GPU check of a prebuilt `squeeze` (built with `cargo build --release --features cuda` on the development machine,
# x86-64 glibc 2.36): every kernel (quantize and runtime) against the CPU path, kernel and pipeline benchmarks, the
# runtime commands on cuda against cpu, a layer-streamed eval of a GLM-5-shaped INT4 model against its upload time,
# then an end-to-end GPU quantize of a synthetic GLM-5-shaped checkpoint against the time to read its input and
# write its output. Needs an NVIDIA GPU with a CUDA 13.0+ driver (libcuda.so.1) and bash/coreutils/awk; no Rust,
# no CUDA toolkit. Finishes in < 9 min.
#
# Device steps (exactly what to run on the GPU machine):
#   1. copy the binary and this script over: target/release/squeeze  scripts/gpu-check.sh
#   2. bash gpu-check.sh ./squeeze [WORK_DIR]        (WORK_DIR: a local disk with ~20 GB free; default /tmp)
#   3. keep the output: the self-test table (op, shape, max rel error vs CPU, time, GB/s, share of device copy
#      bandwidth) and the end-to-end line; exit status 0 = every kernel matched and both runs succeeded.
# Knobs: EXPERTS (72) and LAYERS (3) size the synthetic checkpoint (~8 GB FP8 at hidden 6144, expert width 2048);
#        BENCH_ROWS (16384) sizes the kernel benchmark tensor [BENCH_ROWS, 6144].
set -euo pipefail

binary="${1:-./squeeze}"
work="${2:-/tmp}/squeeze-gpu-check.$$"
experts="${EXPERTS:-72}"
layers="${LAYERS:-3}"
bench_rows="${BENCH_ROWS:-16384}"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
step() { printf '\n== %s\n' "$*"; }
seconds() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# cuBLAS (the dense BF16 GEMMs) is loaded at run time as libcublas.so.13; a CUDA toolkit or PyTorch's nvidia-cublas
# wheel holds it outside the default library path. Without it squeeze runs its reference GEMM kernel and says so in
# the device line of the self-test.
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.13'; then
    sites="$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)"
    # shellcheck disable=SC2086
    cublas="$(find /usr/local /usr/lib /opt $sites -name 'libcublas.so.13*' 2>/dev/null | head -1 || true)"
    if [ -n "$cublas" ]; then
        export LD_LIBRARY_PATH="$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "libcublas: $cublas"
    else
        echo "libcublas.so.13 not found: the dense GEMMs run on the reference kernel"
    fi
fi

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv || true
"$binary" --version --verbose

step "self-test: every kernel vs the CPU path (fresh random inputs, poisoned outputs) and benchmarks"
timeout 300 "$binary" selftest --device cuda --bench-rows "$bench_rows"

step "runtime on cuda vs cpu: eval logits, parity, calibrate-kv and serve-test on a small model"
timeout 60 "$binary" synth --arch glm5 "$work/rt" --layers 2 --hidden 256 --experts 8 --moe-intermediate 128 \
    --vocab 512 >/dev/null
"$binary" quantize "$work/rt" "$work/rt-int4" --device cuda --force >/dev/null
printf 'Shall I compare thee to a summer%ss day? Thou art more lovely and more temperate.\n%.0s' "'" {1..40} \
    >"$work/text.txt"
for device in cpu cuda; do
    "$binary" eval "$work/rt-int4" --data "$work/text.txt" --ctx 64 --chunks 4 --device "$device" --json \
        --save-logits "$work/logits-$device.safetensors" >"$work/eval-$device.json"
    "$binary" calibrate-kv "$work/rt-int4" --data "$work/text.txt" --seq-len 64 --samples 4 --dry-run --json \
        --device "$device" >"$work/calib-$device.json"
    "$binary" serve-test "$work/rt-int4" --prompt "Shall I compare thee" --prompt "to a summer's day" \
        --max-new-tokens 8 --kv-dtype fp8 --json --device "$device" >"$work/serve-$device.json"
done
# The logits files are identical in layout; compare their f32 payloads after the (equal) headers.
cmp -s <(head -c 200 "$work/logits-cpu.safetensors") <(head -c 200 "$work/logits-cuda.safetensors") ||
    echo "logits headers differ"
grep -o '"mean_nll":[^,]*' "$work/eval-cpu.json" "$work/eval-cuda.json"
# Host↔device copies by kind and launches (issue 16): eval and decode keep activations on the device.
for report in eval-cuda serve-cuda; do
    python3 -c 'import json, sys; print(sys.argv[1], json.dumps(json.load(open(sys.argv[2])).get("device")))' \
        "$report" "$work/$report.json"
done
grep -o '"token_ids":\[[^]]*\]' "$work/serve-cpu.json" >"$work/tokens-cpu"
grep -o '"token_ids":\[[^]]*\]' "$work/serve-cuda.json" >"$work/tokens-cuda"
if cmp -s "$work/tokens-cpu" "$work/tokens-cuda"; then echo "serve-test greedy tokens: identical"; else
    echo "serve-test greedy tokens: DIFFERENT"; diff "$work/tokens-cpu" "$work/tokens-cuda" || true; fi
rm -rf "$work/rt" "$work/rt-int4"

step "layer-streamed eval of a GLM-5-shaped INT4 model (hidden 6144, experts of width 2048): per-layer time vs upload"
timeout 200 "$binary" synth --arch glm5 "$work/glm5" --hidden 6144 --moe-intermediate 2048 --experts 32 \
    --layers 3 --shards 4 >/dev/null
"$binary" quantize "$work/glm5" "$work/glm5-int4" --device cuda --force >/dev/null
rm -rf "$work/glm5"
"$binary" eval "$work/glm5-int4" --data "$work/text.txt" --ctx 64 --chunks 4 --device cuda --json >"$work/layer.json"
cat "$work/layer.json"
rm -rf "$work/glm5-int4"

step "byte identity: a small checkpoint quantized on the CPU and on the GPU, every rule"
timeout 60 "$binary" synth --arch glm5 "$work/small" --hidden 576 --moe-intermediate 320 --experts 8 >/dev/null
for rule in ct-minmax absmax7 mse; do
    "$binary" quantize "$work/small" "$work/small-cpu" --device cpu --scale-rule "$rule" --force >/dev/null
    "$binary" quantize "$work/small" "$work/small-gpu" --device cuda --scale-rule "$rule" --force >/dev/null
    for shard in "$work"/small-cpu/*.safetensors; do
        if cmp -s "$shard" "$work/small-gpu/$(basename "$shard")"; then
            echo "$rule $(basename "$shard"): identical"
        else
            echo "$rule $(basename "$shard"): DIFFERENT (for mse: count tied groups with squeeze verify / the self-test)"
            [[ $rule == mse ]] || exit 1
        fi
    done
done
rm -rf "$work/small" "$work/small-cpu" "$work/small-gpu"

step "synthetic GLM-5-shaped checkpoint: hidden 6144, expert width 2048, $experts experts, $layers layers"
timeout 150 "$binary" synth --arch glm5 "$work/in" --hidden 6144 --moe-intermediate 2048 --experts "$experts" \
    --layers "$layers" --shards 8
input_bytes=$(du -sb "$work/in" | cut -f1)
echo "input: $input_bytes bytes"

step "baseline: read the input and write an output-sized file"
sync
echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped: not root; the read may come from memory)"
t0=$(seconds)
cat "$work"/in/*.safetensors >/dev/null
t1=$(seconds)
# INT4 output is ~ 4.5/8 of the FP8 input for the experts; write that much and flush it.
output_estimate=$((input_bytes * 9 / 16))
dd if=/dev/zero of="$work/baseline.bin" bs=16M count=$((output_estimate / 16777216 + 1)) conv=fsync status=none
t2=$(seconds)
rm -f "$work/baseline.bin"
read_s=$(elapsed "$t0" "$t1")
write_s=$(elapsed "$t1" "$t2")
echo "read ${read_s} s, write ${write_s} s"

step "end-to-end GPU quantize (ct-minmax, then mse)"
for rule in ct-minmax mse; do
    sync
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    t0=$(seconds)
    timeout 150 "$binary" quantize "$work/in" "$work/out-$rule" --device cuda --scale-rule "$rule" --force >/dev/null
    sync
    t1=$(seconds)
    quantize_s=$(elapsed "$t0" "$t1")
    awk -v q="$quantize_s" -v r="$read_s" -v w="$write_s" -v b="$input_bytes" -v rule="$rule" 'BEGIN {
        printf "quantize %-9s %8.2f s  %6.2f GB/s input  %.2fx of read+write (%.2f s)  target <= 1.2x\n",
            rule, q, b / q / 1e9, q / (r + w), r + w }'
    rm -rf "$work/out-$rule"
done
