#!/usr/bin/env bash
# squeeze's CPU runtime against llama.cpp's CPU backend on the same model and the same token ids (issue 19):
# tokens/s of each at the same thread count, interleaved rounds in one run, best of each, the ratio, and how far
# llama.cpp's logits are from squeeze's. Asserts nothing.
#
#   scripts/bench-vs-llamacpp.sh --model DIR                       # an FP8 folder, e.g. eval/tiny-shakespeare-fp8
#   scripts/bench-vs-llamacpp.sh --arch kimi-k2|glm45|glm5 [--hidden 1024] [--experts 48] [--moe-intermediate 512]
#                                [--layers 8] [--vocab 4096]      # squeeze synth with these dims
#   scripts/bench-vs-llamacpp.sh --arch glm5 --tiny                # squeeze synth's own (tiny) defaults
#   common: [--ctx 256] [--chunks 8] [--rounds 5] [--threads 2]
#
# What is compared, per round (squeeze first, then llama.cpp, `--rounds` times):
# - squeeze `eval MODEL --tokens T --json` on `chunks` windows of `ctx` token ids, FP8 weights streamed from disk
#   and dequantized to f32 layer by layer, RAYON_NUM_THREADS=threads. tokens/s = chunks x ctx / wall time of the
#   evaluation, weight loading included (the loader thread overlaps compute; `load_seconds` is the part not hidden).
# - llama.cpp `llama-perplexity -m F32.gguf --kl-divergence --kl-divergence-base B -c ctx -b chunks*ctx -t threads
#   -tb threads` (ubatch 512, KV cache f16 and flash attention as llama.cpp defaults them). The base file B
#   carries the same token ids (the one way llama-perplexity takes ids instead of text) and squeeze's
#   log-probabilities, written from one untimed `squeeze eval --save-logits`. tokens/s = chunks x ctx / the time of
#   the one pass over all windows that kl_divergence() times itself (decode + synchronise; model load, mmap, warm-up
#   and the KL scoring excluded), read from the log's timestamps: this build's own "prompt eval time" counter is
#   wrong on this path (scripts/llamacpp_bench.py, llama-rate).
# - Work per token is the same except the output head and the scoring: squeeze computes logits at every position
#   and its NLL statistics inside the timed run, llama-perplexity the logits only for the second half of each
#   window (what it scores) and its scoring after the timed pass. The head is ~6 % of the linear flops of the tiny
#   trained models (hidden 192, vocab 258) and ~5 % at realistic width (hidden 1024, vocab 4096): llama.cpp skips
#   about half of it.
# - YaRN: llama.cpp 0.3.36 reads beta_fast / beta_slow from the GGUF only for Grok, so the script passes the
#   config's values on the command line (Kimi K2's 1 / 1, not llama.cpp's default 32 / 1; without them llama.cpp
#   computes a different model: scripts/llamacpp_bench.py, llama-args).
# - GLM-5: llama.cpp 0.3.36 runs GlmMoeDsaForCausalLM only with a power-of-two DSA indexer head >= 64; squeeze
#   synth draws 32, so for `--arch glm5` the script re-draws the indexer at 64 (scripts/llamacpp_bench.py,
#   indexer-head). With synth's 32 the conversion succeeds and llama-perplexity aborts building its graph
#   (`GGML_ASSERT(ggml_can_mul_mat(a, b)) failed`, llama_model_glm_dsa::build_arch_graph).
# - Both binaries read the weights as f32 (llama.cpp from an F32 GGUF, squeeze dequantizing FP8 codes on the fly).
# - Token ids: the first chunks x ctx bytes of eval/shakespeare-heldout.txt (squeeze's tokenizers are byte-level,
#   id = byte value, so the trained tiny models see real text; the synthetic ones see in-vocab ids either way).
# - Agreement: llama-perplexity prints PPL(Q) (llama.cpp) against PPL(base) (squeeze's logits) over the same
#   positions (second half of each window), mean KL divergence and how often the top token is the same.
#
# Cached outside the repo in ${SQUEEZE_CACHE:-~/.cache/squeeze}/llama.cpp (first run: ~6 GB download, 15-20 min of
# build on 2 cores): the llama.cpp sources vendored in PyPI's llama-cpp-python==0.3.36 sdist, their CMake build
# (-DGGML_NATIVE=ON, llama-perplexity only; cmake from PyPI), a venv, and per model the F32 GGUF and token files.
#
# Conversion: llama.cpp's own convert_hf_to_gguf.py code, run by scripts/llamacpp_bench.py on the FP8 folder (the
# converter dequantizes DeepSeek `weight_scale_inv` and compressed-tensors `weight_scale` blocks itself,
# fp8 x block scale in f32) with one change, a tokenizer-less vocabulary (see that file). The converter imports
# torch everywhere (lazy tensors, dequantization, expert stacking), so the venv has PyPI's torch==2.15.0 with its
# CUDA dependencies (~5 GB, used on the CPU only): PyPI has no CPU-only torch for x86-64, `pip install --no-deps
# torch` does not import (`ValueError: libcublasLt.so.*[0-9] not found in the system path`), the PyTorch wheel
# index is not reachable from here, and re-implementing the converter's per-architecture tensor mapping (MLA's
# kv_b split into k_b/v_b, stacked experts, GLM's NextN, GLM-5's DSA indexer) in our own gguf-py writer would
# make the "same model" claim rest on our mapping instead of llama.cpp's. transformers (4.57.6, the converter's
# pin) is imported by the converter for AutoConfig only; no tokenizer is loaded.
#
# Checked end to end on 2026-12-02 (BENCHMARKS.md, "squeeze vs llama.cpp (issue 19)"): the trained tiny Kimi
# K2-shaped and GLM-4.5-shaped models (--model eval/...), synth's tiny GLM-5 (--arch glm5 --tiny) and the realistic
# Kimi K2 layout (--arch kimi-k2), at 2 and 1 threads. The sdist download, CMake build and conversion ran as written
# here; the benchmark's venv was installed in steps, and the one pip line below was then checked on its own in a
# fresh venv (2 min from pip's cache; every import the script checks succeeds).
set -euo pipefail

model="" arch="" tiny=0 hidden=1024 experts=48 moe=512 layers=8 vocab=4096 ctx=256 chunks=8 rounds=5 threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --tiny) tiny=1; shift ;;
    --hidden) hidden="$2"; shift 2 ;;
    --experts) experts="$2"; shift 2 ;;
    --moe-intermediate) moe="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --vocab) vocab="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$model" ] && [ -z "$arch" ]; then
  echo "give --model DIR (an FP8 folder) or --arch kimi-k2|glm45|glm5 (a synthetic model)" >&2
  exit 2
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SQUEEZE_CACHE:-$HOME/.cache/squeeze}/llama.cpp"
mkdir -p "$cache"
cd "$repo_root"
cargo build --release --quiet
squeeze="$repo_root/target/release/squeeze"
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo -dirty)"

# --- llama.cpp: sources from the sdist, venv, CMake build (all cached) ---
venv="$cache/venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, transformers, yaml, safetensors, numpy, cmake' 2>/dev/null; then
  python3 -m venv "$venv"
  # gguf-py needs pyyaml, tqdm, requests; the converter imports transformers (AutoConfig), pinned as llama.cpp pins it.
  "$venv/bin/pip" install --quiet cmake numpy safetensors pyyaml tqdm requests transformers==4.57.6 torch==2.15.0
fi
sdist="$cache/llama_cpp_python-0.3.36"
src="$sdist/vendor/llama.cpp"
if [ ! -f "$src/convert_hf_to_gguf.py" ]; then
  # `--no-binary llama-cpp-python`, not `:all:` (that would build the sdist's build dependencies, cmake included,
  # from source just to read its metadata).
  (cd "$cache" && "$venv/bin/pip" download --quiet llama-cpp-python==0.3.36 --no-binary llama-cpp-python --no-deps \
    -d . && tar xzf llama_cpp_python-0.3.36.tar.gz)
  [ -f "$src/convert_hf_to_gguf.py" ] || { echo "the sdist has no vendor/llama.cpp under $sdist" >&2; exit 2; }
fi
perplexity="$cache/build/bin/llama-perplexity"
if [ ! -x "$perplexity" ]; then
  echo "building llama.cpp (llama-perplexity) in $cache/build ..." >&2
  "$venv/bin/cmake" -S "$src" -B "$cache/build" -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$cache/cmake-configure.log"
  "$venv/bin/cmake" --build "$cache/build" --target llama-perplexity -j "$(nproc)" >"$cache/cmake-build.log"
fi

# --- the model: an FP8 folder (given, or made by squeeze synth) and its F32 GGUF ---
if [ -n "$model" ]; then
  fp8="$(cd "$model" && pwd)"
  name="$(basename "$fp8")"
  work="$cache/models/$name-$(printf %s "$fp8" | sha256sum | cut -c1-8)"  # two folders may share a name
  mkdir -p "$work"
else
  if [ "$tiny" = 1 ]; then
    name="$arch-tiny" synth_dims=()
  else
    name="$arch-h$hidden-e$experts-m$moe-l$layers-v$vocab"
    synth_dims=(--layers "$layers" --hidden "$hidden" --experts "$experts" --moe-intermediate "$moe" --vocab "$vocab")
  fi
  if [ "$arch" = glm5 ]; then name="$name-index64"; fi
  work="$cache/models/$name"
  fp8="$work/fp8"
  mkdir -p "$work"
  if [ ! -f "$fp8/config.json" ]; then
    "$squeeze" synth --arch "$arch" "$fp8" "${synth_dims[@]}" --force >/dev/null
    # llama.cpp's GLM-5 graph needs a power-of-two indexer head >= 64; synth draws 32 (scripts/llamacpp_bench.py).
    if [ "$arch" = glm5 ]; then
      "$venv/bin/python" scripts/llamacpp_bench.py indexer-head "$fp8" 64
    fi
  fi
fi
gguf="$work/model-f32.gguf"
if [ ! -f "$gguf" ] || [ -n "$(find "$fp8" -name '*.safetensors' -newer "$gguf")" ]; then
  echo "converting $fp8 to $gguf ..." >&2
  "$venv/bin/python" scripts/llamacpp_bench.py convert "$src" "$fp8" "$gguf.partial" >"$work/convert.log" 2>&1 ||
    { tail -n 20 "$work/convert.log" >&2; echo "conversion failed: $work/convert.log" >&2; exit 2; }
  mv "$gguf.partial" "$gguf"
fi

# --- the same token ids for both; squeeze's logits as llama-perplexity's KL-divergence base (untimed) ---
tokens="$work/tokens-$chunks-$ctx.safetensors" base="$work/base-$chunks-$ctx.kld"
"$venv/bin/python" scripts/llamacpp_bench.py tokens "$tokens" "$chunks" "$ctx" eval/shakespeare-heldout.txt
RAYON_NUM_THREADS="$threads" "$squeeze" eval "$fp8" --tokens "$tokens" --save-logits "$work/logits.safetensors" \
  --json >"$work/squeeze-logits.json"
"$venv/bin/python" scripts/llamacpp_bench.py kld-base "$tokens" "$work/logits.safetensors" "$base"
rm -f "$work/logits.safetensors"

# YaRN's beta_fast / beta_slow from config.json: this llama.cpp ignores them in the GGUF (scripts/llamacpp_bench.py).
read -r -a llama_extra <<<"$("$venv/bin/python" scripts/llamacpp_bench.py llama-args "$fp8")"

# --- interleaved rounds ---
field() { "$venv/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
echo "$name: squeeze $commit vs llama.cpp (llama-cpp-python 0.3.36 sdist), $chunks x $ctx tokens, $threads threads"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
best_squeeze=0 best_llama=0
for round in $(seq "$rounds"); do
  RAYON_NUM_THREADS="$threads" /usr/bin/time -f '%M' -o "$work/squeeze.rss" \
    "$squeeze" eval "$fp8" --tokens "$tokens" --json >"$work/squeeze.json"
  s=$(field "$work/squeeze.json" tokens_per_second)
  /usr/bin/time -f '%M' -o "$work/llama.rss" "$perplexity" -m "$gguf" --kl-divergence --kl-divergence-base "$base" \
    -c "$ctx" -b $((chunks * ctx)) -t "$threads" -tb "$threads" "${llama_extra[@]}" >"$work/llama-$round.log" 2>&1 ||
    { tail -n 20 "$work/llama-$round.log" >&2; echo "llama-perplexity failed: $work/llama-$round.log" >&2; exit 2; }
  l=$("$venv/bin/python" scripts/llamacpp_bench.py llama-rate "$work/llama-$round.log" $((chunks * ctx)))
  printf 'round %d: squeeze %.1f tokens/s (load not hidden %.2f s, peak RSS %d MB), llama.cpp %.1f tokens/s (peak RSS %d MB), load %s\n' \
    "$round" "$s" "$(field "$work/squeeze.json" load_seconds)" $(($(cat "$work/squeeze.rss") / 1024)) "$l" \
    $(($(cat "$work/llama.rss") / 1024)) "$(cut -d' ' -f1 /proc/loadavg)"
  best_squeeze=$("$venv/bin/python" -c "print(max($best_squeeze, $s))")
  best_llama=$("$venv/bin/python" -c "print(max($best_llama, $l))")
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$venv/bin/python" -c "print(f'$name: squeeze {$best_squeeze:.1f} tokens/s, llama.cpp {$best_llama:.1f} tokens/s, ratio {$best_squeeze / $best_llama:.2f}x (best of $rounds, $threads threads)')"
echo "squeeze eval: ppl $(field "$work/squeeze.json" ppl) over all positions after the first"
echo "llama-perplexity against squeeze's logits (second half of each window):"
# Every round prints the same statistics, but llama.cpp's asynchronous logger can drop the last lines at exit (its
# queue is not drained): take them from a round whose log has them all.
for round in $(seq "$rounds"); do
  if grep -q '^Same top p' "$work/llama-$round.log"; then
    grep -E '^(Mean PPL\(Q\)|Mean PPL\(base\)|Mean +KLD|Maximum KLD|Same top p)' "$work/llama-$round.log" | sed 's/^/  /'
    break
  fi
done
