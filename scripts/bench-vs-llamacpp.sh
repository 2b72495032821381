#!/usr/bin/env bash
# squeeze's CPU runtime against llama.cpp's CPU backend on the same synthetic model (issue 19): prompt-processing
# tokens/s of each at the same thread count, interleaved rounds, best of each, and the ratio. Asserts nothing.
#
#   scripts/bench-vs-llamacpp.sh [--arch kimi-k2|glm45|glm5] [--hidden 1024] [--experts 48] [--moe-intermediate 512]
#                                [--layers 8] [--ctx 256] [--chunks 8] [--rounds 5] [--threads 2]
#
# What is compared: squeeze `eval --tokens` on `chunks` windows of `ctx` token ids (FP8 weights, dequantized to f32
# per layer) against llama.cpp `llama-bench -p <ctx> -n 0 -r 1` (prompt processing of one `ctx`-token batch, F32
# GGUF), both at `--threads`. llama-bench draws its own token ids: routing differs, the work per token does not.
#
# Cached outside the repo in ${SQUEEZE_CACHE:-~/.cache/squeeze}/llama.cpp: the llama.cpp sources vendored in PyPI's
# llama-cpp-python==0.3.36 sdist, its CMake build (-DGGML_NATIVE=ON) and a venv with cmake, numpy, safetensors,
# gguf (from the sdist) and CPU torch + transformers for convert_hf_to_gguf.py.
#
# Status: written for issue 19 under time pressure and NOT yet run end to end (see BENCHMARKS.md, issue 19). Checked
# so far: the sdist download line and its layout (vendor/llama.cpp with convert_hf_to_gguf.py, conversion/deepseek.py
# for DeepseekV3ForCausalLM, gguf-py, tools/llama-bench with -p/-n/-t/-r/-o json and avg_ts). Not checked: the
# CMake build, the venv installs, whether convert_hf_to_gguf.py accepts squeeze synth's tokenizer, the GLM
# architectures' conversion (squeeze's `eval --tokens` step ran: 214.8 tokens/s, 2 × 256). squeeze's tokens/s includes streaming the weights
# from disk; llama-bench's pp excludes model loading.
set -euo pipefail

arch=kimi-k2 hidden=1024 experts=48 moe=512 layers=8 ctx=256 chunks=8 rounds=5 threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --hidden) hidden="$2"; shift 2 ;;
    --experts) experts="$2"; shift 2 ;;
    --moe-intermediate) moe="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SQUEEZE_CACHE:-$HOME/.cache/squeeze}/llama.cpp"
mkdir -p "$cache"
cd "$repo_root"
cargo build --release --quiet
squeeze="$repo_root/target/release/squeeze"

# --- llama.cpp: sources from the sdist, CMake build, venv (all cached) ---
venv="$cache/venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet cmake numpy safetensors
  "$venv/bin/pip" install --quiet torch --index-url https://download.pytorch.org/whl/cpu
  "$venv/bin/pip" install --quiet transformers sentencepiece
fi
src="$cache/llama_cpp_python-0.3.36/vendor/llama.cpp"
if [ ! -d "$src" ]; then
  # `--no-binary llama-cpp-python`, not `:all:` (that would build the sdist's build dependencies, cmake included,
  # from source just to read its metadata).
  (cd "$cache" && "$venv/bin/pip" download --quiet llama-cpp-python==0.3.36 --no-binary llama-cpp-python --no-deps -d . &&
    tar xzf llama_cpp_python-0.3.36.tar.gz)
  [ -d "$src" ] || { echo "the sdist has no vendor/llama.cpp under $cache; unpack it there by hand" >&2; exit 2; }
  "$venv/bin/pip" install --quiet "$src/gguf-py"
fi
bench="$cache/build/bin/llama-bench"
if [ ! -x "$bench" ]; then
  "$venv/bin/cmake" -S "$src" -B "$cache/build" -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  "$venv/bin/cmake" --build "$cache/build" --target llama-bench llama-perplexity -j "$(nproc)" >/dev/null
fi

# --- the model: squeeze synth (FP8), dequantized to a plain HF folder, converted to F32 GGUF ---
name="$arch-h$hidden-e$experts-m$moe-l$layers"
work="$cache/models/$name"
mkdir -p "$work"
if [ ! -f "$work/fp8/config.json" ]; then
  "$squeeze" synth --arch "$arch" "$work/fp8" --layers "$layers" --hidden "$hidden" --experts "$experts" \
    --moe-intermediate "$moe" --vocab 4096 --force >/dev/null
fi
if [ ! -f "$work/model-f32.gguf" ]; then
  # FP8 e4m3 [out, in] with weight_scale_inv [ceil(out/128), ceil(in/128)] (a multiplier): w = fp8 · scale block.
  "$venv/bin/python" - "$work/fp8" "$work/hf" <<'PY'
import json, os, shutil, sys
import numpy as np, torch
from safetensors.torch import load_file, save_file
source, target = sys.argv[1], sys.argv[2]
os.makedirs(target, exist_ok=True)
for name in os.listdir(source):
    if not name.endswith(".safetensors") and not name.endswith(".index.json"):
        shutil.copy(os.path.join(source, name), target)
config = json.load(open(os.path.join(source, "config.json")))
config.pop("quantization_config", None)
json.dump(config, open(os.path.join(target, "config.json"), "w"), indent=2)
tensors = {}
for name in sorted(os.listdir(source)):
    if name.endswith(".safetensors"):
        tensors.update(load_file(os.path.join(source, name)))
out = {}
for key, value in tensors.items():
    if key.endswith("_scale_inv"):
        continue
    if value.dtype == torch.float8_e4m3fn:
        scale = tensors[key + "_scale_inv"].float()
        rows, cols = value.shape
        full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
        out[key] = (value.float() * full).contiguous()
    else:
        out[key] = value.float().contiguous()
save_file(out, os.path.join(target, "model.safetensors"))
PY
  "$venv/bin/python" "$src/convert_hf_to_gguf.py" "$work/hf" --outtype f32 --outfile "$work/model-f32.gguf" >/dev/null
fi

# --- the same token ids for squeeze (llama-bench draws its own) ---
"$venv/bin/python" - "$work/tokens.safetensors" "$chunks" "$ctx" <<'PY'
import sys, numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(0)
save_file({"input_ids": rng.integers(1, 4096, size=(int(sys.argv[2]), int(sys.argv[3])), dtype=np.int64)}, sys.argv[1])
PY

# --- interleaved rounds ---
best_squeeze=0 best_llama=0
for round in $(seq "$rounds"); do
  s=$(RAYON_NUM_THREADS="$threads" "$squeeze" eval "$work/fp8" --tokens "$work/tokens.safetensors" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_second"])')
  l=$("$bench" -m "$work/model-f32.gguf" -p "$ctx" -n 0 -r 1 -t "$threads" -o json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')
  echo "round $round: squeeze $s tokens/s, llama.cpp $l tokens/s"
  best_squeeze=$(python3 -c "print(max($best_squeeze, $s))")
  best_llama=$(python3 -c "print(max($best_llama, $l))")
done
python3 -c "print(f'$name: squeeze {$best_squeeze:.1f} tokens/s, llama.cpp {$best_llama:.1f} tokens/s, ratio {$best_squeeze / $best_llama:.2f}x (best of $rounds, $threads threads)')"
