"""llm-compressor 0.14's GPTQModifier on a squeeze-layout FP8 checkpoint (a `squeeze synth` model or a trained tiny
one), for scripts/bench-gptq-vs-llmcompressor.sh and scripts/bench-vs-peers.sh.

Dequantizes the FP8 checkpoint (128 × 128 block `weight_scale_inv`) to a BF16 transformers folder (not timed), then
times, in this process: loading it, `oneshot` with W4A16 group-32 symmetric GPTQ on the routed experts only (damping
1 %, blocks of 128, no act-order, minmax observer: squeeze's `--method gptq` settings), on the given `input_ids`,
and saving the compressed model. llm-compressor's MoE default shows every calibration token to every expert
(`moe_calibrate_all_experts=True`); --routed turns that off (each expert sees the tokens the router sends it, as
squeeze's `--method gptq` without `--force-route-all`). Writes SCRATCH_FOLDER/out (or --out DIR) with the source's
tokenizer files beside it. Prints one line `llmcompressor_seconds <wall>`; the caller measures user CPU and peak RSS
of the whole process.

    python scripts/llmcompressor_gptq.py FP8_FOLDER IDS.safetensors SCRATCH_FOLDER [--prepare] [--routed] [--out DIR]

--prepare writes the BF16 folder and exits (so that the timed runs only read it).
"""

import json
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def bf16_folder(source: Path, target: Path) -> None:
    tensors = {}
    for path in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    out = {}
    # The FP8 block scale: `weight_scale_inv` (DeepSeek layout) or `weight_scale` (compressed-tensors
    # float-quantized block layout, the trained tiny GLM-4.5); both multiply.
    block_scales = set()
    for name, tensor in tensors.items():
        if tensor.dtype == torch.float8_e4m3fn:
            block_scales.add(name + "_scale_inv" if name + "_scale_inv" in tensors else name + "_scale")
    for name, tensor in tensors.items():
        if name in block_scales:
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            scale = tensors[name + "_scale_inv" if name + "_scale_inv" in tensors else name + "_scale"].float()
            rows, columns = tensor.shape
            expanded = scale.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :columns]
            tensor = tensor.float() * expanded
        out[name] = tensor.to(torch.bfloat16).contiguous()
    config = json.loads((source / "config.json").read_text())
    layers = config["num_hidden_layers"]
    # The MTP layer (if any) is not part of the transformers model.
    out = {n: t for n, t in out.items() if not (n.startswith("model.layers.") and int(n.split(".")[2]) >= layers)}
    target.mkdir(parents=True, exist_ok=True)
    save_file(out, str(target / "model.safetensors"), metadata={"format": "pt"})
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"
    if config.get("model_type") == "kimi_k2":
        config["model_type"] = "deepseek_v3"
    (target / "config.json").write_text(json.dumps(config, indent=2))


def main() -> None:
    source, ids_path, scratch = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    flags = sys.argv[4:]
    out = Path(flags[flags.index("--out") + 1]) if "--out" in flags else scratch / "out"
    bf16 = scratch / "bf16"
    if not (bf16 / "config.json").exists():
        bf16_folder(source, bf16)
    if "--prepare" in flags:
        return
    ids = load_file(str(ids_path))["input_ids"].long()

    started = time.time()
    import transformers
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier

    model = transformers.AutoModelForCausalLM.from_pretrained(str(bf16), dtype=torch.bfloat16)
    dataset = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})
    recipe = GPTQModifier(
        config_groups={
            "routed_experts": {
                "targets": [r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"],
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": 32,
                    "observer": "minmax",
                },
            }
        },
        ignore=["lm_head"],
        dampening_frac=0.01,
        block_size=128,
        actorder=None,
    )
    # The ids are given; oneshot still wants a processor: the synth's tokenizer.json.
    processor = transformers.PreTrainedTokenizerFast(tokenizer_file=str(source / "tokenizer.json"))
    oneshot(
        model=model,
        processor=processor,
        dataset=dataset,
        recipe=recipe,
        num_calibration_samples=ids.shape[0],
        max_seq_length=ids.shape[1],
        shuffle_calibration_samples=False,
        moe_calibrate_all_experts="--routed" not in flags,
    )
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(str(out), save_compressed=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "tiktoken.model", "generation_config.json"):
        if (source / name).exists() and not (out / name).exists():
            shutil.copy(source / name, out / name)
    quantized = sum(1 for n, _ in model.named_modules() if n.endswith(("gate_proj", "up_proj", "down_proj")) and ".experts." in n)
    print(f"llmcompressor_seconds {time.time() - started:.1f} expert_linears {quantized}", flush=True)


if __name__ == "__main__":
    main()
