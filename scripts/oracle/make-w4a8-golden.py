#!/usr/bin/env python3
"""Write tests/golden/vllm_w4a8.safetensors: W4A8-FP8 as vLLM computes it with its CUTLASS W4A8 kernels (Hopper),
from vLLM's own functions, for `src/quant/w4a8.rs`:

- activations: `QuantFP8(static=False, group_shape=PER_TOKEN).forward_native` (`input_quant_fp8.py`), the per-token
  dynamic e4m3 quantization the W4A8 MoE applies to each expert input; stored dequantized (codes · scale);
- weight scales: `convert_bf16_scales_to_fp8` (`quantization/utils/quant_utils.py`), which
  `fused_moe/oracle/w4a8.py` `convert_to_w4a8_moe_kernel_format` runs on the BF16 group scales at load. It asserts
  its input is on a GPU (this machine has none); the scales are passed as a torch.Tensor subclass that reports
  `is_cuda`, and nothing else about the function changes;
- weights: the reference of vLLM's kernel test `tests/kernels/quantization/test_cutlass_w4a8.py`
  (`cutlass_quantize_and_pack`): `(w_q.float() · w_s.to(e4m3).float()).to(e4m3)`, times the channel scale.

Usage (from the repository root, with the vLLM oracle's venv, scripts/oracle/vllm/setup.sh):

    /work/venv-vllm/bin/python scripts/oracle/make-w4a8-golden.py

Tensors (i = 0..N-1):
    tokens{i}.x          F32 [rows, cols]    activations (rows far apart in scale, a zero row)
    tokens{i}.dequant    F32 [rows, cols]    forward_native's codes · its per-token scale, in f32
    weight{i}.codes      I8  [rows, cols]    INT4 codes −8…7
    weight{i}.scales     BF16 [rows, groups] the checkpoint's group scales (group 128)
    weight{i}.dequant    F32 [rows, cols]    the weight the kernel multiplies: e4m3(q · s8) · channel
"""
import argparse

import torch
from safetensors.torch import save_file
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, convert_bf16_scales_to_fp8

GROUP = 128


class ReportsCuda(torch.Tensor):
    """A CPU tensor that answers `is_cuda` with True, for `convert_bf16_scales_to_fp8`'s device assertion."""

    @property
    def is_cuda(self):
        return True


parser = argparse.ArgumentParser()
parser.add_argument("--out", default="tests/golden/vllm_w4a8.safetensors")
args = parser.parse_args()

with set_current_vllm_config(VllmConfig()):  # a CustomOp reads the current config when it is made
    quant = QuantFP8(static=False, group_shape=GroupShape.PER_TOKEN)
generator = torch.Generator().manual_seed(34)
tensors = {}

token_cases = []
for rows, cols, spread in [(5, 256, 1.0), (6, 512, 300.0), (3, 256, 1e-4)]:
    x = torch.randn(rows, cols, generator=generator, dtype=torch.float32)
    x *= torch.logspace(-2, 2, rows).unsqueeze(1) * spread
    token_cases.append(x)
token_cases[0][2] = 0.0  # an all-zero token: the floor scale
for i, x in enumerate(token_cases):
    q, scale = quant.forward_native(x.clone())
    tensors[f"tokens{i}.x"] = x.contiguous()
    tensors[f"tokens{i}.dequant"] = (q.to(torch.float32) * scale).contiguous()

weight_cases = []
for rows, cols, spread in [(4, 256, 1.0), (8, 1024, 1.0), (3, 512, 1e-5)]:
    codes = torch.randint(-8, 8, (rows, cols), generator=generator, dtype=torch.int8)
    # Scales spread over a few octaves per row, as GPTQ/minmax scales are; the small case reaches the subnormal
    # e4m3 range after the division by 8.
    scales = torch.rand(rows, cols // GROUP, generator=generator) * 0.02 * spread + 1e-3 * spread
    scales[0, 0] *= 40.0  # one group far above its row: the others' e4m3 scales lose precision
    weight_cases.append((codes, scales.to(torch.bfloat16)))
for i, (codes, scales) in enumerate(weight_cases):
    fp8_scales, channel = convert_bf16_scales_to_fp8(quant.forward_native, scales.contiguous().as_subclass(ReportsCuda))
    fp8_scales = fp8_scales.as_subclass(torch.Tensor)
    channel = channel.as_subclass(torch.Tensor)
    grouped = fp8_scales.to(torch.float32).repeat_interleave(GROUP, dim=1)
    weight = (codes.to(torch.float32) * grouped).to(torch.float8_e4m3fn).to(torch.float32) * channel
    tensors[f"weight{i}.codes"] = codes.contiguous()
    tensors[f"weight{i}.scales"] = scales.contiguous()
    tensors[f"weight{i}.dequant"] = weight.contiguous()
save_file(tensors, args.out)
print(f"wrote {args.out}: {len(token_cases)} token cases, {len(weight_cases)} weight cases")
