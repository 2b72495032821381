#!/usr/bin/env bash
# Proof that a change changed nothing: runs the same fixed set of commands with two squeeze binaries and compares
# every file they produce byte for byte (issue 15, "Proof that nothing changed").
#
#   scripts/check-unchanged.sh [--keep DIR] REF_BIN NEW_BIN
#
# With each binary in turn, in the same folder (so every path a binary records — manifest `source`, report
# `model`/`input`/`output`, `logits_file`, demo `folder` — is the same string and is compared, not ignored):
#   synth      kimi-k2, glm5, glm45 (default dims, seeds 1–3) and a small glm45 with other dims (seed 11); each
#              synthesized twice and compared with cmp (synth must be deterministic), the second copy removed;
#              kimi-k3 and deepseek-v4 (seed 4), each quantized with its nvfp4, mxfp4 and int4 recipes (--engine
#              vllm), inspected and verified against its source; `report kimi-k3` (16 × B200) and
#              `report deepseek-v4-flash`
#   quantize   every synth model with --scale-rule ct-minmax, absmax7 and mse; kimi-k2 with --group-size 16 and
#              --max-shard-size 1MB; kimi-k2, glm45 and glm5 with the fp8-block recipes of scripts/oracle/vllm/recipes
#              (--engine none); the embedded tiny Shakespeare model (eval/tiny-shakespeare-fp8); one --dry-run
#   inspect, verify --source   on the ct-minmax outputs
#   eval       --save-logits on FP8 sources and INT4 outputs, from a fixed --tokens file (3 × 48 token ids written
#              by this script) and from --data eval/sonnets.txt (--ctx 64 --chunks 3)
#   calibrate-kv   into a copy of the INT4 folder (with --sglang-json) and with --out DIR (GQA also --strategy head)
#   parity     eval --reference FP8 --candidate INT4+scales --json --plot (all four modes)
#   serve-test --json, --kv-pages 64: greedy BF16 KV, greedy --kv-dtype fp8, --prefill-model split, sampled
#              (--temperature 0.7 --top-p 0.9 --seed 5, --concurrency 2), --inject-fault swap
#   demo       --json --keep DIR on the trained model and with --arch glm5 (random weights)
# Every command's stdout, stderr and exit status are artifacts too (out/NAME.json|.stdout, .stderr, .rc).
# Commands run with --device cpu (the GPU probe does not enter the outputs) and RAYON_NUM_THREADS=2 (outputs were
# checked identical at 1, 2 and 5 threads; pinned so a future thread-count dependence cannot look like a change).
# One input depends on the machine: `demo`'s serve-test sizes its KV pool from available memory, capped at 65,536
# pages (`kv_pages`); the cap holds with 3.4 GiB or more available (below it `kv_pages` would follow the free
# memory of the moment and show as DIFFERS); every other serve-test gets --kv-pages 64.
#
# Compared: every file under the two run folders, one line per file (`same` / `DIFFERS` / `only in REF|NEW`).
# Files are compared with cmp, except the --json reports on stdout (out/*.json), which are compared after
# removing these fields, wherever they occur:
#   seconds, *_seconds, tokens_per_second, *_tokens_per_second, verify_share   wall-clock timings (and a ratio of two)
#   peak_rss_bytes                                                             allocator/OS state, not an output
#   uploads                                                                    GPU upload timings (absent on the CPU)
# Nothing else is ignored: stderr (warnings) is compared byte for byte; paths are compared, being identical by
# construction. Written files (shards, config.json, manifests, logits, SVG plots, demo folders) hold no timings.
#
# Exit status: 0 every artifact is the same, 1 some differ (or synth was not deterministic), 2 usage error or
# REF failed a command with an error (exit ≥ 2: the check itself is broken, so nothing is proven).
# --keep DIR keeps the run folders as DIR/ref and DIR/new (DIR must not exist yet).
set -euo pipefail

usage() {
  sed -n '5p' "$0" | sed 's/^#  *//' >&2
  exit 2
}

keep=""
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --keep) [ $# -ge 2 ] || usage; keep=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check-unchanged: unknown option $1" >&2; usage ;;
    *) args+=("$1"); shift ;;
  esac
done
[ ${#args[@]} -eq 2 ] || usage
repo=$(cd "$(dirname "$0")/.." && pwd)
ref_bin=$(realpath -m "${args[0]}")
new_bin=$(realpath -m "${args[1]}")
for bin in "$ref_bin" "$new_bin"; do
  [ -x "$bin" ] || { echo "check-unchanged: $bin is not an executable" >&2; exit 2; }
done
if [ -n "$keep" ]; then
  [ ! -e "$keep" ] || { echo "check-unchanged: --keep $keep already exists" >&2; exit 2; }
  mkdir -p "$keep"
  root=$(realpath "$keep")
else
  root=$(mktemp -d /tmp/check-unchanged.XXXXXX)
  trap 'rm -rf "$root"' EXIT
fi
export RAYON_NUM_THREADS=2

# Inputs shared by both runs (written once here, not by squeeze).
inputs=$root/inputs
mkdir -p "$inputs"
cp "$repo/eval/sonnets.txt" "$inputs/sonnets.txt"
cp -r "$repo/eval/tiny-shakespeare-fp8" "$inputs/tiny-shakespeare-fp8"
printf '%s\n' "Shall I compare thee" "The quick brown fox" "ROMEO.\nBut soft" "abc abc abc abc abc" >"$inputs/prompts.txt"
python3 - "$inputs/tokens.safetensors" <<'PY'
# 3 x 48 I32 token ids below 258 (every synth vocabulary holds them), from a fixed LCG.
import json, struct, sys
rows, ctx, state, ids = 3, 48, 12345, []
for _ in range(rows * ctx):
    state = (state * 1103515245 + 12345) % 2**31
    ids.append(state % 258)
data = struct.pack(f"<{len(ids)}i", *ids)
header = json.dumps({"input_ids": {"dtype": "I32", "shape": [rows, ctx], "data_offsets": [0, len(data)]}}).encode()
header += b" " * (-len(header) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + data)
PY

errors=0     # commands of REF that failed with exit >= 2
nondeterministic=0

# step NAME CMD...: run CMD, stdout to out/NAME.json (when CMD has --json) or out/NAME.stdout, stderr and exit
# status beside it. Exit 0 and 1 are results (1: a gate failed); anything else is an error, counted for REF.
step() {
  local name=$1 rc=0 ext=stdout arg
  shift
  for arg in "$@"; do [ "$arg" = --json ] && ext=json; done
  "$@" >"out/$name.$ext" 2>"out/$name.stderr" || rc=$?
  echo "$rc" >"out/$name.rc"
  if [ "$rc" -ge 2 ]; then
    echo "check-unchanged: $label: '$name' exited $rc: $(tail -n 2 "out/$name.stderr" | tr '\n' ' ')" >&2
    [ "$label" = REF ] && errors=$((errors + 1))
  fi
  return 0
}

run_all() {
  local sq=$1 arch seed name rule
  local tokens=$inputs/tokens.safetensors sonnets=$inputs/sonnets.txt prompts=$inputs/prompts.txt
  local recipes=$repo/scripts/oracle/vllm/recipes
  mkdir -p "$root/work/out"
  cd "$root/work"

  # name arch seed [dims]
  local models=("kimi kimi-k2 1" "glm5 glm5 2" "glm45 glm45 3"
    "glm45small glm45 11 --layers 2 --hidden 192 --experts 6 --moe-intermediate 96 --vocab 300 --shards 3")
  local entry extra
  for entry in "${models[@]}"; do
    read -r name arch seed extra <<<"$entry"
    # shellcheck disable=SC2086 # $extra is a list of options
    step "synth-$name" "$sq" synth --arch "$arch" "src-$name" --seed "$seed" $extra --json
    # shellcheck disable=SC2086
    "$sq" synth --arch "$arch" "again-$name" --seed "$seed" $extra >/dev/null 2>&1 || true
    if diff -rq "src-$name" "again-$name" >/dev/null; then
      echo "$label: synth $name twice: same"
    else
      echo "$label: synth $name twice: DIFFERS (synth is not deterministic)"
      nondeterministic=$((nondeterministic + 1))
    fi
    rm -rf "again-$name"
    for rule in ct-minmax absmax7 mse; do
      step "quantize-$name-$rule" "$sq" quantize "src-$name" "q-$name-$rule" --scale-rule "$rule" --device cpu --json
    done
  done
  step quantize-kimi-g16 "$sq" quantize src-kimi q-kimi-g16 --group-size 16 --max-shard-size 1MB --engine none \
    --device cpu --json
  step quantize-kimi-dry "$sq" quantize src-kimi q-kimi-dry --scale-rule mse --dry-run --device cpu --json
  step quantize-kimi-fp8block "$sq" quantize src-kimi q-kimi-fp8block \
    --recipe "$recipes/kimi-k2-int4-fp8block.toml" --engine none --device cpu --json
  step quantize-glm5-fp8block "$sq" quantize src-glm5 q-glm5-fp8block \
    --recipe "$recipes/kimi-k2-int4-fp8block.toml" --engine none --device cpu --json
  step quantize-glm45-fp8block "$sq" quantize src-glm45 q-glm45-fp8block \
    --recipe "$recipes/glm45-int4-fp8block.toml" --engine none --device cpu --json
  step quantize-shakespeare "$sq" quantize "$inputs/tiny-shakespeare-fp8" q-shakespeare --device cpu --json
  # The FP4-native generation as a source (Kimi K3, DeepSeek-V4): each recipe, then inspect and verify --source.
  for arch in kimi-k3 deepseek-v4; do
    step "synth-$arch" "$sq" synth --arch "$arch" "src-$arch" --seed 4 --json
    for rule in nvfp4 mxfp4 int4; do
      step "quantize-$arch-$rule" "$sq" quantize "src-$arch" "q-$arch-$rule" --recipe "$arch-$rule" --engine vllm \
        --device cpu --json
      step "inspect-$arch-$rule" "$sq" inspect "q-$arch-$rule" --json
      step "verify-$arch-$rule" "$sq" verify "q-$arch-$rule" --source "src-$arch" --json
    done
  done
  step report-kimi-k3 "$sq" report kimi-k3 --gpus 16 --gpu-memory b200-180g --json
  step report-deepseek-v4-flash "$sq" report deepseek-v4-flash --json

  for name in kimi glm5 glm45 glm45small; do
    step "inspect-$name" "$sq" inspect "q-$name-ct-minmax" --json
    step "verify-$name" "$sq" verify "q-$name-ct-minmax" --source "src-$name" --json
    step "eval-$name-fp8" "$sq" eval "src-$name" --tokens "$tokens" --save-logits "out/logits-$name-fp8.safetensors" \
      --device cpu --json
    step "eval-$name-int4" "$sq" eval "q-$name-ct-minmax" --tokens "$tokens" \
      --save-logits "out/logits-$name-int4.safetensors" --device cpu --json
  done
  step eval-kimi-mse-text "$sq" eval q-kimi-mse --data "$sonnets" --ctx 64 --chunks 3 \
    --save-logits out/logits-kimi-mse-text.safetensors --device cpu --json
  step eval-glm5-fp8-text "$sq" eval src-glm5 --data "$sonnets" --ctx 64 --chunks 3 \
    --save-logits out/logits-glm5-fp8-text.safetensors --device cpu --json
  step eval-shakespeare-int4-text "$sq" eval q-shakespeare --data "$sonnets" --ctx 64 --chunks 3 \
    --save-logits out/logits-shakespeare-int4-text.safetensors --device cpu --json

  for name in kimi glm5 glm45; do
    cp -r "q-$name-ct-minmax" "cal-$name" || true
    step "calibrate-$name" "$sq" calibrate-kv "cal-$name" --data "$sonnets" --seq-len 64 --samples 4 \
      --sglang-json "out/sglang-$name.json" --device cpu --json
    step "calibrate-$name-out" "$sq" calibrate-kv "q-$name-ct-minmax" --tokens "$tokens" --percentile 99.9 \
      --out "calout-$name" --device cpu --json
    step "parity-$name" "$sq" eval --reference "src-$name" --candidate "cal-$name" --tokens "$tokens" \
      --plot "out/parity-$name.svg" --device cpu --json
    step "serve-$name-bf16" "$sq" serve-test "cal-$name" --prompts "$prompts" --max-new-tokens 12 --kv-pages 64 \
      --device cpu --json
    step "serve-$name-fp8" "$sq" serve-test "cal-$name" --prompts "$prompts" --max-new-tokens 12 --kv-pages 64 \
      --kv-dtype fp8 --device cpu --json
    step "serve-$name-split" "$sq" serve-test "cal-$name" --prefill-model "src-$name" --prompts "$prompts" \
      --max-new-tokens 12 --kv-pages 64 --kv-dtype fp8 --device cpu --json
    step "serve-$name-sampled" "$sq" serve-test "cal-$name" --prompts "$prompts" --max-new-tokens 12 --kv-pages 64 \
      --temperature 0.7 --top-p 0.9 --seed 5 --concurrency 2 --device cpu --json
    step "serve-$name-fault" "$sq" serve-test "cal-$name" --prompts "$prompts" --max-new-tokens 12 --kv-pages 64 \
      --inject-fault swap@2 --device cpu --json
  done
  step calibrate-glm45-head "$sq" calibrate-kv q-glm45-ct-minmax --tokens "$tokens" --strategy head \
    --out calout-glm45-head --device cpu --json

  step demo "$sq" demo --keep demo-trained --json
  step demo-glm5 "$sq" demo --arch glm5 --keep demo-glm5 --json
  cd "$root"
}

# same_json A B: prints nothing and succeeds when the reports agree without the ignored fields, else prints the
# first differing field.
same_json() {
  python3 - "$1" "$2" <<'PY'
import json, sys

def strip(value):
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if not ignored(k, v)}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value

def ignored(key, value):
    if key == "uploads":
        return True
    timing = key in ("seconds", "tokens_per_second", "verify_share", "peak_rss_bytes") or key.endswith(
        ("_seconds", "_tokens_per_second"))
    return timing and (isinstance(value, (int, float)) or value is None)

def first_difference(a, b, path):
    if type(a) is not type(b):
        return path
    if isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{path}.{key} (present in one only)"
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        if list(a) != list(b):
            return f"{path} (key order)"
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})"
        for index, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{index}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {json.dumps(a)[:60]} vs {json.dumps(b)[:60]}"

try:
    reports = [strip(json.load(open(path))) for path in sys.argv[1:3]]
except ValueError as error:
    # Not JSON (e.g. an error exit printed nothing): compare as bytes.
    same = open(sys.argv[1], "rb").read() == open(sys.argv[2], "rb").read()
    sys.exit(0 if same else print("not JSON, bytes differ") or 1)
found = first_difference(reports[0], reports[1], "$")
if found:
    print(found)
    sys.exit(1)
PY
}

started=$(date +%s)
for side in ref new; do
  if [ $side = ref ]; then label=REF bin=$ref_bin; else label=NEW bin=$new_bin; fi
  echo "$label: $bin"
  run_all "$bin"
  mv "$root/work" "$root/$side"
done
echo "ran both binaries in $(($(date +%s) - started)) s"
if [ "$errors" -gt 0 ]; then
  echo "check-unchanged: REF failed $errors command(s) with an error; fix the check before trusting it" >&2
  exit 2
fi

differ=0
count=0
while IFS= read -r file; do
  count=$((count + 1))
  a=$root/ref/$file b=$root/new/$file
  if [ ! -f "$a" ]; then
    printf '%-8s %s (only in NEW)\n' DIFFERS "$file"; differ=$((differ + 1)); continue
  fi
  if [ ! -f "$b" ]; then
    printf '%-8s %s (only in REF)\n' DIFFERS "$file"; differ=$((differ + 1)); continue
  fi
  if [[ $file == out/*.json ]]; then
    if why=$(same_json "$a" "$b"); then
      printf '%-8s %s\n' same "$file"
    else
      printf '%-8s %s (%s)\n' DIFFERS "$file" "$why"; differ=$((differ + 1))
    fi
  elif why=$(cmp "$a" "$b" 2>&1); then
    printf '%-8s %s\n' same "$file"
  else
    printf '%-8s %s (%s)\n' DIFFERS "$file" "${why#"$a $b "}"; differ=$((differ + 1))
  fi
done < <( (cd "$root/ref" && find . -type f; cd "$root/new" && find . -type f) | sed 's|^\./||' | LC_ALL=C sort -u)

echo "$count artifacts, $differ differ$([ -n "$keep" ] && echo "; kept in $root/ref and $root/new")"
if [ "$differ" -gt 0 ] || [ "$nondeterministic" -gt 0 ]; then
  exit 1
fi
exit 0
