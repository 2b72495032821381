#!/usr/bin/env bash
# Prepares the one device-tool call that runs scripts/gpu-check.sh on a lent GPU, so that none of the session's
# 15 minutes of device time goes to a build or a broken script:
#   1. `cargo build --release --features cuda` (no CUDA needed here: the driver and cuBLAS load at run time);
#   2. the binary without its line tables into .gpu/squeeze (ignored by git): 80 MB with them is over the device
#      tool's 64 MiB carry limit, about 18 MB without;
#   3. a rehearsal of gpu-check.sh with that binary on the emulated device (REHEARSE=1, about a minute);
#   4. prints the device tool's `run` arguments.
# Then: call `run` with them, copy the numbers from the returned gpu-check.log into BENCHMARKS.md ("GPU (H200)
# targets", with the date), and `give_back` unless you rerun at once.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --features cuda
mkdir -p .gpu
objcopy --strip-debug target/release/squeeze .gpu/squeeze
echo "gpu-prepare: .gpu/squeeze $(du -h .gpu/squeeze | cut -f1)"
REHEARSE=1 bash scripts/gpu-check.sh .gpu/squeeze >.gpu/rehearsal.log 2>&1 || {
    tail -20 .gpu/rehearsal.log
    echo "gpu-prepare: the rehearsal on the emulated device failed (.gpu/rehearsal.log); fix it before using a GPU" >&2
    exit 1
}
sed -n '/^== summary/,$p' .gpu/rehearsal.log
cat <<'EOF'

gpu-prepare: ready. The device tool's run arguments:
  command:   set -o pipefail; bash scripts/gpu-check.sh .gpu/squeeze 2>&1 | tee $OUT/gpu-check.log
  carry:     [".gpu"]
  timeout_s: 600
EOF
