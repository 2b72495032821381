#!/usr/bin/env python3
"""Write tests/golden/ct_fp4_cast.safetensors: squeeze's lossless MXFP4 -> NVFP4 cast judged by compressed-tensors.

Usage (from the repository root, with the oracle venv of scripts/oracle/setup-venv.sh):

    cargo run --release -- synth --arch kimi-k3 /tmp/k3
    cargo run --release -- synth --arch deepseek-v4 /tmp/dsv4
    cargo run --release -- quantize /tmp/k3 /tmp/k3-nvfp4 --recipe kimi-k3-nvfp4 --engine vllm
    cargo run --release -- quantize /tmp/dsv4 /tmp/dsv4-nvfp4 --recipe deepseek-v4-nvfp4 --engine vllm
    .venv-oracle/bin/python scripts/oracle/make-fp4-cast-golden.py /tmp/k3 /tmp/k3-nvfp4 /tmp/dsv4 /tmp/dsv4-nvfp4

For one routed expert of each release (gate w1, down w2, up w3), compressed-tensors 0.20.1's own compressors
decompress
    the source as shipped    MXFP4PackedCompressor.decompress (K3's weight_packed/weight_scale; DeepSeek-V4's
                             weight I8 + scale F8_E8M0, the same bytes viewed as uint8)   -> <release>.<proj>.decoded
    squeeze's NVFP4 cast     NVFP4PackedCompressor.decompress (weight_packed, weight_scale F8_E4M3,
                             weight_global_scale)
and the script requires the two to be equal bit for bit (every group of these synthetic experts is within E4M3's
range, so every value must survive). With --modelopt PATH (NVIDIA ModelOpt's
`modelopt/torch/quantization/utils/numeric_utils.py`, pure torch: `pip download nvidia-modelopt==0.47.0 --no-deps`
and unzip that one file) it also requires squeeze's global scale to be 448 * 6 / ModelOpt's
`mxfp4_to_nvfp4_global_amax` (over w1 and w3 together for the shared one) and every E4M3 block scale to be
global * ModelOpt's `mxfp4_to_nvfp4_per_block_amax` / 6, exactly. The golden keeps the source bytes (the CI test checks that `synth` still
makes them), the cast's bytes that compressed-tensors judged (squeeze's output must still equal them) and the
decoded values (squeeze's MXFP4 reader must equal them).
"""

import argparse
import json
import pathlib
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import stable_header  # noqa: E402

RELEASES = {
    "k3": ("language_model.model.layers.1.block_sparse_moe.experts.0", "weight_packed", "weight_scale"),
    "dsv4": ("layers.1.ffn.experts.0", "weight", "scale"),
}


def read(folder: pathlib.Path, name: str) -> torch.Tensor:
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(folder / index[name]), framework="pt") as shard:
        return shard.get_tensor(name)


def as_u8(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dtype == torch.uint8 else tensor.view(torch.uint8)


def scheme(kind: str):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    if kind == "mxfp4":
        args = QuantizationArgs(num_bits=4, type="float", symmetric=True, strategy="group", group_size=32,
                                scale_dtype=torch.uint8)
    else:
        args = QuantizationArgs(num_bits=4, type="float", symmetric=True, strategy="tensor_group", group_size=16)
    return QuantizationScheme(targets=["Linear"], weights=args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("k3", type=pathlib.Path)
    parser.add_argument("k3_nvfp4", type=pathlib.Path)
    parser.add_argument("dsv4", type=pathlib.Path)
    parser.add_argument("dsv4_nvfp4", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("tests/golden/ct_fp4_cast.safetensors"))
    parser.add_argument("--modelopt", type=pathlib.Path, help="ModelOpt's numeric_utils.py, a second oracle")
    args = parser.parse_args()
    modelopt = None
    if args.modelopt:
        import importlib.util
        spec = importlib.util.spec_from_file_location("modelopt_numeric_utils", args.modelopt)
        modelopt = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modelopt)
    import compressed_tensors
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor

    folders = {"k3": (args.k3, args.k3_nvfp4), "dsv4": (args.dsv4, args.dsv4_nvfp4)}
    tensors: dict[str, torch.Tensor] = {}
    for release, (module_prefix, packed_suffix, scale_suffix) in RELEASES.items():
        source, cast = folders[release]
        for proj in ("w1", "w2", "w3"):
            module = f"{module_prefix}.{proj}"
            packed = as_u8(read(source, f"{module}.{packed_suffix}"))
            exponents = as_u8(read(source, f"{module}.{scale_suffix}"))
            mx = MXFP4PackedCompressor.decompress(
                {"weight_packed": packed, "weight_scale": exponents}, scheme("mxfp4"))["weight"]
            nv_parts = {key: read(cast, f"{module}.{key}")
                        for key in ("weight_packed", "weight_scale", "weight_global_scale")}
            nv = NVFP4PackedCompressor.decompress(dict(nv_parts), scheme("nvfp4"))["weight"]
            source_values = mx.to(torch.float32)
            cast_values = nv.to(torch.float32)
            differ = (source_values.view(torch.int32) != cast_values.view(torch.int32)).sum().item()
            print(f"{release} {proj}: {tuple(mx.shape)} mxfp4 {mx.dtype} vs nvfp4 {nv.dtype}: {differ} values differ, "
                  f"global {nv_parts['weight_global_scale'].item()}")
            if differ:
                sys.exit(f"{release} {module}: the cast changed {differ} values")
            if modelopt is not None:
                partner = {"w1": "w3", "w3": "w1"}.get(proj)
                scales = [exponents] + ([as_u8(read(source, f"{module_prefix}.{partner}.{scale_suffix}"))]
                                        if partner else [])
                global_amax, info = modelopt.mxfp4_to_nvfp4_global_amax(torch.cat([s.flatten() for s in scales]))
                want_global = torch.tensor(448.0 * 6.0 / global_amax, dtype=torch.float32)
                got_global = nv_parts["weight_global_scale"].to(torch.float32).reshape(())
                blocks = packed.reshape(packed.shape[0], -1, 16)
                amax = modelopt.mxfp4_to_nvfp4_per_block_amax(blocks, exponents)
                want_scales = (want_global * amax / 6.0).to(torch.float8_e4m3fn).to(torch.float32)
                got_scales = nv_parts["weight_scale"].to(torch.float32)
                if got_global != want_global or not torch.equal(got_scales, want_scales):
                    sys.exit(f"{release} {module}: squeeze's scales differ from ModelOpt's cast ({info})")
                print(f"  ModelOpt: global and {got_scales.numel()} block scales equal ({info['pct_lossless']}% lossless)")
            tensors[f"{release}.{proj}.source_packed"] = packed.contiguous()
            tensors[f"{release}.{proj}.source_scale"] = exponents.contiguous()
            tensors[f"{release}.{proj}.decoded"] = source_values.contiguous()
            for key, value in nv_parts.items():
                tensors[f"{release}.{proj}.nvfp4.{key}"] = value.contiguous()
    metadata = {"producer": "scripts/oracle/make-fp4-cast-golden.py",
                "sources": "squeeze synth --arch kimi-k3 / --arch deepseek-v4 (seed 0), quantize --recipe "
                           "kimi-k3-nvfp4 / deepseek-v4-nvfp4",
                "experts": json.dumps({k: v[0] for k, v in RELEASES.items()}),
                "compressed_tensors": compressed_tensors.__version__, "torch": torch.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out), metadata=metadata)
    stable_header.sort_metadata_in_place(args.out)
    print(f"{args.out}: compressed-tensors {compressed_tensors.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
