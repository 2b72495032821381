#!/usr/bin/env python3
"""Write tests/golden/peers/: INT4 compressed-tensors folders written by the peer tools themselves, with the
peers' own dequantized weights, for squeeze's readers (issue 35).

Usage (from the repository root, after scripts/oracle/peers/setup.sh and `cargo build --release`):

    /work/venv-peers/bin/python scripts/oracle/peers/make-corpus.py [--squeeze target/release/squeeze]

Steps:
  1. `squeeze synth --arch kimi-k2` writes a tiny FP8 Kimi-K2-shaped model (2 layers, hidden 64 or 32, 4 experts of 64).
  2. It is dequantized exactly (fp8 x scale_inv in f32) and stored as a BF16 (or F32) `DeepseekV3ForCausalLM`
     folder with `model_type: deepseek_v3`, as transformers loads it.
  3. Each variant runs the peer on it: llm-compressor 0.14.0.1 `oneshot` (GPTQModifier or QuantizationModifier)
     on the routed experts only, on fixed random calibration ids, saved with `save_compressed=True`: the folder
     is the peer's, byte for byte (one un-indexed model.safetensors).
  4. For a few expert modules the peer's own decompression (compressed-tensors 0.19.0
     `PackedQuantizationCompressor.decompress`, which calls `unpack_from_int32` and `dequantize`) is stored in
     `<variant>.dequantized.safetensors`:
        <module>.weight      the peer's value in the scale's dtype (what compressed-tensors decompresses to)
        <module>.weight_f32  the same call with the scale (and zero point) given as float32: (q - z) * s in f32
"""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts" / "oracle"))
import stable_header  # noqa: E402

EXPERTS = r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"
MODULES = [  # the modules whose peer dequantization is stored
    "model.layers.1.mlp.experts.0.gate_proj",
    "model.layers.1.mlp.experts.2.up_proj",
    "model.layers.1.mlp.experts.3.down_proj",
]


def weights(group_size=32, symmetric=True, strategy="group", actorder=None, scale_dtype=None):
    args = {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": strategy, "dynamic": False}
    if strategy == "group":
        args["group_size"] = group_size
    if actorder is not None:
        args["actorder"] = actorder
    if scale_dtype is not None:
        args["scale_dtype"] = scale_dtype
    return args


# name: (model dtype, hidden size, modifier, weight args, description). The F32 model is the smallest that keeps
# the folder a few hundred KB (hidden 32); the others are BF16 models of hidden 64.
VARIANTS = {
    "llmc-gptq-w4a16": ("bfloat16", 64, "gptq", weights(), "llm-compressor GPTQ W4A16, group 32, no act-order"),
    "llmc-gptq-actorder": ("bfloat16", 64, "gptq", weights(actorder="weight"), "llm-compressor GPTQ W4A16, group 32, actorder weight"),
    "ct-int4-f32-scales": ("float32", 32, "rtn", weights(), "compressed-tensors INT4 of an F32 model: F32 scales, group 32"),
    "llmc-asym-g64": ("bfloat16", 64, "rtn", weights(group_size=64, symmetric=False), "llm-compressor W4A16_ASYM: zero points, group 64"),
    "llmc-channel": ("bfloat16", 64, "rtn", weights(strategy="channel"), "llm-compressor W4A16 channel-wise: one scale per output row"),
}


def dequantize_fp8_folder(src: pathlib.Path, dst: pathlib.Path, dtype: torch.dtype):
    dst.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    block = config["quantization_config"]["weight_block_size"]
    del config["quantization_config"]
    config["model_type"] = "deepseek_v3"  # transformers' name for Kimi K2's architecture
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    tensors = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(shard))
    out = {}
    for name, tensor in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            scale = tensors[name + "_scale_inv"].float()
            rows, cols = tensor.shape
            full = scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
            out[name] = (tensor.float() * full).to(dtype)
        else:
            out[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "tiktoken.model"):
        if (src / extra).exists():
            shutil.copy(src / extra, dst / extra)


def calibration(vocab: int, samples=16, length=32):
    from datasets import Dataset

    generator = torch.Generator().manual_seed(35)
    ids = torch.randint(1, vocab - 1, (samples, length), generator=generator)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})


def run_peer(model_dir: pathlib.Path, out: pathlib.Path, dtype: str, modifier: str, args: dict):
    from compressed_tensors.quantization import QuantizationScheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    scheme = {"group_0": QuantizationScheme(targets=[EXPERTS], weights=args)}
    if modifier == "gptq":
        # GPTQModifier's own `actorder` (default "static") overrides the scheme's unless given: pass the scheme's.
        recipe = GPTQModifier(
            config_groups=scheme,
            ignore=["lm_head"],
            block_size=128,
            dampening_frac=0.01,
            actorder=args.get("actorder"),
        )
    else:
        recipe = QuantizationModifier(config_groups=scheme, ignore=["lm_head"])
    config = json.loads((model_dir / "config.json").read_text())
    oneshot(
        model=model,
        dataset=calibration(config["vocab_size"]),
        recipe=recipe,
        max_seq_length=32,
        num_calibration_samples=16,
        output_dir=None,
    )
    model.save_pretrained(out, save_compressed=True)
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "tiktoken.model"):
        if (model_dir / extra).exists():
            shutil.copy(model_dir / extra, out / extra)


def peer_dequantized(folder: pathlib.Path) -> dict:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    (group,) = config["config_groups"].values()
    scheme = QuantizationScheme.model_validate(group)
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(shard))
    out = {}
    for module in MODULES:
        state = {k.removeprefix(module + "."): v for k, v in tensors.items() if k.startswith(module + ".")}
        native = PackedQuantizationCompressor.decompress(state, scheme)["weight"]
        as_f32 = dict(state, weight_scale=state["weight_scale"].float())
        f32 = PackedQuantizationCompressor.decompress(as_f32, scheme)["weight"]
        assert f32.dtype == torch.float32 and native.dtype == state["weight_scale"].dtype
        # f32 is exact (q - z) * s: rounding it to the scale's dtype once gives the peer's own value
        assert torch.equal(f32.to(native.dtype), native), module
        out[f"{module}.weight"] = native.contiguous()
        out[f"{module}.weight_f32"] = f32.contiguous()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--squeeze", default=str(ROOT / "target" / "release" / "squeeze"))
    parser.add_argument("--out", default=str(ROOT / "tests" / "golden" / "peers"))
    parser.add_argument("--only", nargs="*", help="variants to (re)write")
    options = parser.parse_args()
    out_root = pathlib.Path(options.out)
    out_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for name, (dtype, hidden, modifier, args, description) in VARIANTS.items():
            if options.only and name not in options.only:
                continue
            hidden = str(hidden)
            synth = tmp / f"fp8-{hidden}"
            if not synth.exists():
                subprocess.run(
                    [options.squeeze, "synth", "--arch", "kimi-k2", str(synth), "--layers", "2", "--hidden", hidden,
                     "--experts", "4", "--moe-intermediate", "64", "--vocab", "258", "--shards", "1"],
                    check=True,
                )
            source = tmp / f"{dtype}-{hidden}"
            if not source.exists():
                dequantize_fp8_folder(synth, source, getattr(torch, dtype))
            folder = out_root / name
            shutil.rmtree(folder, ignore_errors=True)
            run_peer(source, folder, dtype, modifier, args)
            golden = out_root / f"{name}.dequantized.safetensors"
            save_file(peer_dequantized(folder), golden, metadata={"description": description})
            stable_header.sort_metadata_in_place(golden)
            print(f"{name}: {description}: {sum(f.stat().st_size for f in folder.iterdir())} bytes")


if __name__ == "__main__":
    main()
