#!/usr/bin/env python3
"""Write tests/golden/vllm_nvfp4_activations.safetensors: vLLM's own NVFP4 activation quantize-dequantize, the
emulation it runs for W4A4 NVFP4 (compressed-tensors `input_activations` float 4-bit, tensor_group, group 16,
dynamic "local") on hardware without FP4 tensor cores, and the one its MoE emulation applies to each routed expert's
inputs (`fused_moe/experts/nvfp4_emulation_moe.py`, `quantization/utils/nvfp4_emulation_utils.py`
`ref_nvfp4_quant_dequant`, CPU branch: `ref_nvfp4_quant` then `x_fp4 · (scale / global)`).

Usage (from the repository root, with the vLLM oracle's venv, scripts/oracle/vllm/setup.sh):

    /work/venv-vllm/bin/python scripts/oracle/make-nvfp4-activation-golden.py

Tensors (i = 0..N-1):
    case{i}.x          F32 [rows, cols]  activations (some rows scaled far apart, a zero group, saturating values)
    case{i}.global     F32 [1]           the activation global scale (an input_global_scale)
    case{i}.dequant    F32 [rows, cols]  ref_nvfp4_quant_dequant(x, global, 16) in f32
"""
import argparse

import torch
from safetensors.torch import save_file
from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import ref_nvfp4_quant_dequant

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="tests/golden/vllm_nvfp4_activations.safetensors")
args = parser.parse_args()

generator = torch.Generator().manual_seed(31)
tensors = {}
cases = []
for rows, cols, spread in [(5, 64, 1.0), (7, 96, 30.0), (3, 192, 0.01)]:
    x = torch.randn(rows, cols, generator=generator, dtype=torch.float32)
    x *= torch.logspace(-1, 1, rows).unsqueeze(1) * spread
    cases.append(x)
x = cases[0].clone()
x[1, 16:32] = 0.0            # a zero group
x[2, 5] = 1e4                # a group whose absmax saturates the FP8 scale under a small global
cases.append(x)
for i, x in enumerate(cases):
    amax = x.abs().max().to(torch.float32)
    # compressed-tensors' generate_gparam (448 · 6 / amax), as calibration computes an input_global_scale; the last
    # case uses a global from another tensor's range, so its largest groups saturate.
    gs = (torch.reciprocal(amax) * (448.0 * 6.0)).reshape(1)
    if i == len(cases) - 1:
        gs = (torch.reciprocal(amax / 50) * (448.0 * 6.0)).reshape(1)
    tensors[f"case{i}.x"] = x.contiguous()
    tensors[f"case{i}.global"] = gs.to(torch.float32)
    tensors[f"case{i}.dequant"] = ref_nvfp4_quant_dequant(x, gs.to(torch.float32), 16).to(torch.float32).contiguous()
save_file(tensors, args.out)
print(f"wrote {args.out}: {len(cases)} cases")
