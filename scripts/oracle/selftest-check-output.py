#!/usr/bin/env python3
"""Self-test of check-output.py on a tiny checkpoint made here in Python (no squeeze binary needed).

Usage (repository root, after scripts/oracle/setup-venv.sh; ~1 min on 2 cores):

    .venv-oracle/bin/python scripts/oracle/selftest-check-output.py [--keep DIR]

Builds, in a temporary directory (or DIR with --keep):
  float/   a random tiny DeepseekV3ForCausalLM (hidden 160, experts 96 wide: partial 128-blocks)
  source/  its DeepSeek-style FP8 block checkpoint (model_type kimi_k2, weight F8_E4M3 +
           weight_scale_inv F32 per 128x128 block, 2 shards + index)
  output/  what squeeze's kimi-k2-int4 recipe is specified to write (docs/formats.md): routed experts
           pack-quantized INT4 g32 with the minmax contract via compressed-tensors, everything
           else BF16, compressed-tensors quantization_config, 2 shards + index
then runs check-output.py on output/ (expects exit 0) and on three corrupted copies: one flipped
nibble (expects 1, check b), a NaN scale (expects 1, check a), all routed experts of the MoE
layer removed (expects 1, check c: missing routed-expert keys) and one expert removed (expects 1,
check c: transformers stacks the 3 experts left and refuses the fused [3, ...] shape).
"""

import argparse
import json
import math
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import ctoracle  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
GROUP_SIZE = 32
NOT_FP8 = ("embed_tokens", "lm_head", "norm", "mlp.gate.")


def tiny_model(directory: pathlib.Path):
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    config = DeepseekV3Config(
        vocab_size=256, hidden_size=160, intermediate_size=224, moe_intermediate_size=96,
        num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=64, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=128, num_nextn_predict_layers=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)


def fp8_block(weight: torch.Tensor):
    """DeepSeek-V3 style: per 128x128 block scale_inv = amax/448, codes = fp8(w / scale_inv)."""
    out_features, in_features = weight.shape
    grid = (math.ceil(out_features / 128), math.ceil(in_features / 128))
    scale_inv = torch.empty(grid, dtype=torch.float32)
    for i in range(grid[0]):
        for j in range(grid[1]):
            block = weight[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            scale_inv[i, j] = block.abs().max() / 448.0
    expanded = scale_inv[torch.arange(out_features) // 128][:, torch.arange(in_features) // 128]
    return (weight / expanded).clamp(-448, 448).to(torch.float8_e4m3fn), scale_inv


def write_sharded(tensors: dict, directory: pathlib.Path, shards: int = 2):
    names = sorted(tensors)
    weight_map, total = {}, 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[s::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        for n, t in part.items():
            weight_map[n] = file
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def make_source(float_dir: pathlib.Path, source_dir: pathlib.Path):
    source_dir.mkdir()
    tensors = {}
    for name, tensor in load_file(str(float_dir / "model.safetensors")).items():
        if tensor.ndim == 2 and name.endswith(".weight") and not any(k in name for k in NOT_FP8):
            fp8, scale_inv = fp8_block(tensor)
            tensors[name] = fp8
            tensors[name.replace(".weight", ".weight_scale_inv")] = scale_inv
        elif name.endswith("e_score_correction_bias"):
            tensors[name] = tensor.float()
        else:
            tensors[name] = tensor.to(torch.bfloat16)
    write_sharded(tensors, source_dir)
    config = json.loads((float_dir / "config.json").read_text())
    config["model_type"] = "kimi_k2"
    config["dtype"] = "bfloat16"
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                     "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (source_dir / "config.json").write_text(json.dumps(config, indent=2))


def make_output(source_dir: pathlib.Path, output_dir: pathlib.Path):
    """The kimi-k2-int4 convention of docs/formats.md, written independently of squeeze."""
    output_dir.mkdir()
    source = {}
    for file in sorted(source_dir.glob("*.safetensors")):
        source.update(load_file(str(file)))
    tensors = {}
    for name, tensor in source.items():
        if name.endswith(".weight_scale_inv"):
            continue
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        if prefix and f"{prefix}.weight_scale_inv" in source:
            weight = ctoracle.dequant_fp8_block(tensor, source[f"{prefix}.weight_scale_inv"])
            if ".mlp.experts." in prefix:
                scale = ctoracle.ct_minmax_scale_f32(weight, GROUP_SIZE)
                tensors[f"{prefix}.weight_packed"] = ctoracle.ct_quantize_pack(
                    weight, scale.float(), GROUP_SIZE)
                tensors[f"{prefix}.weight_scale"] = scale
                tensors[f"{prefix}.weight_shape"] = torch.tensor(list(weight.shape), dtype=torch.int64)
            else:
                tensors[name] = weight.to(torch.bfloat16)
        else:
            tensors[name] = tensor
    write_sharded(tensors, output_dir)
    config = json.loads((source_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": GROUP_SIZE, "dynamic": False, "observer": "minmax",
                        "actorder": None, "block_structure": None}}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                   "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
        "kv_cache_scheme": None}
    (output_dir / "config.json").write_text(json.dumps(config, indent=2))


def corrupt_copy(output_dir: pathlib.Path, target: pathlib.Path, edit):
    shutil.copytree(output_dir, target)
    index = json.loads((target / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    for file in files:
        tensors = load_file(str(target / file))
        if edit(tensors):
            save_file(tensors, str(target / file), metadata={"format": "pt"})
    index["weight_map"] = {n: f for n, f in index["weight_map"].items()
                           if n in load_file(str(target / f))}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))


def run_check(label, args, expect, must_contain=None):
    command = [sys.executable, str(HERE / "check-output.py"), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True)
    output = result.stdout + result.stderr
    ok = result.returncode == expect and (must_contain is None or must_contain in output)
    print(f"[{'pass' if ok else 'FAIL'}] {label}: exit {result.returncode} (expected {expect})")
    if not ok or label.startswith("clean"):
        print("    " + "\n    ".join(line for line in output.splitlines()
                                     if "Loading weights" not in line and line.strip()))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=pathlib.Path, help="build in this (new) directory and keep it")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True)
        root, cleanup = args.keep, None
    else:
        cleanup = tempfile.TemporaryDirectory(prefix="squeeze-oracle-selftest-")
        root = pathlib.Path(cleanup.name)

    tiny_model(root / "float")
    make_source(root / "float", root / "source")
    make_output(root / "source", root / "output")
    expert = "model.layers.1.mlp.experts.2.up_proj"

    def flip_nibble(tensors):
        name = f"{expert}.weight_packed"
        if name not in tensors:
            return False
        packed = tensors[name].clone()
        packed[3, 1] ^= 0x1 << 8
        tensors[name] = packed
        return True

    def nan_scale(tensors):
        name = f"{expert}.weight_scale"
        if name not in tensors:
            return False
        scale = tensors[name].clone()
        scale[0, 0] = float("nan")
        tensors[name] = scale
        return True

    def drop_expert(tensors):
        names = [n for n in tensors if n.startswith("model.layers.1.mlp.experts.1.")]
        for n in names:
            del tensors[n]
        return bool(names)

    corrupt_copy(root / "output", root / "flipped", flip_nibble)
    corrupt_copy(root / "output", root / "nan_scale", nan_scale)
    corrupt_copy(root / "output", root / "dropped", drop_expert)

    def drop_all_experts(tensors):
        names = [n for n in tensors if n.startswith("model.layers.1.mlp.experts.")]
        for n in names:
            del tensors[n]
        return bool(names)

    corrupt_copy(root / "output", root / "no_experts", drop_all_experts)

    results = [
        run_check("clean output, with source and load", [root / "output", "--source", root / "source"], 0),
        run_check("one flipped nibble", [root / "flipped", "--source", root / "source", "--skip-load"],
                  1, "differs from compressed-tensors' quantize+pack"),
        run_check("NaN scale", [root / "nan_scale", "--skip-load"], 1, "non-finite"),
        run_check("all experts removed", [root / "no_experts"], 1, "routed-expert missing_keys"),
        run_check("expert 1 removed", [root / "dropped", "--source", root / "source"], 1,
                  "from_pretrained raised"),
    ]
    if cleanup:
        cleanup.cleanup()
    print("selftest", "passed" if all(results) else "FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
