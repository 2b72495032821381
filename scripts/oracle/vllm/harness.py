#!/usr/bin/env python3
"""vLLM-CPU as an oracle for squeeze's INT4 outputs: load a folder through vLLM's own loader, score
held-out token ids, greedy-decode prompts, read back the KV scales vLLM loaded.

    harness.py run MODEL --tokens IDS.safetensors --prompts PROMPTS.json --out RESULT.json [--max-new-tokens 32]
    harness.py load MODEL --out RESULT.json          # load only; records success or the error and where

IDS.safetensors: integer `input_ids` [n, ctx] (what `squeeze eval --tokens` reads, no BOS).
PROMPTS.json: [{"prompt": TEXT, "prompt_token_ids": [...]}, ...] — the ids squeeze's tokenizer gave
(`squeeze serve-test --json` reports them), fed to vLLM as token ids so both sides see the same input.
vLLM runs with skip_tokenizer_init, dtype float32, enforce_eager, moe_backend="emulation" and the
in-process patches of cpu_patches.py (see README.md). Set VLLM_MLA_DISABLE=1 for tiny MLA latents.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: patches apply
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the models are tiny
os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_patches  # noqa: E402


def versions() -> dict:
    from importlib.metadata import version

    import torch

    out = {name: version(name) for name in ("vllm-cpu", "torch", "transformers", "compressed-tensors")}
    out["python"] = platform.python_version()
    out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def config_of(model: Path) -> dict:
    return json.loads((model / "config.json").read_text())


def eos_ids(model: Path) -> list[int]:
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = model / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is not None:
                ids.extend(value if isinstance(value, list) else [value])
    return sorted(set(ids))


def make_llm(
    model: Path,
    max_model_len: int,
    f32_dequant: bool = False,
    moe_backend: str = "emulation",
    kv_cache_dtype: str = "auto",
    sparse_as_dense: bool = False,
):
    cpu_patches.apply(f32_dequant=f32_dequant, sparse_as_dense=sparse_as_dense)
    from vllm import LLM

    # A vision-language wrapper (Kimi K2.6) is served text-only, as squeeze runs it: with every modality limited
    # to 0 vLLM builds no vision tower or projector and skips their weights (`_mark_tower_model`).
    text_only = "vision_config" in json.loads((model / "config.json").read_text())
    extra = {"limit_mm_per_prompt": {"image": 0, "video": 0}} if text_only else {}
    return LLM(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        max_num_batched_tokens=max(max_model_len, 256),
        max_num_seqs=16,
        enable_prefix_caching=False,
        moe_backend=moe_backend,
        kv_cache_dtype=kv_cache_dtype,
        seed=0,
        **extra,
    )


def kv_scale_readback(llm) -> dict:
    """Per attention layer: the *_scale values as loaded (cpu_patches.RECORDED_KV_SCALES; −1 = vLLM's
    'absent' sentinel) and the `_k_scale`/`_v_scale` the layer uses after processing."""

    def walk(model):
        layers = {}
        for name, module in model.named_modules():
            if hasattr(module, "_k_scale"):
                layers[name] = {
                    "class": type(module).__name__,
                    "_k_scale": float(module._k_scale.reshape(-1)[0]),
                    "_v_scale": float(module._v_scale.reshape(-1)[0]),
                    "params_left": sorted(a for a in ("k_scale", "v_scale", "q_scale") if hasattr(module, a)),
                }
        return layers

    after = llm.apply_model(walk)[0]
    return {"loaded": dict(sorted(cpu_patches.RECORDED_KV_SCALES.items())), "after_processing": after}


def where(error: BaseException) -> list[str]:
    """The last frames of the traceback inside vllm/transformers/compressed_tensors, innermost last."""
    frames = [
        f"{Path(f.filename).as_posix().split('site-packages/')[-1]}:{f.lineno} {f.name}"
        for f in traceback.extract_tb(error.__traceback__)
        if "site-packages" in f.filename
    ]
    return frames[-4:]


def run(args) -> dict:
    from safetensors.numpy import load_file
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    model = Path(args.model)
    ids = load_file(args.tokens)["input_ids"].astype("int64")
    prompts = json.loads(Path(args.prompts).read_text())
    ctx = ids.shape[1]
    longest = max(len(p["prompt_token_ids"]) for p in prompts) + args.max_new_tokens
    started = time.time()
    llm = make_llm(model, max(ctx + 1, longest), args.f32_dequant, args.moe_backend)
    load_seconds = time.time() - started
    kv = kv_scale_readback(llm)

    started = time.time()
    scoring = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=row.tolist()) for row in ids], scoring, use_tqdm=False)
    chunk_nll, count = [], 0
    for row, output in zip(ids, outputs):
        total = 0.0
        for position, logprobs in enumerate(output.prompt_logprobs):
            if position == 0:
                continue  # the first token has no prediction
            total -= logprobs[int(row[position])].logprob
            count += 1
        chunk_nll.append(total)
    mean_nll = sum(chunk_nll) / count
    score_seconds = time.time() - started

    started = time.time()
    stops = eos_ids(model)
    greedy = SamplingParams(
        max_tokens=args.max_new_tokens, temperature=0.0, stop_token_ids=stops, detokenize=False
    )
    generated = llm.generate(
        [TokensPrompt(prompt_token_ids=p["prompt_token_ids"]) for p in prompts], greedy, use_tqdm=False
    )
    decode_seconds = time.time() - started
    return {
        "model_config": {k: config_of(model).get(k) for k in ("architectures", "model_type")},
        "versions": versions(),
        "vllm_settings": {
            "dtype": "float32",
            "enforce_eager": True,
            "skip_tokenizer_init": True,
            "moe_backend": args.moe_backend,
            "expert_dequant": "float32 (patched)" if args.f32_dequant else "bfloat16 (vLLM's emulation)",
            "VLLM_MLA_DISABLE": os.environ.get("VLLM_MLA_DISABLE", "0"),
            "prompt_logprobs": "logprob of each actual next token, positions 1..ctx-1 of each chunk",
        },
        "eval": {
            "chunks": int(ids.shape[0]),
            "ctx": int(ctx),
            "tokens": count,
            "mean_nll": mean_nll,
            "ppl": math.exp(mean_nll),
            "chunk_nll_sums": chunk_nll,
        },
        "greedy": {
            "max_new_tokens": args.max_new_tokens,
            "stop_token_ids": stops,
            "requests": [
                {
                    "prompt": p["prompt"],
                    "prompt_token_ids": p["prompt_token_ids"],
                    "token_ids": list(out.outputs[0].token_ids),
                    "finish_reason": out.outputs[0].finish_reason,
                }
                for p, out in zip(prompts, generated)
            ],
        },
        "kv_scales": kv,
        "seconds": {"load": load_seconds, "score": score_seconds, "decode": decode_seconds},
    }


def load(args) -> dict:
    model = Path(args.model)
    started = time.time()
    result: dict = {"model_config": {k: config_of(model).get(k) for k in ("architectures", "model_type")}}
    result["versions"] = versions()
    result["VLLM_MLA_DISABLE"] = os.environ.get("VLLM_MLA_DISABLE", "0")
    result["kv_cache_dtype"] = args.kv_cache_dtype
    result["sparse_as_dense"] = args.sparse_as_dense
    try:
        llm = make_llm(model, 256, kv_cache_dtype=args.kv_cache_dtype, sparse_as_dense=args.sparse_as_dense)
    except Exception as error:  # noqa: BLE001 — the failure is the result
        result["loaded"] = False
        result["error"] = f"{type(error).__name__}: {' '.join(str(error).split())}"[:600]
        result["where"] = where(error)
        result["kv_scales_recorded_before_failure"] = dict(sorted(cpu_patches.RECORDED_KV_SCALES.items()))
    else:
        result["loaded"] = True
        result["kv_scales"] = kv_scale_readback(llm)
    result["seconds"] = time.time() - started
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("model")
    p_run.add_argument("--tokens", required=True)
    p_run.add_argument("--prompts", required=True)
    p_run.add_argument("--max-new-tokens", type=int, default=32)
    p_run.add_argument("--out", required=True)
    p_run.add_argument("--moe-backend", default="emulation", help="'auto' for a model without INT4 experts")
    p_run.add_argument("--f32-dequant", action="store_true", help="dequantize experts to float32 (cpu_patches 3)")
    p_load = sub.add_parser("load")
    p_load.add_argument("model")
    p_load.add_argument("--out", required=True)
    p_load.add_argument(
        "--kv-cache-dtype", default="auto", help="e.g. bfloat16: an explicit choice overrides the checkpoint's FP8 scheme"
    )
    p_load.add_argument("--sparse-as-dense", action="store_true", help="build DSA models with dense CPU MLA (cpu_patches 5)")
    args = parser.parse_args()
    result = run(args) if args.command == "run" else load(args)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in result if k in ("eval", "loaded", "error", "where")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
