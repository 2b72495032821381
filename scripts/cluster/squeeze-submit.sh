#!/usr/bin/env bash
# Submits a split squeeze job to Slurm: an array of N parts (scripts/cluster/squeeze-parts.sbatch) and, after every
# part succeeded (--dependency=afterok), the merge.
#
#   scripts/cluster/squeeze-submit.sh N quantize SOURCE OUT [quantize flags…]        # then: squeeze merge OUT
#   scripts/cluster/squeeze-submit.sh N eval STATS_DIR [eval arguments…]              # then: squeeze merge-eval …
#   scripts/cluster/squeeze-submit.sh N calibrate-kv STATS_DIR MODEL [flags…]         # then: squeeze merge-calib …
#
# Extra sbatch options (partition, account) go in SBATCH_PARTITION, SBATCH_ACCOUNT, … as sbatch reads them.
# SQUEEZE names the binary on the nodes (default: squeeze on PATH).
set -euo pipefail
set -f # no globbing here: the merge's pattern is expanded when the merge runs

[ $# -ge 3 ] || { echo "usage: squeeze-submit.sh N quantize|eval|calibrate-kv ARGS…" >&2; exit 2; }
parts="$1"; shift
case "$parts" in ''|*[!0-9]*|0) echo "squeeze-submit: N must be a positive integer, got '$parts'" >&2; exit 2 ;; esac
here="$(cd "$(dirname "$0")" && pwd)"
squeeze="${SQUEEZE:-squeeze}"
job="$1"
case "$job" in
  quantize) merge=("$squeeze" merge "$3") ;;
  eval) merge=("$squeeze" merge-eval "$2"/part-*-of-"$(printf '%05d' "$parts")".safetensors) ;;
  calibrate-kv) merge=("$squeeze" merge-calib "$3" "$2"/part-*-of-"$(printf '%05d' "$parts")".safetensors) ;;
  *) echo "squeeze-submit: unknown job '$job': quantize, eval or calibrate-kv" >&2; exit 2 ;;
esac
array=$(sbatch --parsable --array="1-$parts" "$here/squeeze-parts.sbatch" "$@")
# The merge's glob is expanded when it runs, on the shared storage, not now.
printf -v merge_command '%q ' "${merge[@]}"
merge_command="${merge_command//\\\*/*}"
merged=$(sbatch --parsable --dependency="afterok:${array%%;*}" --job-name=squeeze-merge \
  --output=squeeze-merge-%j.out --wrap="$merge_command")
echo "parts: job array $array ($parts tasks); merge: job $merged (after all parts succeeded)"
