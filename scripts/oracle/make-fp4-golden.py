#!/usr/bin/env python3
"""Write tests/golden/ct_fp4.safetensors: compressed-tensors NVFP4 and MXFP4 goldens (issue 31).

Usage (from the repository root; compressed-tensors 0.20.1 over any torch ≥ 2.8):

    python scripts/oracle/make-fp4-golden.py [--out tests/golden/ct_fp4.safetensors]

e.g. with the vLLM oracle's venv and compressed-tensors 0.20.1 unpacked beside it:

    pip install --no-deps --target /tmp/ct20 compressed-tensors==0.20.1
    PYTHONPATH=/tmp/ct20 /work/venv-vllm/bin/python scripts/oracle/make-fp4-golden.py

Every golden is produced by compressed-tensors 0.20.1's own code on the f32 weight (CPU, its eager torch path):
    NVFP4 (preset NVFP4A16: float 4-bit, tensor_group, group 16, scale_dtype float8_e4m3fn)
        global:  quantization.utils.helpers.generate_gparam(amin, amax)  = 448·6 / absmax  (f32)
        scales:  quantization.utils.helpers.compute_dynamic_scales_and_zp(w, args, global_scale=global)
                 (per group absmax / 6 · global, rounded to FP8 E4M3, 0 → 0.125)
        packed:  compressors.nvfp4.base.NVFP4PackedCompressor.compress
                 (x / (scale / global), clamp ±6, cast_to_fp4, pack_fp4_to_uint8: low nibble = even element)
    MXFP4 (preset MXFP4A16: float 4-bit, group 32, scale_dtype uint8)
        scales:  compute_dynamic_scales_and_zp → generate_mx_scales (E8M0: 127 + floor(log2(round_to_power_2(
                 absmax))) − 2, uint8 clamp) → 2^(e − 127)
        packed:  compressors.mxfp4.base.MXFP4PackedCompressor.compress (scale stored as the uint8 exponent)
    decompressed: each compressor's decompress, its unpack and dequantize run in f32 (the compressors' own
                  decompress returns BF16; the f32 values are what the format encodes)
A gate/up pair shares one NVFP4 global scale, the smaller of the two (llm-compressor's rule for fused partners;
vLLM uses one scale for both and warns when they differ).

Tensors (i = 0..N-1):
    case{i}.weight                   F32  [out, in]       exact f32 dequant of an FP8 block source, or hand-made
    case{i}.nvfp4.weight_packed      U8   [out, in/2]
    case{i}.nvfp4.weight_scale       F8_E4M3 [out, in/16]
    case{i}.nvfp4.weight_global_scale F32 [1]
    case{i}.nvfp4.decompressed       F32  [out, in]
    case{i}.mxfp4.weight_packed      U8   [out, in/2]
    case{i}.mxfp4.weight_scale       U8   [out, in/32]
    case{i}.mxfp4.decompressed       F32  [out, in]
    pair.{gate,up}.*                 the same NVFP4 tensors for the gate/up pair (pair.global_scale shared)
"""

import argparse
import pathlib
import sys

import numpy as np
import torch
from safetensors.torch import save_file

from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.compressors.mx_utils import decompress_mx_scale
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import dequantize
from compressed_tensors.quantization.quant_scheme import MXFP4A16, NVFP4A16
from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp, generate_gparam

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import ctoracle  # noqa: E402
import stable_header  # noqa: E402

SEED = 20261203
# (out, in, description): in a multiple of 32 (MXFP4's group)
FP8_CASES = [
    (40, 96, "in < 128: one partial FP8 column block"),
    (37, 192, "partial FP8 blocks on both axes"),
    (130, 256, "out crosses an FP8 row block by 2"),
    (24, 160, "in = 128 + 32"),
]

NVFP4_ARGS: QuantizationArgs = NVFP4A16["weights"]
MXFP4_ARGS: QuantizationArgs = MXFP4A16["weights"]
NVFP4_SCHEME = QuantizationScheme(targets=["Linear"], weights=NVFP4_ARGS)
MXFP4_SCHEME = QuantizationScheme(targets=["Linear"], weights=MXFP4_ARGS)

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def hand_case() -> np.ndarray:
    """[4, 32]: exact ties of the E2M1 grid after scaling, a zero row, tiny negatives that round to −0, outliers."""
    rows = np.zeros((4, 32), dtype=np.float32)
    # Row 0: absmax 6 → NVFP4 group scale 1·global/global; quotients at every tie of the grid.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, -6.0]
    rows[0, :16] = ties
    rows[0, 16:] = [0.1, -0.1, 0.3, -0.3, 0.7, 0.8, 1.3, 1.7, 2.4, 2.6, 3.4, 3.6, 4.9, 5.1, -0.0, 6.0]
    # Row 1: all zero (scale 0 → FP8 eps 0.125 / E8M0 exponent 0).
    # Row 2: one large value and tiny ones of both signs.
    rows[2, :] = np.linspace(-1e-3, 1e-3, 32, dtype=np.float32)
    rows[2, 5] = 3.0
    # Row 3: a group max with mantissa ≥ 1.75 (MX rounds the exponent up) and one just below.
    rows[3, :16] = np.float32(1.75) * np.linspace(-1, 1, 16, dtype=np.float32)
    rows[3, 16:] = np.float32(1.74) * np.linspace(-1, 1, 16, dtype=np.float32)
    return rows


def nvfp4(weight: torch.Tensor, global_scale: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    if global_scale is None:
        amin, amax = torch.aminmax(weight)
        global_scale = generate_gparam(amin, amax)
    scale, _ = compute_dynamic_scales_and_zp(weight, NVFP4_ARGS, module=None, global_scale=global_scale)
    state = {"weight": weight.clone(), "weight_scale": scale, "weight_global_scale": global_scale}
    out = NVFP4PackedCompressor.compress(state, NVFP4_SCHEME)
    m, n = out["weight_packed"].shape
    codes = unpack_fp4_from_uint8(out["weight_packed"], m, n * 2, dtype=torch.float32)
    values = dequantize(x_q=codes, scale=out["weight_scale"].to(torch.float32), args=NVFP4_ARGS,
                        global_scale=out["weight_global_scale"], dtype=torch.float32)
    return {
        "weight_packed": out["weight_packed"],
        "weight_scale": out["weight_scale"],
        "weight_global_scale": out["weight_global_scale"].to(torch.float32).reshape(1),
        "decompressed": values,
    }


def mxfp4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    scale, _ = compute_dynamic_scales_and_zp(weight, MXFP4_ARGS, module=None)
    out = MXFP4PackedCompressor.compress({"weight": weight.clone(), "weight_scale": scale}, MXFP4_SCHEME)
    m, n = out["weight_packed"].shape
    codes = unpack_fp4_from_uint8(out["weight_packed"], m, n * 2, dtype=torch.float32)
    values = dequantize(x_q=codes, scale=decompress_mx_scale(out["weight_scale"]).to(torch.float32),
                        args=MXFP4_ARGS, dtype=torch.float32)
    return {"weight_packed": out["weight_packed"], "weight_scale": out["weight_scale"], "decompressed": values}


def check_numpy(weight: np.ndarray, nv: dict, mx: dict) -> None:
    """The independent reading of the format: decode the nibbles and scales and multiply."""
    def decode(packed: np.ndarray) -> np.ndarray:
        nibbles = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
        return np.where(nibbles & 8, -1.0, 1.0).astype(np.float32) * E2M1[nibbles & 7]
    codes = decode(nv["weight_packed"].numpy())
    scales = nv["weight_scale"].to(torch.float32).numpy() / nv["weight_global_scale"].numpy()[0]
    expected = codes * np.repeat(scales, 16, axis=1)
    assert np.array_equal(expected, nv["decompressed"].numpy()), "NVFP4 decode disagrees"
    codes = decode(mx["weight_packed"].numpy())
    scales = np.exp2(mx["weight_scale"].numpy().astype(np.float64) - 127).astype(np.float32)
    expected = codes * np.repeat(scales, 32, axis=1)
    assert np.array_equal(expected, mx["decompressed"].numpy()), "MXFP4 decode disagrees"
    for name, values in (("NVFP4", nv["decompressed"]), ("MXFP4", mx["decompressed"])):
        error = np.linalg.norm(values.numpy() - weight) / max(np.linalg.norm(weight), 1e-30)
        assert error < 0.25, f"{name}: relative error {error}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("tests/golden/ct_fp4.safetensors"))
    args = parser.parse_args()
    import compressed_tensors
    rng = np.random.default_rng(SEED)
    weights = []
    for out_features, in_features, what in FP8_CASES:
        fp8, scale_inv = ctoracle.random_fp8_block_source(rng, out_features, in_features)
        weights.append((ctoracle.dequant_fp8_block(fp8, scale_inv), what))
    weights.append((torch.from_numpy(hand_case()), "hand-made: E2M1 ties, a zero row, tiny values, MX rounding"))
    tensors: dict[str, torch.Tensor] = {}
    metadata = {"producer": "scripts/oracle/make-fp4-golden.py",
                "compressed_tensors": compressed_tensors.__version__, "torch": torch.__version__}
    for index, (weight, what) in enumerate(weights):
        weight = weight.to(torch.float32).contiguous()
        nv, mx = nvfp4(weight), mxfp4(weight)
        check_numpy(weight.numpy(), nv, mx)
        tensors[f"case{index}.weight"] = weight
        for key, value in nv.items():
            tensors[f"case{index}.nvfp4.{key}"] = value.contiguous()
        for key, value in mx.items():
            tensors[f"case{index}.mxfp4.{key}"] = value.contiguous()
        metadata[f"case{index}.description"] = what
    metadata["cases"] = str(len(weights))
    # The gate/up pair: two FP8 sources of one expert, one global scale (the smaller).
    gate, up = (ctoracle.dequant_fp8_block(*ctoracle.random_fp8_block_source(rng, 64, 128)) for _ in range(2))
    up = up * 3.0  # up's absmax larger: its own global scale would be smaller
    globals_ = [generate_gparam(*torch.aminmax(w)) for w in (gate, up)]
    shared = torch.minimum(*globals_)
    for name, weight in (("gate", gate), ("up", up)):
        weight = weight.to(torch.float32).contiguous()
        tensors[f"pair.{name}.weight"] = weight
        for key, value in nvfp4(weight, shared).items():
            tensors[f"pair.{name}.nvfp4.{key}"] = value.clone().contiguous()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out), metadata=metadata)
    stable_header.sort_metadata_in_place(args.out)
    print(f"{args.out}: {len(weights)} cases + a gate/up pair, compressed-tensors {compressed_tensors.__version__}")


if __name__ == "__main__":
    main()
