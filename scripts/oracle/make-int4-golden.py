#!/usr/bin/env python3
"""Write tests/golden/ct_int4.safetensors: compressed-tensors INT4 pack-quantized goldens.

Usage (from the repository root, after scripts/oracle/setup-venv.sh):

    .venv-oracle/bin/python scripts/oracle/make-int4-golden.py [--out tests/golden/ct_int4.safetensors]

The contract the Rust side implements, per group of `group_size` consecutive inputs of a row:
    absmax = max |w| over the f32 group
    scale  = bf16_round_nearest_even(absmax / 7.5)       (f32 division, then to BF16)
             absmax == 0  ->  torch.finfo(float32).eps = 2^-23 (exact in BF16)
    q      = clamp(round_half_even(w / f32(scale)), -8, 7)  (f32 division)
    packed = u = q + 8, element j of a row in bits 4*(j%8).. of word j/8, padding nibbles 0

Every golden is produced by compressed-tensors 0.20.1's own code (see ctoracle.py):
    scale:  compute_dynamic_scales_and_zp (amin/amax + calculate_qparams) on the f32
            weight, then .to(torch.bfloat16)
    packed: PackedQuantizationCompressor.compress({"weight": w_f32, "weight_scale":
            scale_bf16.float()}) = quantize(..., dtype=int8) + pack_to_int32
and then checked against an independent numpy implementation of the contract.

Tensors (i = 0..N-1, group sizes in __metadata__ as "case{i}.group_size"):
    case{i}.weight            F32  [out, in]      exact f32 dequant of the FP8 source below
    case{i}.source_fp8        F8_E4M3 [out, in]   FP8 block source codes (absent for hand-made cases)
    case{i}.source_scale_inv  F32  [ceil(out/128), ceil(in/128)]
    case{i}.weight_packed     I32  [out, ceil(in/8)]
    case{i}.weight_scale      BF16 [out, in/group]
    case{i}.weight_shape      I64  [2]
    pack_example.q            I8   [8]  = [-8,-7,-1,0,1,2,3,7]
    pack_example.packed       I32  [1]  = pack_to_int32(q) = 0xfba98710 (as signed)
"""

import argparse
import math
import pathlib
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import ctoracle  # noqa: E402
import stable_header  # noqa: E402

SEED = 20250
# (out, in, group_size, description)
FP8_CASES = [
    (40, 96, 32, "in < 128: one partial FP8 column block"),
    (37, 192, 64, "partial FP8 blocks on both axes"),
    (130, 256, 128, "out crosses an FP8 row block by 2"),
    (24, 160, 32, "in = 128 + 32"),
    (6, 36, 12, "in % 8 != 0: last packed word has 4 zero padding nibbles"),
]


def tie_case() -> tuple[np.ndarray, int]:
    """[8, 8] group 8: exact .5 quotients (round half to even), clamp at -8/7, a zero group.

    Row 0 is docs/formats.md's example: scale 0.0625, w/s = [-7.5,7.5,2.5,1.5,-0.5,0,3.2,-1.7]
    -> q [-8,7,2,2,0,0,3,-2] -> 0x6b88aaf0. Rows 1..6: w = s*k/2 with |k| <= 15 and one
    element pinned at +-7.5*s so that absmax/7.5 == s (a power of two) exactly.
    Row 7 is all zeros (scale -> eps, q = 0).
    """
    rng = np.random.default_rng(SEED + 1)
    rows = [np.array([-7.5, 7.5, 2.5, 1.5, -0.5, 0.0, 3.2, -1.7], np.float32) * np.float32(0.0625)]
    for r in range(1, 7):
        s = np.float32(2.0 ** -(3 + r))
        halves = rng.integers(-15, 16, size=8).astype(np.float32) / 2
        halves[rng.integers(0, 8)] = 7.5 if r % 2 else -7.5
        rows.append(halves * s)
    rows.append(np.zeros(8, np.float32))
    return np.stack(rows).astype(np.float32), 8


def build_case(weight: torch.Tensor, group_size: int):
    scale_bf16 = ctoracle.ct_minmax_scale_f32(weight, group_size)
    packed = ctoracle.ct_quantize_pack(weight, scale_bf16.to(torch.float32), group_size)
    return scale_bf16, packed


def check_against_numpy(weight: torch.Tensor, scale_bf16: torch.Tensor, packed: torch.Tensor,
                        group_size: int, name: str) -> None:
    w = weight.numpy()
    out_features, in_features = w.shape
    grouped = np.abs(w).reshape(out_features, in_features // group_size, group_size)
    absmax = grouped.max(axis=2)
    scale_f32 = (absmax / np.float32(7.5)).astype(np.float32)
    scale_f32[scale_f32 == 0] = np.finfo(np.float32).eps
    scale_bf16_np = torch.from_numpy(scale_f32).to(torch.bfloat16)  # RNE f32 -> bf16
    assert torch.equal(scale_bf16_np.view(torch.int16), scale_bf16.view(torch.int16)), name
    q = ctoracle.quantize_numpy(w, scale_bf16.float().numpy(), group_size)
    assert np.array_equal(ctoracle.pack_numpy(q), packed.numpy()), name
    assert np.array_equal(ctoracle.unpack_numpy(packed.numpy(), in_features), q), name
    assert torch.equal(ctoracle.ct_unpack(packed, w.shape), torch.from_numpy(q)), name
    assert packed.shape == (out_features, math.ceil(in_features / 8)), name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    repo_root = pathlib.Path(__file__).resolve().parents[2]
    parser.add_argument("--out", type=pathlib.Path,
                        default=repo_root / "tests/golden/ct_int4.safetensors")
    args = parser.parse_args()

    rng = np.random.default_rng(SEED)
    tensors: dict[str, torch.Tensor] = {}
    metadata = {"producer": "scripts/oracle/make-int4-golden.py",
                "compressed_tensors_functions": "compute_dynamic_scales_and_zp, "
                "PackedQuantizationCompressor.compress (quantize + pack_to_int32)",
                "zero_group_scale": "torch.finfo(torch.float32).eps (2^-23)"}

    cases = []
    for out_features, in_features, group_size, what in FP8_CASES:
        fp8, scale_inv = ctoracle.random_fp8_block_source(rng, out_features, in_features)
        weight = ctoracle.dequant_fp8_block(fp8, scale_inv)
        cases.append((weight, group_size, what, fp8, scale_inv))
    tie_weight, tie_group = tie_case()
    cases.append((torch.from_numpy(tie_weight), tie_group,
                  "hand-made ties, clamp and zero group", None, None))

    for i, (weight, group_size, what, fp8, scale_inv) in enumerate(cases):
        name = f"case{i}"
        if fp8 is not None:
            # the numpy dequant agrees with the torch one, bit for bit
            np_weight = ctoracle.dequant_fp8_block_numpy(
                fp8.view(torch.uint8).numpy(), scale_inv.numpy(), ctoracle.fp8_decode_table())
            assert np.array_equal(np_weight.view(np.uint32), weight.numpy().view(np.uint32))
            tensors[f"{name}.source_fp8"] = fp8.contiguous()
            tensors[f"{name}.source_scale_inv"] = scale_inv.contiguous()
        scale_bf16, packed = build_case(weight, group_size)
        check_against_numpy(weight, scale_bf16, packed, group_size, name)
        tensors[f"{name}.weight"] = weight.contiguous()
        tensors[f"{name}.weight_packed"] = packed.contiguous()
        tensors[f"{name}.weight_scale"] = scale_bf16.contiguous()
        tensors[f"{name}.weight_shape"] = torch.tensor(list(weight.shape), dtype=torch.int64)
        metadata[f"{name}.group_size"] = str(group_size)
        metadata[f"{name}.description"] = what
        q = ctoracle.ct_unpack(packed, weight.shape)
        print(f"{name}: {list(weight.shape)} g{group_size} ({what}); "
              f"q histogram -8:{int((q == -8).sum())} 7:{int((q == 7).sum())}")
    metadata["cases"] = str(len(cases))

    tie_packed = tensors[f"case{len(cases) - 1}.weight_packed"]
    assert int(tie_packed[0, 0]) & 0xFFFFFFFF == 0x6B88AAF0, hex(int(tie_packed[0, 0]) & 0xFFFFFFFF)
    assert int(tie_packed[7, 0]) & 0xFFFFFFFF == 0x88888888  # zero row: u = 8 everywhere

    pack_q = torch.tensor([-8, -7, -1, 0, 1, 2, 3, 7], dtype=torch.int8)
    pack_word = ctoracle.ct_pack(pack_q.reshape(1, 8)).reshape(1)
    assert int(pack_word[0]) & 0xFFFFFFFF == 0xFBA98710, hex(int(pack_word[0]) & 0xFFFFFFFF)
    tensors["pack_example.q"] = pack_q
    tensors["pack_example.packed"] = pack_word.to(torch.int32).contiguous()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out), metadata=metadata)
    stable_header.sort_metadata_in_place(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
