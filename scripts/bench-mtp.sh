#!/usr/bin/env bash
# MTP draft acceptance before deployment (issue 30): the trained tiny GLM-4.5-shaped model's FP8 source against
# its INT4 outputs with the MTP layer's routed experts quantized like the others (the built-in recipe) or kept BF16
# (the same recipe with `mtp = "bf16"`), each with round-to-nearest (ct-minmax) and GPTQ (its MTP experts
# calibrated from the MTP forward). One `squeeze eval --reference FP8 --candidate INT4 --mtp` per output on The
# Tempest (held out of training): acceptance of greedy depth-1 drafts, mean accepted length, the drafts' KLD from
# each model's own main model, the drop against FP8, and with `--mtp-depth 3` the mean accepted length of three
# chained drafts per step. GPTQ calibrates on the sonnets. Then speculative decoding
# itself: `squeeze serve-test --speculative mtp=K` (K = 1, 2, 3) on 8 prompts from The Tempest, 48 new tokens each,
# for the FP8 source and the INT4 outputs: acceptance per depth, tokens per pass of the main model, decode speed
# against plain greedy in the same run. Prints two tables; asserts nothing (serve-test itself exits 1 unless the
# speculative tokens equal plain greedy's).
#
#   scripts/bench-mtp.sh [--model DIR] [--ctx 256] [--chunks 8] [--keep DIR]
#   (--model: a GLM-4.5- or GLM-5-shaped FP8 folder with an MTP layer; default the trained tiny GLM-4.5 one,
#   eval/tiny-shakespeare-glm5-fp8 for GLM-5)
#   SQUEEZE=path/to/squeeze runs that binary instead of building target/release/squeeze.
set -euo pipefail
cd "$(dirname "$0")/.."
model=eval/tiny-shakespeare-glm45-fp8 ctx=256 chunks=8 keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "${SQUEEZE:-}" ]; then
  cargo build --release --quiet
  SQUEEZE=target/release/squeeze
fi
work=${keep:-$(mktemp -d)}
mkdir -p "$work"
printf '| MTP experts | method | acceptance %% ± stderr | mean accepted length | draft KLD ± stderr | drop vs FP8 (points) | chains of 3: mean accepted length, accepted through depth 1/2/3 %% |\n'
printf '| --- | --- | ---: | ---: | ---: | ---: | --- |\n'
row() {
  local label=$1 method=$2 out=$3 json
  json=$("$SQUEEZE" eval --reference "$model" --candidate "$out" --data eval/shakespeare-heldout.txt --ctx "$ctx" \
    --chunks "$chunks" --modes weights --mtp --mtp-depth 3 --max-mtp-drop 100 --json)
  python3 - "$label" "$method" "$json" <<'PY'
import json, sys
label, method, report = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
m = report["mtp"]
def chain(d):
    c = d["chain"]
    through = " / ".join(f"{x:.1f}" for x in c["accepted_through"])
    return f"{c['mean_accepted_length']:.3f} ± {c['mean_accepted_length_stderr']:.3f}, {through}"
if label == "FP8 source":
    r = m["reference"]
    print(f"| FP8 source | - | {r['acceptance']:.2f} ± {r['acceptance_stderr']:.2f} | {r['mean_accepted_length']:.3f} | {r['mean_kld']:.4f} ± {r['mean_kld_stderr']:.4f} | 0 | {chain(r)} |")
else:
    c = m["candidate"]
    print(f"| {label} | {method} | {c['acceptance']:.2f} ± {c['acceptance_stderr']:.2f} | {c['mean_accepted_length']:.3f} | {c['mean_kld']:.4f} ± {c['mean_kld_stderr']:.4f} | {m['drop']:+.2f} | {chain(c)} |")
PY
}
# The built-in recipe of the model's architecture, with mtp = "bf16".
base=glm45-int4
grep -q '"GlmMoeDsaForCausalLM"' "$model/config.json" && base=glm5-int4
sed "s/^name = \"$base\"/name = \"$base-mtp-bf16\"\nmtp = \"bf16\"/" "recipes/$base.toml" > "$work/mtp-bf16.toml"
row "FP8 source" - "$model"
for method in ct-minmax gptq; do
  for mtp in int4 bf16; do
    out="$work/$method-$mtp"
    args=(quantize "$model" "$out" --force)
    [ "$mtp" = bf16 ] && args+=(--recipe "$work/mtp-bf16.toml")
    [ "$method" = gptq ] && args+=(--method gptq --calibration eval/sonnets.txt)
    "$SQUEEZE" "${args[@]}" >/dev/null 2>&1
    if [ "$mtp" = bf16 ]; then label="BF16 (mtp = \"bf16\")"; else label="INT4 (like the others)"; fi
    row "$label" "$method" "$out"
  done
done

# The prompts: the first 6 words of 8 spoken lines of The Tempest.
grep -E '^[A-Z][a-z]' eval/shakespeare-heldout.txt | awk 'length > 40' | sed -n '20~40p' | head -8 \
  | cut -d' ' -f1-6 > "$work/prompts.txt"
printf '\n| model | K | acceptance %% by depth | tokens per pass | decode tok/s | plain greedy tok/s | speed-up | same tokens |\n'
printf '| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |\n'
for out in "$model" "$work/ct-minmax-int4" "$work/ct-minmax-bf16" "$work/gptq-int4"; do
  for k in 1 2 3; do
    json=$("$SQUEEZE" serve-test "$out" --prompts "$work/prompts.txt" --max-new-tokens 48 --concurrency 8 \
      --kv-pages 1024 --speculative "mtp=$k" --json)
    python3 - "$out" "$k" "$json" <<'PY'
import json, os, sys
out, k, report = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
s = report["speculative"]
depths = ", ".join(f"{100 * r:.1f}" for r in s["acceptance_by_depth"])
print(f"| {os.path.basename(out)} | {k} | {depths} | {s['mean_accepted_length']:.3f} | {report['decode_tokens_per_second']:.1f} | "
      f"{s['greedy_decode_tokens_per_second']:.1f} | {s['speedup']:.2f} | {s['identical_to_greedy']} |")
PY
  done
done
[ -n "$keep" ] || rm -rf "$work"
