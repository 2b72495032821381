#!/usr/bin/env bash
# squeeze's GPTQ (forward on the GPU) against llm-compressor 0.14 on the same GPU, on the GLM-5-width job of issue 34
# (`synth --arch glm5 --layers 2 --hidden 6144 --experts 8 --moe-intermediate 2048`, 32 × 256 random ids), for a
# lent GPU machine that has PyTorch and transformers but no llm-compressor and no network. squeeze keeps the MTP
# layer's experts BF16 (transformers' model, which llm-compressor calibrates, has none). Prints wall and user seconds
# per run; asserts nothing. Preparation on the development machine (x86-64; the wheels for the GPU image's Python 3.12):
#   scripts/gpu-prepare.sh                                   # .gpu/squeeze
#   mkdir -p .llmc/wheels && echo /.llmc/ >>.git/info/exclude
#   pip download --no-deps --python-version 3.12 --only-binary=:all: --platform manylinux_2_17_x86_64 \
#     --platform any -d .llmc/wheels llmcompressor==0.14.0.1 compressed-tensors==0.19.0 loguru==0.7.3 \
#     pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 datasets==5.2.0 \
#     dill==0.4.1 multiprocess==0.70.19 auto-round==0.15.1
# then the device tool: command `bash scripts/oracle/gptq/gpu-vs-llmcompressor.sh 2>&1 | tee $OUT/llmc-gpu.log`,
# carry [".gpu", ".llmc"], timeout_s 400 (about 160 s of runs).
set -uo pipefail
export PYTHONUNBUFFERED=1
w=/tmp/gptq-gpu; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --target $w/site .llmc/wheels/*.whl 2>&1 | tail -3
export PYTHONPATH=$w/site
python3 -c "import llmcompressor, torch; print('llmc', llmcompressor.__version__, 'torch', torch.__version__, torch.cuda.is_available())" || exit 1
bin=.gpu/squeeze src=$w/src ids=$w/ids.safetensors
$bin synth --arch glm5 $src --layers 2 --hidden 6144 --experts 8 --moe-intermediate 2048 >/dev/null
vocab=$(python3 -c "import json; print(json.load(open('$src/config.json'))['vocab_size'])")
python3 scripts/calibration_ids.py random $ids 32 256 "$vocab"
{ echo 'mtp = "bf16"'; cat recipes/glm5-int4.toml; } >$w/recipe-no-mtp.toml
python3 scripts/llmcompressor_gptq.py $src $ids $w/llmc --prepare
TIMEFORMAT='wall %R s, user %U s'
run() {
    echo "== $1"; shift
    { time timeout 150 "$@" >$w/log 2>&1; } 2>&1
    grep -E "llmcompressor_seconds|calibrated|rror" $w/log | tail -2
}
squeeze=(quantize $src $w/out --method gptq --calibration $ids --samples 32 --engine none --device cuda
    --recipe $w/recipe-no-mtp.toml --force)
run "squeeze gptq --device cuda --force-route-all" $bin "${squeeze[@]}" --force-route-all
run "llm-compressor GPTQModifier on cuda (every expert sees every token)" python3 scripts/llmcompressor_gptq.py $src $ids $w/llmc
run "squeeze gptq --device cuda (routed)" $bin "${squeeze[@]}"
run "llm-compressor --routed on cuda" python3 scripts/llmcompressor_gptq.py $src $ids $w/llmc --routed
