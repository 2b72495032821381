#!/usr/bin/env bash
# Compiles every kernels/*.cu with the CUDA 13.0 compiler (no GPU needed): PTX for sm_90 and cubins for sm_90a,
# prints registers, stack, spills and shared memory per kernel, and checks that the artifacts committed under
# kernels/build/ (embedded in the binary by `--features cuda`) are exactly what these sources produce.
#
#   scripts/check-kernels.sh            compile, print the resource table, fail if kernels/build/ is stale
#   scripts/check-kernels.sh --update   compile and refresh kernels/build/ (commit the result)
#
# The toolchain comes from PyPI wheels (pinned to 13.0: PTX from a newer compiler does not load on a 13.0 driver)
# into $SQUEEZE_CUDA_TOOLCHAIN (default .cuda-toolchain/, ~490 MB download, reused when present).
set -euo pipefail
cd "$(dirname "$0")/.."

update=0
[[ "${1:-}" == "--update" ]] && update=1

toolchain="${SQUEEZE_CUDA_TOOLCHAIN:-$PWD/.cuda-toolchain}"
packages=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85
    nvidia-cuda-runtime==13.0.96)
stamp="$toolchain/.squeeze-toolchain"
if [[ ! -x "$toolchain/nvidia/cu13/bin/nvcc" || "$(cat "$stamp" 2>/dev/null)" != "${packages[*]}" ]]; then
    echo "check-kernels: installing the CUDA 13.0 compiler into $toolchain" >&2
    rm -rf "$toolchain"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$toolchain" "${packages[@]}"
    echo "${packages[*]}" >"$stamp"
fi
cuda="$toolchain/nvidia/cu13"
export PATH="$cuda/bin:$PATH"
nvcc="$cuda/bin/nvcc"
"$nvcc" --version | tail -2 >&2

flags=(-std=c++17 -O3 -fmad=false -I kernels --Werror all-warnings)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/build"

printf '%-28s %-8s %9s %11s %12s %11s %10s\n' kernel arch registers "stack (B)" "spill st (B)" "spill ld (B)" "smem (B)"
status=0
for source in kernels/*.cu; do
    name="$(basename "$source" .cu)"
    "$nvcc" "${flags[@]}" -ptx -arch=sm_90 "$source" -o "$work/build/$name.sm_90.ptx"
    "$nvcc" "${flags[@]}" -cubin -arch=sm_90a -Xptxas -v "$source" -o "$work/build/$name.sm_90a.cubin" \
        2>"$work/$name.ptxas" || { cat "$work/$name.ptxas" >&2; exit 1; }
    # ptxas -v: "Function properties for K" / "N bytes stack frame, N bytes spill stores, N bytes spill loads" /
    # "Used N registers, ..., N bytes smem, ...".
    awk '
        /Function properties for/ { kernel = $NF }
        /bytes stack frame/ { stack = $1; stores = $5; loads = $9 }
        /Used [0-9]+ registers/ {
            registers = $0; sub(/.*Used /, "", registers); sub(/ registers.*/, "", registers)
            smem = 0
            if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", smem) }
            printf "%-28s %-8s %9s %11s %12s %11s %10s\n", kernel, "sm_90a", registers, stack, stores, loads, smem
            if (stores + 0 > 0 || loads + 0 > 0) spilled = spilled " " kernel
        }
        END { if (spilled != "") print "  note: spills in" spilled > "/dev/stderr" }
    ' "$work/$name.ptxas"
done

for source in kernels/*.cu; do
    name="$(basename "$source" .cu)"
    if ! grep -q "family: \"$name\"" src/runtime/device/artifacts.rs; then
        echo "check-kernels: $source is not embedded: add its family to ARTIFACTS in src/runtime/device/artifacts.rs" >&2
        status=1
    fi
    if ! grep -q "#include \"../$name.cu\"" kernels/emulation/server.cpp; then
        echo "check-kernels: $source is not in the emulated device: #include it in kernels/emulation/server.cpp" >&2
        status=1
    fi
done

if [[ $update == 1 ]]; then
    rm -rf kernels/build
    cp -r "$work/build" kernels/build
    echo "check-kernels: kernels/build/ refreshed; commit it" >&2
elif ! diff -rq "$work/build" kernels/build >"$work/diff" 2>&1; then
    cat "$work/diff" >&2
    echo "check-kernels: kernels/build/ is stale: a kernel changed without regenerating; run scripts/check-kernels.sh --update and commit" >&2
    status=1
else
    echo "check-kernels: kernels/build/ matches the sources" >&2
fi
exit $status
