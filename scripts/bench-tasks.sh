#!/usr/bin/env bash
# `eval --task` throughput (issue 51) against the runtime's own forward: the multiple-choice tasks of
# eval/tempest-tasks.jsonl (every choice's context + continuation run through the layers, all of a task's
# continuations together per streamed layer) on the trained tiny models, beside `eval --data` on the same model in
# the same run (chunks of 256 tokens of The Tempest: the same forward with nothing to score but the next token).
# Prints items/s, tokens/s through the model and the ratio of task to plain-forward tokens/s; the generation task
# (decode steps through the paged KV cache) on its own line. Asserts nothing.
#
#   scripts/bench-tasks.sh [RUNS (default 2)]
#   SQUEEZE=path/to/squeeze runs that binary instead of building target/release/squeeze.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-2}
. scripts/bench-lib.sh
machine_line
SQUEEZE=$(squeeze_binary "$PWD")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
grep -v '"task": "tempest-arithmetic"' eval/tempest-tasks.jsonl > "$work/choice.jsonl"
grep '"task": "tempest-arithmetic"' eval/tempest-tasks.jsonl > "$work/generate.jsonl"
printf '| model | run | multiple choice: items/s | tokens/s | plain forward tokens/s | ratio | generation: items/s | tokens/s |\n'
printf '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for model in eval/tiny-shakespeare-fp8 eval/tiny-shakespeare-glm45-fp8; do
  for run in $(seq "$runs"); do
    "$SQUEEZE" eval "$model" --task "$work/choice.jsonl" --json > "$work/choice.json"
    "$SQUEEZE" eval "$model" --data eval/shakespeare-heldout.txt --ctx 256 --chunks 96 --json > "$work/plain.json"
    "$SQUEEZE" eval "$model" --task "$work/generate.jsonl" --json > "$work/generate.json"
    python3 - "$model" "$run" "$work" <<'PY'
import json, sys
model, run, work = sys.argv[1], sys.argv[2], sys.argv[3]
choice = json.load(open(f"{work}/choice.json"))
plain = json.load(open(f"{work}/plain.json"))
generate = json.load(open(f"{work}/generate.json"))
ratio = choice["tokens_per_second"] / plain["tokens_per_second"]
print(f"| {model.split('/')[-1]} | {run} | {choice['items_per_second']:.1f} | {choice['tokens_per_second']:.0f} | "
      f"{plain['tokens_per_second']:.0f} | {ratio:.2f} | {generate['items_per_second']:.2f} | "
      f"{generate['tokens_per_second']:.0f} |")
PY
  done
done
