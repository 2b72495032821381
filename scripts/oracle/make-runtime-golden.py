#!/usr/bin/env python3
"""Write tests/golden/runtime/: tiny FP8 checkpoints of all three architectures and HF transformers' float32
logits on fixed token ids, so CI checks the Rust runtime against transformers without Python.

Usage (from the repository root, after scripts/oracle/setup-venv.sh and `cargo build`):

    .venv-oracle/bin/python scripts/oracle/make-runtime-golden.py [--squeeze target/debug/squeeze]

For each architecture (kimi-k2, glm5, glm45) it:
  1. writes a tiny FP8 checkpoint with `squeeze synth` at awkward sizes (hidden 160, moe_intermediate 96,
     nothing a multiple of 128: every FP8 scale grid has partial edge blocks) and edits its config to switch on
     what the architecture must exercise: YaRN for both MLA models (Kimi mscale == mscale_all_dim, GLM-5 with
     mscale != mscale_all_dim so cos/sin are rescaled), group-limited top-k for Kimi (n_group 2, topk_group 1),
     GLM-5 DSA with index_topk 8 < sequence length 24 and a `shared` indexer layer;
  2. dequantizes it exactly in float32 (fp8 x scale per 128x128 block, partial edge blocks), drops MTP layers and
     the indexers of shared layers, sets model_type deepseek_v3 for kimi_k2 and saves a plain float32 folder
     (transformers' own FP8 loader mis-sizes partial blocks on CPU and rounds to BF16: REFERENCES.md section 8);
  3. loads it with from_pretrained(dtype=float32, attn_implementation="eager") and checks nothing was missing;
  4. runs the forward on two fixed sequences and records, via hooks, the smallest router and DSA top-k margins;
     a seed whose margins fall under MIN_MARGIN is rejected (random tiny models have near-ties that an independent
     f32 implementation may legitimately break the other way) and the next seed is tried;
  5. writes <arch>/ (config.json + model.safetensors in FP8) and <arch>/golden.safetensors with
     `input_ids` I64 [2, 24] and `logits` F32 [2, 24, vocab], and <arch>/golden.json (margins, seed, versions).
"""

import argparse
import json
import math
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

import transformers

MIN_MARGIN = 1e-4  # relative margin at any top-k boundary; 10x the runtime's near-tie threshold
SEQUENCES = 2
LENGTH = 24
SIZES = ["--layers", "3", "--hidden", "160", "--experts", "6", "--moe-intermediate", "96", "--vocab", "300", "--shards", "1"]


def edit_config(arch, config):
    if arch == "kimi-k2":
        config["n_group"] = 2
        config["topk_group"] = 1
    elif arch == "glm5":
        config["rope_parameters"] = {
            "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 8.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8,
        }
        config["indexer_types"] = ["full", "full", "shared"]
    return config


def dequantize(folder):
    """Exact float32 weights of an FP8 checkpoint folder (DeepSeek `_scale_inv` or compressed-tensors `_scale`)."""
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    out = {}
    for name, tensor in tensors.items():
        if name.endswith("_scale_inv") or name.endswith(".weight_scale"):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            scale = tensors.get(name + "_scale_inv")
            if scale is None:
                scale = tensors[name[: -len(".weight")] + ".weight_scale"]
            rows, columns = tensor.shape
            expanded = scale.float().repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :columns]
            out[name] = tensor.float() * expanded
        else:
            out[name] = tensor.float()
    return out


def float_folder(arch, source, target, config):
    weights = dequantize(source)
    layers = config["num_hidden_layers"]
    shared = [i for i, kind in enumerate(config.get("indexer_types") or []) if kind == "shared"]
    keep = {}
    for name, tensor in weights.items():
        parts = name.split(".")
        if name.startswith("model.layers.") and int(parts[2]) >= layers:
            continue  # MTP layer: carried by quantize, not run
        if name.startswith("model.layers.") and int(parts[2]) in shared and ".indexer." in name:
            continue
        keep[name] = tensor.contiguous()
    target.mkdir(parents=True)
    save_file(keep, str(target / "model.safetensors"), metadata={"format": "pt"})
    plain = dict(config)
    plain.pop("quantization_config", None)
    plain["torch_dtype"] = "float32"
    if plain.get("model_type") == "kimi_k2":
        plain["model_type"] = "deepseek_v3"
    (target / "config.json").write_text(json.dumps(plain, indent=2))


def margins_hooks(model, config, record):
    """Hooks that record the smallest relative margin at every router and DSA top-k boundary."""
    handles = []
    top_k = config["num_experts_per_tok"]

    def relative(inside, outside):
        return float(((inside - outside) / torch.maximum(inside.abs(), outside.abs()).clamp_min(1e-30)).min())

    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind.endswith("TopkRouter"):
            def router_hook(module, args, _output, name=name):
                x = args[0].reshape(-1, module.hidden_dim).float()
                scores = torch.sigmoid(x @ module.weight.float().T)
                choice = scores + module.e_score_correction_bias
                groups = module.num_group
                if groups > 1:
                    grouped = choice.view(-1, groups, module.num_experts // groups)
                    group_scores = grouped.topk(2, dim=-1)[0].sum(-1)
                    ordered = group_scores.sort(dim=-1, descending=True)[0]
                    record.append((name + " groups", relative(ordered[:, module.topk_group - 1], ordered[:, module.topk_group])))
                    picked = group_scores.topk(module.topk_group, dim=-1)[1]
                    mask = torch.zeros_like(group_scores).scatter_(1, picked, 1).bool()
                    choice = choice.masked_fill(~mask.repeat_interleave(module.num_experts // groups, 1), float("-inf"))
                ordered = choice.sort(dim=-1, descending=True)[0]
                inside, outside = ordered[:, top_k - 1], ordered[:, top_k]
                finite = torch.isfinite(outside)
                if finite.any():
                    record.append((name, relative(inside[finite], outside[finite])))
            handles.append(module.register_forward_hook(router_hook))
        if kind.endswith("Indexer"):
            def indexer_hook(module, args, kwargs, _output, name=name):
                hidden, q_resid, (cos, sin) = args[0], args[1], args[2]
                batch, length, _ = hidden.shape
                q = module.wq_b(q_resid).view(batch, length, module.n_heads, module.head_dim)
                rope = module.qk_rope_head_dim
                k = module.k_norm(module.wk(hidden)).unsqueeze(2)
                from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave
                q_rot, k_rot = apply_rotary_pos_emb_interleave(q[..., :rope], k[..., :rope], cos, sin, unsqueeze_dim=2)
                q = torch.cat([q_rot, q[..., rope:]], -1)
                k = torch.cat([k_rot, k[..., rope:]], -1).squeeze(2)
                scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * module.softmax_scale)
                weights = module.weights_proj(hidden).float() * module.n_heads ** -0.5
                index = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # [B, S, T]
                worst = math.inf
                for t in range(module.index_topk, length):
                    ordered = index[:, t, : t + 1].sort(dim=-1, descending=True)[0]
                    worst = min(worst, relative(ordered[:, module.index_topk - 1], ordered[:, module.index_topk]))
                record.append((name, worst))
            handles.append(module.register_forward_hook(indexer_hook, with_kwargs=True))
    return handles


def run_arch(arch, squeeze, out_root, first_seed):
    for seed in range(first_seed, first_seed + 20):
        with tempfile.TemporaryDirectory() as scratch:
            scratch = pathlib.Path(scratch)
            fp8 = scratch / "fp8"
            subprocess.run([squeeze, "synth", "--arch", arch, str(fp8), "--seed", str(seed), *SIZES], check=True, capture_output=True)
            config = edit_config(arch, json.loads((fp8 / "config.json").read_text()))
            (fp8 / "config.json").write_text(json.dumps(config, indent=2))
            float_folder(arch, fp8, scratch / "f32", config)
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                str(scratch / "f32"), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
            )
            missing = info.get("missing_keys") or []
            if missing:
                sys.exit(f"{arch}: transformers left weights random: {sorted(missing)[:8]}")
            model.eval()
            generator = torch.Generator().manual_seed(1000 + seed)
            input_ids = torch.randint(0, config["vocab_size"], (SEQUENCES, LENGTH), generator=generator)
            record = []
            handles = margins_hooks(model, config, record)
            with torch.no_grad():
                logits = model(input_ids=input_ids).logits.float()
            for handle in handles:
                handle.remove()
            smallest = min((margin for _, margin in record), default=math.inf)
            print(f"{arch} seed {seed}: smallest top-k margin {smallest:.3e} over {len(record)} decisions")
            if smallest < MIN_MARGIN:
                print(f"  near-tie: rejected ({[r for r in record if r[1] < MIN_MARGIN][:3]})")
                continue
            target = out_root / arch
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            shutil.copy(fp8 / "config.json", target / "config.json")
            for shard in fp8.glob("*.safetensors"):
                shutil.copy(shard, target / "model.safetensors")
            save_file({"input_ids": input_ids.to(torch.int64), "logits": logits.contiguous()}, str(target / "golden.safetensors"))
            meta = {
                "arch": arch, "seed": seed, "smallest_topk_margin": smallest, "min_margin": MIN_MARGIN,
                "torch": torch.__version__, "transformers": transformers.__version__,
                "attn_implementation": "eager", "logits_shape": list(logits.shape),
            }
            (target / "golden.json").write_text(json.dumps(meta, indent=2) + "\n")
            return
    sys.exit(f"{arch}: no seed without near-ties in 20 tries")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squeeze", default="target/debug/squeeze")
    parser.add_argument("--out", default="tests/golden/runtime")
    parser.add_argument("--arch", action="append", help="kimi-k2, glm5, glm45 (default: all)")
    args = parser.parse_args()
    torch.manual_seed(0)
    out_root = pathlib.Path(args.out)
    for arch in args.arch or ["kimi-k2", "glm5", "glm45"]:
        run_arch(arch, args.squeeze, out_root, first_seed=1)


if __name__ == "__main__":
    main()
