#!/usr/bin/env python3
"""Measure how often compressed-tensors run "the llm-compressor way" on a BF16 model agrees
with squeeze's f32 contract. The numbers go into scripts/oracle/INT4-AGREEMENT.md.

Usage (repository root, after scripts/oracle/setup-venv.sh; ~1 min on 2 cores):

    .venv-oracle/bin/python scripts/oracle/measure-int4-agreement.py [--seed 7]

Weights: random DeepSeek-style FP8 block tensors (ctoracle.random_fp8_block_source) of
Kimi-K2 routed-expert shapes, dequantized exactly to f32.

  contract   scale = bf16(absmax_f32 / 7.5); q = clamp(rne(w_f32 / f32(scale)), -8, 7)
             (compute_dynamic_scales_and_zp on f32, .to(bf16), PackedQuantizationCompressor
             .compress with f32 weight and f32 scale)
  bf16-cpu   what llm-compressor does on a BF16 model on the CPU (eager torch path):
             w = w_f32.to(bf16); scale from compute_dynamic_scales_and_zp on the BF16 weight
             (amin/amax and absmax / 7.5 in BF16, zero -> finfo(bf16).eps); compress() with
             BF16 weight and BF16 scale, so w / scale is rounded to BF16 before round().
  bf16-gpu   the same BF16 weight and scale, but quantized the way compressed-tensors'
             triton kernel (_quantize_kernel, used on CUDA) does it: tl.div_rn in f32 then
             rint. Emulated by calling compress() with the BF16 values upcast to f32.
"""

import argparse
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import ctoracle  # noqa: E402

SHAPES = [  # (name, out, in, group)
    ("gate_proj-like [2048, 7168] g32", 2048, 7168, 32),
    ("down_proj-like [7168, 2048] g32", 7168, 2048, 32),
    ("gate_proj-like [2048, 7168] g128", 2048, 7168, 128),
]


def expand(scale: torch.Tensor, group_size: int) -> torch.Tensor:
    return scale.repeat_interleave(group_size, dim=1)


def measure(name, weight_f32, group_size, show_examples):
    out_features, in_features = weight_f32.shape
    shape = weight_f32.shape

    scale_c = ctoracle.ct_minmax_scale_f32(weight_f32, group_size)
    q_c = ctoracle.ct_unpack(
        ctoracle.ct_quantize_pack(weight_f32, scale_c.float(), group_size), shape)

    weight_b = weight_f32.to(torch.bfloat16)
    scale_b, _ = ctoracle.compute_dynamic_scales_and_zp(
        weight_b, ctoracle.int4_args(group_size), module=torch.nn.Module())
    assert scale_b.dtype == torch.bfloat16
    q_cpu = ctoracle.ct_unpack(ctoracle.ct_quantize_pack(weight_b, scale_b, group_size), shape)
    q_gpu = ctoracle.ct_unpack(
        ctoracle.ct_quantize_pack(weight_b.float(), scale_b.float(), group_size), shape)

    total = q_c.numel()
    same_scale_groups = scale_c.view(torch.int16) == scale_b.view(torch.int16)
    same_scale = expand(same_scale_groups, group_size)

    # classify every nibble where bf16-cpu differs from the contract
    q_wb_f32 = torch.clamp(torch.round(weight_b.float() / expand(scale_b.float(), group_size)), -8, 7)
    diff = q_cpu != q_c
    cause_scale = diff & ~same_scale
    cause_weight = diff & same_scale & (q_wb_f32.to(torch.int8) != q_c)
    cause_quotient = diff & same_scale & (q_wb_f32.to(torch.int8) == q_c)

    def rel_l2(q, scale):
        deq = q.float() * expand(scale.float(), group_size)
        return float(torch.linalg.norm(deq - weight_f32) / torch.linalg.norm(weight_f32))

    row = {
        "name": name,
        "elements": total,
        "scale_agree": float(same_scale_groups.float().mean()),
        "cpu_agree": 1.0 - float(diff.float().mean()),
        "gpu_agree": float((q_gpu == q_c).float().mean()),
        "cpu_gpu_agree": float((q_gpu == q_cpu).float().mean()),
        "cause_scale": int(cause_scale.sum()),
        "cause_weight": int(cause_weight.sum()),
        "cause_quotient": int(cause_quotient.sum()),
        "max_step": int((q_cpu.int() - q_c.int()).abs().max()),
        "err_contract": rel_l2(q_c, scale_c),
        "err_cpu": rel_l2(q_cpu, scale_b),
        "err_gpu": rel_l2(q_gpu, scale_b),
    }

    if show_examples:
        for label, mask in (("quotient rounded to BF16", cause_quotient),
                            ("weight rounded to BF16", cause_weight),
                            ("scale differs", cause_scale)):
            idx = mask.nonzero()[:2]
            for r, c in idx.tolist():
                g = c // group_size
                w = float(weight_f32[r, c])
                wb = float(weight_b[r, c])
                sc, sb = float(scale_c[r, g]), float(scale_b[r, g])
                quot_c = np.float32(w) / np.float32(sc)
                quot_g = np.float32(wb) / np.float32(sb)  # f32 division of BF16 values (triton)
                quot_b = (weight_b[r, c] / scale_b[r, g]).item()  # BF16 division, as eager torch
                print(f"  example ({label}) [{r},{c}]: w_f32={w!r} w_bf16={wb!r} "
                      f"scale_contract={sc!r} scale_bf16={sb!r} | "
                      f"contract w/s={float(quot_c)!r} -> q={int(q_c[r, c])} | "
                      f"bf16-gpu w/s={float(quot_g)!r} -> q={int(q_gpu[r, c])} | "
                      f"bf16-cpu w/s={quot_b!r} -> q={int(q_cpu[r, c])}")
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(args.seed)
    rows = []
    for name, out_features, in_features, group_size in SHAPES:
        fp8, scale_inv = ctoracle.random_fp8_block_source(rng, out_features, in_features)
        weight = ctoracle.dequant_fp8_block(fp8, scale_inv)
        print(name)
        rows.append(measure(name, weight, group_size, show_examples=(len(rows) == 0)))

    print()
    print("| tensor | elements | scales equal | nibbles equal, bf16-cpu | nibbles equal, bf16-gpu "
          "| bf16-cpu vs bf16-gpu | bf16-cpu diffs by cause: scale / weight / quotient | max abs Δq "
          "| rel. L2 error contract / cpu / gpu |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['elements']:,} | {100 * r['scale_agree']:.3f} % "
              f"| {100 * r['cpu_agree']:.3f} % | {100 * r['gpu_agree']:.3f} % "
              f"| {100 * r['cpu_gpu_agree']:.3f} % "
              f"| {r['cause_scale']:,} / {r['cause_weight']:,} / {r['cause_quotient']:,} "
              f"| {r['max_step']} | {r['err_contract']:.5f} / {r['err_cpu']:.5f} / {r['err_gpu']:.5f} |")


if __name__ == "__main__":
    main()
