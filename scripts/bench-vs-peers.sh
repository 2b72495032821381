#!/usr/bin/env bash
# squeeze's GPTQ against llm-compressor 0.14's GPTQModifier (issue 35) on the trained tiny models, the same job on
# both sides: W4A16 group 32 symmetric on the routed experts only, damping 1 %, blocks of 128, no act-order, the same
# calibration input_ids (--calibration text, default the sonnets, tokenized once by the model's tokenizer.json into
# whole rows of --seq-len tokens: scripts/calibration_ids.py). Every output is scored by
# `squeeze eval --reference FP8 --candidate OUT --modes weights` on The Tempest (held out of training; --ctx tokens
# per chunk, at most --chunks chunks): mean KLD ± stderr, same top-1 %, PPL ratio; each run is timed by
# /usr/bin/time (wall, user CPU, peak RSS of the whole process; the 1-minute load average before → after).
# Rows per model:
#   squeeze rtn                           the round-to-nearest baseline (ct-minmax, no calibration)
#   squeeze gptq                          each expert's Hessian from the tokens the router sends it
#   squeeze gptq --force-route-all        every expert's Hessian from every calibration token
#   llm-compressor GPTQModifier           its MoE default: every token through every expert (moe_calibrate_all_experts)
#   llm-compressor GPTQModifier --routed  moe_calibrate_all_experts=False: routed tokens only
# Where the jobs still differ: llm-compressor runs on a BF16 copy of the FP8 source (scripts/llmcompressor_gptq.py
# dequantizes it, untimed, rounding the dequantized weights to BF16) and calibrates in BF16; squeeze reads the FP8
# weights exactly and calibrates in f32. Both are sequential (layer L + 1 calibrated on layer L's quantized output).
# llm-compressor's time includes Python start-up, model load and save. Prints one markdown table; asserts nothing.
#
#   scripts/bench-vs-peers.sh [--model ARCH:DIR]... [--calibration FILE] [--seq-len 256] [--ctx 256] [--chunks 128]
#                             [--rounds 1] [--no-llmc] [WORKDIR]
#   SQUEEZE=path/to/squeeze runs that binary instead of building target/release/squeeze; LLMC_PYTHON=path/to/python
#   of a venv with llmcompressor 0.14 (default scripts/oracle/gptq/.venv; it also tokenizes the calibration text).
# Default models: the three trained tiny ones (eval/tiny-shakespeare-fp8, -glm45-fp8, -glm5-fp8). WORKDIR (default
# a temporary folder, removed at the end) keeps the ids, the BF16 copies and the outputs.
set -euo pipefail

models=() calibration=eval/sonnets.txt seq_len=256 ctx=256 chunks=128 rounds=1 llmc=1 work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) models+=("$2"); shift 2 ;;
    --calibration) calibration="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --no-llmc) llmc=0; shift ;;
    -*) echo "unknown argument $1" >&2; exit 2 ;;
    *) work="$1"; shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] ||
  models=(kimi-k2:eval/tiny-shakespeare-fp8 glm45:eval/tiny-shakespeare-glm45-fp8 glm5:eval/tiny-shakespeare-glm5-fp8)

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
source scripts/bench-lib.sh
squeeze="$(squeeze_binary "$repo_root")"
python="$(llmc_python "$repo_root")"
if [ -z "$work" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
results="$work/results.tsv"
: >"$results"
machine_line
echo "squeeze: $squeeze ($(git -C "$repo_root" rev-parse --short HEAD)); calibration: $calibration, rows of $seq_len" \
  "tokens; evaluation: eval/shakespeare-heldout.txt, --ctx $ctx, at most $chunks chunks"

for pair in "${models[@]}"; do
  arch=${pair%%:*} model=${pair#*:}
  dir="$work/$arch"
  mkdir -p "$dir"
  ids="$dir/ids.safetensors"
  samples=$("$python" scripts/calibration_ids.py text "$ids" "$calibration" "$model/tokenizer.json" "$seq_len")
  echo "$arch: $model, $samples × $seq_len calibration ids" >&2
  [ "$llmc" = 0 ] || "$python" scripts/llmcompressor_gptq.py "$model" "$ids" "$dir/llmc" --prepare
  gptq=(--method gptq --calibration "$ids" --samples "$samples")
  runs=("squeeze rtn" "squeeze gptq" "squeeze gptq --force-route-all")
  [ "$llmc" = 0 ] || runs+=("llm-compressor GPTQModifier" "llm-compressor GPTQModifier --routed")
  for round in $(seq 1 "$rounds"); do
    for run in "${runs[@]}"; do
      out="$dir/out-${run// /_}"
      quantize=("$squeeze" quantize "$model" "$out" --force --json --engine none --device cpu)
      case "$run" in
        "squeeze rtn") command=("${quantize[@]}") ;;
        "squeeze gptq") command=("${quantize[@]}" "${gptq[@]}") ;;
        "squeeze gptq --force-route-all") command=("${quantize[@]}" "${gptq[@]}" --force-route-all) ;;
        "llm-compressor GPTQModifier") command=("$python" scripts/llmcompressor_gptq.py "$model" "$ids" "$dir/llmc" --out "$out") ;;
        *) command=("$python" scripts/llmcompressor_gptq.py "$model" "$ids" "$dir/llmc" --out "$out" --routed) ;;
      esac
      timed "$dir" "${command[@]}"
      echo "  round $round $run: ${WALL} s wall, ${USER_CPU} s user, ${RSS_GB} GiB, load $LOAD" >&2
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$arch" "$model" "$run" "$round" "$WALL" "$USER_CPU" "$RSS_GB" "$LOAD" \
        >>"$results"
    done
  done
  # Scored once (the last round's outputs); gates off, the report is what is read.
  for run in "${runs[@]}"; do
    out="$dir/out-${run// /_}"
    "$squeeze" eval --reference "$model" --candidate "$out" --modes weights --data eval/shakespeare-heldout.txt \
      --ctx "$ctx" --chunks "$chunks" --device cpu --json --max-mean-kld 1e9 --min-same-top 0 --max-ppl-ratio 1e9 \
      >"$out.eval.json"
  done
done

python3 - "$results" "$work" <<'PY'
import collections, json, os, sys
results, work = sys.argv[1], sys.argv[2]
rows = collections.OrderedDict()
for line in open(results):
    arch, model, run, _round, wall, user, rss, load = line.rstrip("\n").split("\t")
    rows.setdefault((arch, model, run), []).append((wall, user, rss, load))
print("| model | run | mean KLD ± stderr | ÷ rtn | same top % | PPL ratio | wall s | user CPU s | peak RSS GiB | load |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
base = {}
for (arch, model, run), timings in rows.items():
    out = os.path.join(work, arch, "out-" + run.replace(" ", "_"))
    w = json.load(open(out + ".eval.json"))["modes"]["weights"]
    w = w.get("summary", w)
    if run == "squeeze rtn":
        base[arch] = w["mean_kld"]
    ratio = f"{w['mean_kld'] / base[arch]:.3f}" if arch in base else ""
    join = lambda i: " / ".join(t[i] for t in timings)
    print(f"| {os.path.basename(model)} | {run} | {w['mean_kld']:.3e} ± {w['mean_kld_stderr']:.1e} | {ratio} | "
          f"{w['same_top']:.2f} | {w['ppl_ratio']:.5f} | {join(0)} | {join(1)} | {join(2)} | {join(3)} |")
PY
