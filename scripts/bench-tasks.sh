#!/usr/bin/env bash
# `eval --task` throughput (issue 51) against the runtime's own forward: the multiple-choice tasks of
# eval/tempest-tasks.jsonl (each item's context run once per streamed layer, its choices' continuations stepped
# after it, all of a task's contexts and continuations together) at 0 and 3 shots (all the few-shot examples the file has) on the trained tiny models, beside
# `eval --data` on the same model in the same run (chunks of 256 tokens of The Tempest: the same forward with nothing
# to score but the next token). Prints items/s, tokens per item and tokens/s through the model, the ratio of task to
# plain-forward tokens/s, and with BASELINE=path/to/an/older/squeeze the same tasks on that binary (one that runs
# every choice with its own context) and its items/s over ours; the generation task (decode steps through the paged
# KV cache) on its own line. Asserts nothing.
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
printf '| model | shots | run | multiple choice: items/s | tokens/item | tokens/s | plain forward tokens/s | ratio | baseline items/s | tokens/item | speedup | generation: items/s |\n'
printf '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for model in eval/tiny-shakespeare-fp8 eval/tiny-shakespeare-glm45-fp8; do
  for run in $(seq "$runs"); do
    "$SQUEEZE" eval "$model" --data eval/shakespeare-heldout.txt --ctx 256 --chunks 96 --json > "$work/plain.json"
    "$SQUEEZE" eval "$model" --task "$work/generate.jsonl" --json > "$work/generate.json"
    for shots in 0 3; do
      "$SQUEEZE" eval "$model" --task "$work/choice.jsonl" --num-fewshot "$shots" --json > "$work/choice.json"
      echo '{}' > "$work/baseline.json"
      if [ -n "${BASELINE:-}" ]; then
        "$BASELINE" eval "$model" --task "$work/choice.jsonl" --num-fewshot "$shots" --json > "$work/baseline.json"
      fi
      python3 - "$model" "$run" "$work" "$shots" <<'PY'
import json, sys
model, run, work, shots = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
choice = json.load(open(f"{work}/choice.json"))
plain = json.load(open(f"{work}/plain.json"))
generate = json.load(open(f"{work}/generate.json"))
baseline = json.load(open(f"{work}/baseline.json"))
ratio = choice["tokens_per_second"] / plain["tokens_per_second"]
if baseline:
    base = (f"{baseline['items_per_second']:.1f} | {baseline['tokens'] / baseline['items']:.0f} | "
            f"{choice['items_per_second'] / baseline['items_per_second']:.2f}")
else:
    base = "– | – | –"
print(f"| {model.split('/')[-1]} | {shots} | {run} | {choice['items_per_second']:.1f} | "
      f"{choice['tokens'] / choice['items']:.0f} | {choice['tokens_per_second']:.0f} | "
      f"{plain['tokens_per_second']:.0f} | {ratio:.2f} | {base} | {generate['items_per_second']:.2f} |")
PY
    done
  done
done
