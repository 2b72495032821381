#!/usr/bin/env python3
"""Write tests/golden/ct_k26_requant.safetensors: a Kimi K2.6-layout INT4 expert requantized by compressed-tensors.

Usage (from the repository root; compressed-tensors 0.20.1 over any torch >= 2.8):

    cargo run --release -- synth --arch kimi-k2.6 --hidden 256 --moe-intermediate 256 /tmp/k26-golden-src
    pip install --no-deps --target /tmp/ct20 compressed-tensors==0.20.1
    PYTHONPATH=/tmp/ct20 /work/venv-vllm/bin/python scripts/oracle/make-k26-requant-golden.py /tmp/k26-golden-src

The source is squeeze's synthetic Kimi K2.6 (Moonshot's layout: routed experts natively INT4 pack-quantized g32
inside the kimi_k25 wrapper); the CI test regenerates it with the same `synth` command (seed 0) and checks that
the source bytes this golden was made from are the ones it has (`<proj>.source_packed`). For one expert's
gate/up/down projections, compressed-tensors' own code:
    decompresses the INT4 module: pack_quantized.helpers.unpack_from_int32, then lifecycle.forward.dequantize in
        f32 (code x the BF16 scale widened to f32)                                   -> down.dequantized F32 (down only: size)
    compresses those f32 values as
        NVFP4 (NVFP4A16; gate and up share the smaller of their two global scales, llm-compressor's rule for fused
              partners)                                                      -> <proj>.nvfp4.*
        MXFP4 (MXFP4A16)                                                     -> <proj>.mxfp4.*
        W4A8's weights: INT4 pack-quantized g128, minmax scales (absmax / 7.5, rounded to BF16)
                                                                             -> <proj>.w4a8.*
squeeze's `quantize --recipe kimi-k26-{nvfp4,mxfp4,w4a8}` output for these modules must equal them byte for byte.
"""

import argparse
import importlib.util
import json
import pathlib
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ctoracle  # noqa: E402
import stable_header  # noqa: E402

spec = importlib.util.spec_from_file_location("make_fp4_golden", HERE / "make-fp4-golden.py")
fp4 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp4)

EXPERT = "language_model.model.layers.1.mlp.experts.0"
W4A8_GROUP = 128


def read_module(folder: pathlib.Path, module: str) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = {}
    for suffix in ("weight_packed", "weight_scale", "weight_shape"):
        name = f"{module}.{suffix}"
        with safe_open(str(folder / index[name]), framework="pt") as shard:
            tensors[suffix] = shard.get_tensor(name)
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=pathlib.Path, help="the synth --arch kimi-k2.6 folder")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("tests/golden/ct_k26_requant.safetensors"))
    args = parser.parse_args()
    import compressed_tensors
    config = json.loads((args.source / "config.json").read_text())
    group = config["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"]
    tensors: dict[str, torch.Tensor] = {}
    weights = {}
    for proj in ("gate", "up", "down"):
        stored = read_module(args.source, f"{EXPERT}.{proj}_proj")
        shape = [int(v) for v in stored["weight_shape"].tolist()]
        codes = ctoracle.ct_unpack(stored["weight_packed"], shape)
        # The BF16 scale widened to f32 first: with a BF16 scale, dequantize multiplies in BF16 and rounds
        # code x scale (up to 3 more significant bits) to BF16; the exact product is what the codes encode.
        weight = ctoracle.ct_dequantize(codes, stored["weight_scale"].to(torch.float32), group).contiguous()
        weights[proj] = weight
        tensors[f"{proj}.source_packed"] = stored["weight_packed"].contiguous()
        if proj == "down":
            tensors[f"{proj}.dequantized"] = weight
    shared = torch.minimum(*(fp4.generate_gparam(*torch.aminmax(weights[p])) for p in ("gate", "up")))
    for proj, weight in weights.items():
        nv = fp4.nvfp4(weight, shared if proj in ("gate", "up") else None)
        mx = fp4.mxfp4(weight)
        fp4.check_numpy(weight.numpy(), nv, mx)
        for key in ("weight_packed", "weight_scale", "weight_global_scale"):
            tensors[f"{proj}.nvfp4.{key}"] = nv[key].clone().contiguous()
        for key in ("weight_packed", "weight_scale"):
            tensors[f"{proj}.mxfp4.{key}"] = mx[key].clone().contiguous()
        scale = ctoracle.ct_minmax_scale_f32(weight, W4A8_GROUP)
        tensors[f"{proj}.w4a8.weight_packed"] = ctoracle.ct_quantize_pack(
            weight, scale.to(torch.float32), W4A8_GROUP).contiguous()
        tensors[f"{proj}.w4a8.weight_scale"] = scale.contiguous()
    metadata = {"producer": "scripts/oracle/make-k26-requant-golden.py", "expert": EXPERT,
                "source": "squeeze synth --arch kimi-k2.6 --hidden 256 --moe-intermediate 256 (seed 0)",
                "compressed_tensors": compressed_tensors.__version__, "torch": torch.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out), metadata=metadata)
    stable_header.sort_metadata_in_place(args.out)
    print(f"{args.out}: {EXPERT} gate/up/down, compressed-tensors {compressed_tensors.__version__}")


if __name__ == "__main__":
    main()
