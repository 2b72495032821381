"""Shared helpers for the oracle scripts: FP8 block sources and compressed-tensors INT4 calls.

Everything that quantizes or packs goes through compressed-tensors 0.20.1's own code:
  compressed_tensors.quantization.utils.helpers.compute_dynamic_scales_and_zp
      (per-group amin/amax -> calculate_qparams: scale = absmax / 7.5, zero scale -> eps)
  compressed_tensors.compressors.pack_quantized.base.PackedQuantizationCompressor.compress
      (= compressed_tensors.quantization.lifecycle.forward.quantize(..., dtype=int8)
       followed by compressed_tensors.compressors.pack_quantized.helpers.pack_to_int32)
  compressed_tensors.compressors.pack_quantized.helpers.unpack_from_int32
  compressed_tensors.quantization.lifecycle.forward.dequantize
The numpy functions here (names ending in _numpy) are the independent re-implementation
that the scripts compare compressed-tensors against.

All tensors here live on the CPU, where compressed-tensors always takes its eager torch
path (its triton kernel runs only for CUDA/XPU tensors and divides in f32 whatever the
input dtype; see measure-int4-agreement.py).
"""

import math

import numpy as np
import torch
from compressed_tensors.compressors.pack_quantized.base import (
    PackedQuantizationCompressor,
)
from compressed_tensors.compressors.pack_quantized.helpers import (
    pack_to_int32,
    unpack_from_int32,
)
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationScheme,
)
from compressed_tensors.quantization.lifecycle.forward import (
    dequantize,
    quantize,
)
from compressed_tensors.quantization.utils.helpers import (
    compute_dynamic_scales_and_zp,
)

FP8_BLOCK = 128
NUM_BITS = 4


def int4_args(group_size: int) -> QuantizationArgs:
    return QuantizationArgs(num_bits=NUM_BITS, type="int", symmetric=True,
                            strategy="group", group_size=group_size)


def int4_scheme(group_size: int) -> QuantizationScheme:
    return QuantizationScheme(targets=["Linear"], weights=int4_args(group_size))


# ---------------------------------------------------------------- FP8 block sources

def random_fp8_block_source(rng: np.random.Generator, out_features: int, in_features: int,
                            outlier_columns: int = 3):
    """A random DeepSeek-style FP8 block tensor: (fp8 codes as torch float8, f32 scale_inv).

    A "true" f32 weight (normal, std 0.02, a few outlier columns 5-20x larger) is cut
    into 128x128 blocks (partial edge blocks included); each block gets
    scale_inv = amax/448 (an arbitrary f32, as in DeepSeek-V3's conversion) and its
    codes are round(w / scale_inv) through float8_e4m3fn.
    """
    weight = (rng.standard_normal((out_features, in_features)) * 0.02).astype(np.float32)
    columns = rng.choice(in_features, size=min(outlier_columns, in_features), replace=False)
    weight[:, columns] *= rng.uniform(5.0, 20.0, size=columns.size).astype(np.float32)
    grid = (math.ceil(out_features / FP8_BLOCK), math.ceil(in_features / FP8_BLOCK))
    scale_inv = np.zeros(grid, dtype=np.float32)
    for bi in range(grid[0]):
        for bj in range(grid[1]):
            block = weight[bi * FP8_BLOCK:(bi + 1) * FP8_BLOCK, bj * FP8_BLOCK:(bj + 1) * FP8_BLOCK]
            scale_inv[bi, bj] = np.float32(np.abs(block).max()) / np.float32(448.0)
    rows = np.arange(out_features) // FP8_BLOCK
    cols = np.arange(in_features) // FP8_BLOCK
    scaled = weight / scale_inv[np.ix_(rows, cols)]
    fp8 = torch.from_numpy(np.clip(scaled, -448.0, 448.0)).to(torch.float8_e4m3fn)
    return fp8, torch.from_numpy(scale_inv)


def dequant_fp8_block(fp8: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """Exact f32 dequant: w[i,j] = f32(fp8[i,j]) * scale_inv[i//128, j//128] (one f32 multiply)."""
    out_features, in_features = fp8.shape
    rows = torch.arange(out_features) // FP8_BLOCK
    cols = torch.arange(in_features) // FP8_BLOCK
    expanded = scale_inv.to(torch.float32)[rows][:, cols]
    return fp8.to(torch.float32) * expanded


def dequant_fp8_block_numpy(fp8_codes: np.ndarray, scale_inv: np.ndarray,
                            decode_table: np.ndarray) -> np.ndarray:
    values = decode_table[fp8_codes]
    rows = np.arange(fp8_codes.shape[0]) // FP8_BLOCK
    cols = np.arange(fp8_codes.shape[1]) // FP8_BLOCK
    return (values * scale_inv[np.ix_(rows, cols)]).astype(np.float32)


def fp8_decode_table() -> np.ndarray:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(
        torch.float8_e4m3fn).float().numpy().copy()


# ---------------------------------------------------------------- the f32 contract via compressed-tensors

def ct_minmax_scale_f32(weight_f32: torch.Tensor, group_size: int) -> torch.Tensor:
    """compressed-tensors' own minmax scale on the f32 weight, then rounded to BF16.

    compute_dynamic_scales_and_zp reshapes to groups, takes amin/amax, and
    calculate_qparams gives absmax / 7.5 in f32 (0 -> torch.finfo(float32).eps).
    Returned as BF16 [out, in/group].
    """
    assert weight_f32.dtype == torch.float32
    scale, _ = compute_dynamic_scales_and_zp(weight_f32, int4_args(group_size),
                                             module=torch.nn.Module())
    return scale.to(torch.bfloat16)


def ct_quantize_pack(weight: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """compressed-tensors' PackedQuantizationCompressor.compress: quantize then pack_to_int32.

    The arithmetic dtype is whatever `weight` and `scale` are (torch promotion of x / scale).
    """
    compressed = PackedQuantizationCompressor.compress(
        {"weight": weight, "weight_scale": scale}, int4_scheme(group_size))
    return compressed["weight_packed"]


def quantize_via_ct(weight: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """compressed-tensors' quantize (no packing): int8 q in [-8, 7]."""
    return quantize(x=weight, scale=scale, zero_point=None, args=int4_args(group_size),
                    dtype=torch.int8)


def ct_unpack(packed: torch.Tensor, shape) -> torch.Tensor:
    """compressed-tensors' unpack_from_int32 -> int8 q in [-8, 7], shape [out, in]."""
    return unpack_from_int32(packed, NUM_BITS, torch.Size([int(s) for s in shape]))


def ct_dequantize(q_int8: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    return dequantize(q_int8, scale, None, int4_args(group_size), dtype=torch.float32)


def ct_pack(q_int8: torch.Tensor) -> torch.Tensor:
    return pack_to_int32(q_int8, NUM_BITS)


# ---------------------------------------------------------------- independent numpy versions

def bf16_bits_to_f32(bits_u16: np.ndarray) -> np.ndarray:
    return (bits_u16.astype(np.uint32) << 16).view(np.float32)


def quantize_numpy(weight_f32: np.ndarray, scale_f32: np.ndarray, group_size: int) -> np.ndarray:
    """q = clamp(round_half_even(w / scale), -8, 7) in f32; scale [out, in/group]."""
    expanded = np.repeat(scale_f32.astype(np.float32), group_size, axis=1)[:, :weight_f32.shape[1]]
    quotient = weight_f32.astype(np.float32) / expanded
    return np.clip(np.rint(quotient), -8, 7).astype(np.int8)


def unpack_numpy(packed_i32: np.ndarray, in_features: int) -> np.ndarray:
    words = packed_i32.astype(np.int32).view(np.uint32)
    shifts = (4 * np.arange(8, dtype=np.uint32))
    nibbles = (words[:, :, None] >> shifts) & 0xF
    return (nibbles.reshape(words.shape[0], -1)[:, :in_features].astype(np.int16) - 8).astype(np.int8)


def pack_numpy(q_int8: np.ndarray) -> np.ndarray:
    rows, cols = q_int8.shape
    words = math.ceil(cols / 8)
    u = np.zeros((rows, words * 8), dtype=np.uint32)  # padding nibbles are 0 bits
    u[:, :cols] = (q_int8.astype(np.int32) + 8).astype(np.uint32)
    shifts = (4 * np.arange(8, dtype=np.uint32))
    packed = (u.reshape(rows, words, 8) << shifts).sum(axis=2, dtype=np.uint64).astype(np.uint32)
    return packed.view(np.int32)
