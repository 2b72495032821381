#!/usr/bin/env bash
# GPU check of a prebuilt `squeeze` (built with `cargo build --release --features cuda` on the development machine,
# x86-64 glibc 2.36): every kernel (quantize and runtime) against the CPU path, kernel and pipeline benchmarks, the
# runtime commands on cuda against cpu, a layer-streamed eval of a GLM-5-shaped INT4 model against its upload time,
# then an end-to-end GPU quantize of a synthetic GLM-5-shaped checkpoint against the time to read its input and
# write its output. Needs an NVIDIA GPU with a CUDA 13.0+ driver (libcuda.so.1) and bash/coreutils/awk/python3; no
# Rust, no CUDA toolkit.
#
# From the development machine with the device tool (one call, inside its 10-minute command limit):
#   scripts/gpu-prepare.sh     builds, strips the binary into .gpu/ (the unstripped 80 MB exceeds the tool's
#                              64 MiB carry limit) and prints the `run` command to give the device tool
# By hand on a GPU machine:
#   bash scripts/gpu-check.sh ./squeeze [WORK_DIR]    (WORK_DIR: a local disk with ~20 GB free; default /tmp)
#
# The steps run in order of value within BUDGET_S seconds (default 540): a step that would start with under 20 s
# left is skipped, each is cut at its own limit or the time left, and a failed step does not stop the later ones.
# The summary at the end lists every step as passed, FAILED or skipped; exit status 0 = every step passed.
#
# Knobs: STEPS (default "device selftest gptq runtime layer_stream byte_identity end_to_end") names the steps to run;
#        the diagnostic steps `profile` (Nsight Compute on the kernels furthest from their targets),
#        `layer_marginal` (the layer-streamed eval at 3 and 8 layers: the cost of one more layer against its upload)
#        and `h2d_floor` (PyTorch's pinned host-to-device copy at the sizes one layer's uploads come in) run only when
#        named; `gptq` (GPTQ's calibration pass at GLM-5 width on the CPU cores and on the GPU) runs by default.
#        EXPERTS (72) and LAYERS (3) size the synthetic checkpoint of the end-to-end quantize (~8 GB FP8 at hidden
#        6144, expert width 2048); BENCH_ROWS (16384) sizes the kernel benchmark tensor [BENCH_ROWS, 6144].
#        REHEARSE=1 runs every step on the emulated device (`--device emulated`, no benchmarks) at toy sizes, to
#        check this script on a machine without a GPU (about a minute on 2 cores; `cargo test` runs it).
set -uo pipefail

binary="$(realpath "${1:-./squeeze}")"
work="${2:-/tmp}/squeeze-gpu-check.$$"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

if [[ "${REHEARSE:-0}" == 1 ]]; then
    device=emulated
    selftest_flags=(--no-bench)
    hidden=256 width=128 stream_experts=4 experts="${EXPERTS:-4}" layers="${LAYERS:-2}"
    small_hidden=256 small_width=128 ctx=16 chunks=1 long_ctx=32 long_chunks=1 text_lines=8
    # Every emulated CUDA thread is a fiber on the host: give each step 4 times its GPU limit.
    slack=4 budget="${BUDGET_S:-2400}" gptq_samples=2 gptq_length=32
else
    device=cuda
    selftest_flags=(--bench-rows "${BENCH_ROWS:-16384}")
    hidden=6144 width=2048 stream_experts=32 experts="${EXPERTS:-72}" layers="${LAYERS:-3}"
    small_hidden=576 small_width=320 ctx=64 chunks=4 long_ctx=1024 long_chunks=4 text_lines=200
    slack=1 budget="${BUDGET_S:-540}" gptq_samples=32 gptq_length=256
fi
export binary work device hidden width stream_experts experts layers small_hidden small_width ctx chunks \
    long_ctx long_chunks text_lines gptq_samples gptq_length
selftest_args="${selftest_flags[*]}"
export selftest_args

# cuBLAS (the dense BF16 GEMMs) is loaded at run time as libcublas.so.13; a CUDA toolkit or PyTorch's nvidia-cublas
# wheel holds it outside the default library path. Without it squeeze runs its reference GEMM kernel and says so in
# the device line of the self-test.
if [[ $device == cuda ]] && ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.13'; then
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

# A text of `text_lines` lines (about 80 byte tokens each) for the evals.
# shellcheck disable=SC2016
eval "printf 'Shall I compare thee to a summer%ss day? Thou art more lovely and more temperate.\n%.0s' \"'\" {1..$text_lines}" \
    >"$work/text.txt"

# ---- the steps, most valuable first; each runs in its own `bash -e` with the variables above ----

step_device() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
        --format=csv || true
    "$binary" --version --verbose
}

step_selftest() {
    # shellcheck disable=SC2086
    "$binary" selftest --device "$device" $selftest_args
}

# eval (logits, NLL), calibrate-kv and serve-test on cpu and on the device, on a small INT4 GLM-5 model.
step_runtime() {
    "$binary" synth --arch glm5 "$work/rt" --layers 2 --hidden 256 --experts 8 --moe-intermediate 128 --vocab 512 \
        >/dev/null
    "$binary" quantize "$work/rt" "$work/rt-int4" --device "$device" --force >/dev/null
    for d in cpu "$device"; do
        "$binary" eval "$work/rt-int4" --data "$work/text.txt" --ctx "$ctx" --chunks "$chunks" --device "$d" --json \
            --save-logits "$work/logits-$d.safetensors" >"$work/eval-$d.json"
        "$binary" calibrate-kv "$work/rt-int4" --data "$work/text.txt" --seq-len "$ctx" --samples "$chunks" --dry-run \
            --json --device "$d" >"$work/calib-$d.json"
        "$binary" serve-test "$work/rt-int4" --prompt "Shall I compare thee" --prompt "to a summer's day" \
            --max-new-tokens 8 --kv-dtype fp8 --json --device "$d" >"$work/serve-$d.json"
    done
    python3 - "$work" "$device" <<'EOF'
import json, struct, sys
work, device = sys.argv[1], sys.argv[2]
def floats(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    body = data[8 + n:]
    return struct.unpack(f"<{len(body) // 4}f", body)
a, b = floats(f"{work}/logits-cpu.safetensors"), floats(f"{work}/logits-{device}.safetensors")
err = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 / max(sum(x * x for x in a) ** 0.5, 1e-30)
load = lambda name: json.load(open(f"{work}/{name}.json"))
ok = len(a) == len(b) and err <= 1e-4
print(f"eval logits rel L2 {device} vs cpu: {err:.2e} ({len(a)} values; tolerance 1e-4)")
print("mean_nll cpu", load("eval-cpu")["mean_nll"], device, load(f"eval-{device}")["mean_nll"])
tokens = lambda name: [r.get("token_ids") for r in load(name).get("requests", [])]
same = tokens("serve-cpu") == tokens(f"serve-{device}")
print("serve-test greedy tokens:", "identical" if same else "DIFFERENT", tokens(f"serve-{device}"))
# Host<->device copies by kind and launches (issue 16): eval and decode keep activations on the device.
for name in (f"eval-{device}", f"serve-{device}"):
    print(name, json.dumps(load(name).get("device")))
# The decode step's latency and its share spent in host<->device copies (decode_device: the decode steps only).
for d in ("cpu", device):
    s = load(f"serve-{d}")
    steps, seconds, copies = max(s["decode_steps"], 1), s["decode_seconds"], s.get("decode_device")
    line = f"serve-test {d}: {steps} decode steps, {seconds / steps * 1e3:.2f} ms per step, verification {s['verify_share']:.2%}"
    if copies:
        line += (f", copies {copies['copy_seconds'] / steps * 1e3:.3f} ms per step ({copies['copy_seconds'] / seconds:.1%}),"
                 f" {copies['launches'] / steps:.0f} launches per step")
    print(line)
sys.exit(0 if ok and same else 1)
EOF
}

# Layer-streamed INT4 eval at GLM-5 width: per-layer time against the upload time of the layer's weights (target
# <= 1.5x), at a few hundred tokens and, if time is left, at 4096.
step_layer_stream() {
    "$binary" synth --arch glm5 "$work/glm5" --hidden "$hidden" --moe-intermediate "$width" \
        --experts "$stream_experts" --layers 3 --shards 4 >/dev/null
    "$binary" quantize "$work/glm5" "$work/glm5-int4" --device "$device" --force >/dev/null
    rm -rf "$work/glm5"
    for shape in "$ctx $chunks" "$long_ctx $long_chunks"; do
        read -r c n <<<"$shape"
        "$binary" eval "$work/glm5-int4" --data "$work/text.txt" --ctx "$c" --chunks "$n" --device "$device" --json \
            >"$work/layer.json"
        python3 - "$work/layer.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
layers, up = r["layers"], r.get("uploads") or {}
# The whole eval's wall time per layer (reading, uploading and computing overlap), against the weight uploads'.
per_layer, upload = r["seconds"] / layers, up.get("seconds", 0.0) / layers
print(f"{r['tokens']} tokens: {per_layer * 1e3:.1f} ms per layer (compute {r['compute_seconds'] / layers * 1e3:.1f}, "
      f"waiting for weights {r['load_seconds'] / layers * 1e3:.1f}), weight upload {upload * 1e3:.1f} ms per layer "
      f"({up.get('bytes', 0) / layers / 1e6:.0f} MB), ratio {per_layer / max(upload, 1e-9):.2f} (target <= 1.5); "
      f"{r['tokens_per_second']:.0f} tokens/s")
print("device", json.dumps(r.get("device")))
EOF
    done
}

step_byte_identity() {
    "$binary" synth --arch glm5 "$work/small" --hidden "$small_hidden" --moe-intermediate "$small_width" --experts 8 \
        >/dev/null
    status=0
    for rule in ct-minmax absmax7 mse; do
        "$binary" quantize "$work/small" "$work/small-cpu" --device cpu --scale-rule "$rule" --force >/dev/null
        "$binary" quantize "$work/small" "$work/small-gpu" --device "$device" --scale-rule "$rule" --force >/dev/null
        for shard in "$work"/small-cpu/*.safetensors; do
            if cmp -s "$shard" "$work/small-gpu/$(basename "$shard")"; then
                echo "$rule $(basename "$shard"): identical"
            else
                echo "$rule $(basename "$shard"): DIFFERENT (for mse: count tied groups with squeeze verify / the self-test)"
                [[ $rule == mse ]] || status=1
            fi
        done
    done
    rm -rf "$work/small" "$work/small-cpu" "$work/small-gpu"
    return $status
}

# End-to-end GPU quantize of a synthetic GLM-5-shaped checkpoint against reading its input and writing an
# output-sized file (target <= 1.2x).
step_end_to_end() {
    "$binary" synth --arch glm5 "$work/in" --hidden "$hidden" --moe-intermediate "$width" --experts "$experts" \
        --layers "$layers" --shards 8 >/dev/null
    input_bytes=$(du -sb "$work/in" | cut -f1)
    echo "input: $input_bytes bytes ($experts experts, $layers layers)"
    drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped: not root)"; }
    drop
    t0=$(date +%s.%N)
    cat "$work"/in/*.safetensors >/dev/null
    t1=$(date +%s.%N)
    # INT4 output is ~ 4.5/8 of the FP8 input for the experts; write that much and flush it.
    dd if=/dev/zero of="$work/baseline.bin" bs=16M count=$((input_bytes * 9 / 16 / 16777216 + 1)) conv=fsync \
        status=none
    t2=$(date +%s.%N)
    rm -f "$work/baseline.bin"
    for rule in ct-minmax mse; do
        drop
        t3=$(date +%s.%N)
        "$binary" quantize "$work/in" "$work/out-$rule" --device "$device" --scale-rule "$rule" --force >/dev/null
        sync
        t4=$(date +%s.%N)
        awk -v r="$t0 $t1 $t2" -v q="$t3 $t4" -v b="$input_bytes" -v rule="$rule" 'BEGIN {
            split(r, a); split(q, c); read = a[2] - a[1]; write = a[3] - a[2]; s = c[2] - c[1]
            printf "quantize %-9s %8.2f s  %6.2f GB/s input  %.2fx of read %.2f s + write %.2f s  target <= 1.2x\n",
                rule, s, b / s / 1e9, s / (read + write), read, write }'
        rm -rf "$work/out-$rule"
    done
}

# ---- diagnostic steps (run only when STEPS names them) ----

# Nsight Compute on the kernels furthest from their targets in the self-test's benchmarks: the W4A16 matrix-vector
# kernel (batch 1 and 2), the FP8 paged decode, and the split GEMM's activation split and product join. `--op no-such-op`
# selects no correctness case, so only the benchmarks launch kernels.
step_profile() {
    if [[ $device != cuda ]]; then echo "profile: needs a GPU (rehearsal: skipped)"; return 0; fi
    ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1 || true)"
    [[ -n $ncu ]] || { echo "profile: ncu not found"; return 1; }
    for kernel in "w4a16_linear 2" "paged_decode_partial 2" "split_bf16 1" "join_products_f32 1"; do
        read -r name count <<<"$kernel"
        echo "-- $name (first $count launches of the benchmarks)"
        report="${OUT:-$work}/ncu-$name.txt" # the device tool brings $OUT back
        "$ncu" --clock-control none --set detailed -k "regex:^${name}\$" -c "$count" \
            "$binary" selftest --device cuda --op no-such-op --bench-rows 256 >"$report" 2>&1 || true
        grep -E '^  [a-z_0-9]+\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size|Waves Per SM|Mem Busy|Max Bandwidth|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|OPT|WRN|==ERROR==' \
            "$report" | cut -c1-220 | head -90
    done
}

# The layer-streamed eval at 3 and at 8 layers, same widths: the eval's fixed costs (embedding, lm_head, the first
# layer's unoverlapped load) cancel, leaving one more layer's cost against the upload time of its weights.
step_layer_marginal() {
    for n in 3 8; do
        "$binary" synth --arch glm5 "$work/glm5-$n" --hidden "$hidden" --moe-intermediate "$width" \
            --experts "$stream_experts" --layers "$n" --shards 4 >/dev/null
        "$binary" quantize "$work/glm5-$n" "$work/glm5-$n-int4" --device "$device" --force >/dev/null
        rm -rf "${work:?}/glm5-$n"
        "$binary" eval "$work/glm5-$n-int4" --data "$work/text.txt" --ctx "$ctx" --chunks "$chunks" \
            --device "$device" --json >"$work/marginal-$n.json"
        rm -rf "${work:?}/glm5-$n-int4"
    done
    python3 - "$work/marginal-3.json" "$work/marginal-8.json" <<'EOF'
import json, sys
a, b = (json.load(open(path)) for path in sys.argv[1:])
layers = b["layers"] - a["layers"]
def per(key, sub=None):
    get = lambda r: (r.get(key) or {}).get(sub, 0.0) if sub else r[key]
    return (get(b) - get(a)) / layers
for r in (a, b):
    up = r.get("uploads") or {}
    print(f"{r['layers']} layers: {r['seconds']:.2f} s (compute {r['compute_seconds']:.2f}, waiting for weights "
          f"{r['load_seconds']:.2f}), uploads {up.get('seconds', 0):.2f} s for {up.get('bytes', 0) / 1e6:.0f} MB")
upload, nbytes = per("uploads", "seconds"), per("uploads", "bytes")
print(f"one more layer: {per('seconds') * 1e3:.1f} ms (compute {per('compute_seconds') * 1e3:.1f}, waiting "
      f"{per('load_seconds') * 1e3:.1f}); its uploads {upload * 1e3:.1f} ms for {nbytes / 1e6:.0f} MB "
      f"({nbytes / max(upload, 1e-9) / 1e9:.1f} GB/s); ratio {per('seconds') / max(upload, 1e-9):.2f} (target <= 1.5)")
EOF
}

# PyTorch's pinned host-to-device copy: the floor for the resident uploads, whole and at the sizes of one GLM-5
# expert's packed matrices (3 MB) and scales (0.4 MB), each size timed over 1 GiB of copies.
step_h2d_floor() {
    if [[ $device != cuda ]]; then echo "h2d_floor: needs a GPU (rehearsal: skipped)"; return 0; fi
    python3 - <<'EOF'
import time, torch
total = 1 << 30
host = torch.empty(total, dtype=torch.uint8, pin_memory=True).random_(0, 255)
dev = torch.empty(total, dtype=torch.uint8, device="cuda")
for size in (total, 64 << 20, 3 << 20, 384 << 10):
    for _ in range(2):
        torch.cuda.synchronize(); t = time.perf_counter()
        for start in range(0, total, size):
            dev[start:start + size].copy_(host[start:start + size], non_blocking=True)
        torch.cuda.synchronize(); s = time.perf_counter() - t
    print(f"pinned h2d in pieces of {size / 1e6:8.2f} MB: {total / s / 1e9:6.1f} GB/s ({total // size} copies)")
pageable = host.clone().numpy()
torch.cuda.synchronize(); t = time.perf_counter()
dev.copy_(torch.from_numpy(pageable)); torch.cuda.synchronize()
print(f"pageable h2d 1 GiB: {total / (time.perf_counter() - t) / 1e9:.1f} GB/s")
EOF
}

# GPTQ's calibration pass (issues 34, 48) at GLM-5 width, the equal-work job of
# scripts/oracle/gptq/gpu-vs-llmcompressor.sh (`synth --arch glm5 --layers 2 --hidden 6144 --experts 8
# --moe-intermediate 2048`, the MTP layer's experts kept BF16 as transformers' model has none): the job with everything
# on this machine's CPU cores and with the pass on the GPU (its forward, and GPTQ's algebra: `gptq_algebra` in the
# report), routed and --force-route-all, wall and user CPU of each, and how many output bytes the two differ in
# (the forwards and the algebra round differently).
step_gptq() {
    local src="$work/gptq-src" ids="$work/gptq-ids.safetensors" recipe="$work/gptq-recipe.toml"
    "$binary" synth --arch glm5 "$src" --layers 2 --hidden "$hidden" --experts 8 --moe-intermediate "$width" \
        >/dev/null
    vocab=$(python3 -c "import json; print(json.load(open('$src/config.json'))['vocab_size'])")
    python3 scripts/calibration_ids.py random "$ids" "$gptq_samples" "$gptq_length" "$vocab"
    { echo 'mtp = "bf16"'; cat recipes/glm5-int4.toml; } >"$recipe"
    echo "source $(du -sh "$src" | cut -f1), $gptq_samples x $gptq_length random ids, $(nproc) cores"
    TIMEFORMAT='%R %U'
    for run in "cpu --force-route-all" "$device --force-route-all" "cpu" "$device"; do
        set -- $run
        out="$work/gptq-out-$1${2:+-all}"
        times=$({ time "$binary" quantize "$src" "$out" --method gptq --calibration "$ids" --samples "$gptq_samples" \
            --engine none --recipe "$recipe" --device "$@" --force --json >"$work/gptq-report.json"; } 2>&1)
        algebra=$(python3 -c "import json; print(json.load(open('$work/gptq-report.json'))['gptq_algebra'])")
        echo "gptq --device $run: wall ${times% *} s, user ${times#* } s, gptq_algebra $algebra"
    done
    for kind in -all ""; do
        differ=0
        for shard in "$work/gptq-out-cpu$kind"/*.safetensors; do
            n=$(cmp -l "$shard" "$work/gptq-out-$device$kind/$(basename "$shard")" 2>/dev/null | wc -l || true)
            differ=$((differ + n))
        done
        echo "cpu vs $device output${kind:+ (route-all)}: $differ bytes differ of $(du -sb "$work/gptq-out-cpu$kind" | cut -f1)"
    done
    rm -rf "$src" "$work"/gptq-out-*
}

# ---- the runner ----

names=() results=()
run_step() {
    local name="$1" limit=$(($2 * slack)) left=$((budget - SECONDS)) started=$SECONDS status
    if ((left < 20)); then
        printf '\n== %s: skipped (%d s of the %d s budget left)\n' "$name" "$left" "$budget"
        names+=("$name") results+=("skipped")
        return
    fi
    ((limit > left)) && limit=$left
    printf '\n== %s (at most %d s)\n' "$name" "$limit"
    timeout "$limit" bash -euo pipefail -c "$(declare -f "step_$name"); step_$name"
    status=$?
    case $status in
        0) results+=("passed in $((SECONDS - started)) s") ;;
        124) results+=("FAILED: cut at its limit of $limit s") ;;
        *) results+=("FAILED (exit $status) after $((SECONDS - started)) s") ;;
    esac
    names+=("$name")
    rm -rf "${work:?}"/rt "$work"/rt-int4 "$work"/glm5* "$work"/small* "$work"/in "$work"/out-*
}

declare -A limits=([device]=30 [selftest]=300 [runtime]=90 [layer_stream]=150 [byte_identity]=60 [end_to_end]=240
    [profile]=240 [layer_marginal]=200 [h2d_floor]=60 [gptq]=360)
for step in ${STEPS:-device selftest gptq runtime layer_stream byte_identity end_to_end}; do
    [[ -n ${limits[$step]:-} ]] || { echo "gpu-check: unknown step '$step' (known: ${!limits[*]})" >&2; exit 2; }
    run_step "$step" "${limits[$step]}"
done

printf '\n== summary (%d s of %d s, device %s)\n' "$SECONDS" "$budget" "$device"
failed=0
for i in "${!names[@]}"; do
    printf '%-16s %s\n' "${names[$i]}" "${results[$i]}"
    [[ ${results[$i]} == passed* ]] || failed=1
done
exit $failed
