#!/usr/bin/env python3
"""Perplexity of an FP8 checkpoint folder under transformers, scored as `squeeze eval MODEL --data FILE --ctx N` does.

Usage (repository root, after scripts/oracle/setup-venv.sh):

    .venv-oracle/bin/python scripts/oracle/eval-ppl.py MODEL_DIR --data FILE [--ctx 256] [--chunks N]
        [--squeeze-json EVAL.json] [--threads 2] [--dsa-ties lower]

MODEL_DIR is a squeeze source (DeepSeek `weight_scale_inv` or compressed-tensors `weight_scale` FP8 blocks of
128x128, partial edge blocks allowed) with the byte-level tokenizer of `squeeze synth` (id = byte value; checked
against tokenizer.json). The weights are dequantized exactly in float32 (fp8 x block scale), MTP layers dropped,
kimi_k2 loaded as deepseek_v3, and transformers runs the float32 forward with eager attention. FILE is cut into
non-overlapping ctx-byte chunks (a shorter tail dropped), at most --chunks of them; every position after the first
of each chunk is scored (ctx - 1 per chunk), as squeeze's single-model eval scores them.

GLM-5's DSA indexer picks its top-k keys with torch.topk, which leaves the order of exactly equal scores unspecified;
a ReLU indexer scores many keys exactly 0, so a boundary can fall inside such a tie. --dsa-ties lower breaks those
ties toward the lower key index, as squeeze's runtime does (a stable sort instead of topk; nothing else changes).

Prints one JSON object: tokens, mean_nll, ppl. With --squeeze-json (the output of `squeeze eval ... --json`) it
also prints squeeze's mean NLL and the difference, and exits 1 if the two differ by more than TOLERANCE.
"""

import argparse
import json
import math
import pathlib
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

import transformers

# squeeze runs f32 with its own summation order; two f32 forwards of a 3-layer model agree to ~1e-6 in mean NLL.
# A routing near-tie broken the other way moves a few tokens; 1e-4 nats/token is far below any real mismatch.
TOLERANCE = 1e-4


def dequantize(folder: pathlib.Path):
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


def load_model(folder: pathlib.Path, scratch: pathlib.Path):
    config = json.loads((folder / "config.json").read_text())
    layers = config["num_hidden_layers"]
    weights = {
        name: tensor.contiguous()
        for name, tensor in dequantize(folder).items()
        if not (name.startswith("model.layers.") and int(name.split(".")[2]) >= layers)
    }
    save_file(weights, str(scratch / "model.safetensors"), metadata={"format": "pt"})
    plain = dict(config)
    plain.pop("quantization_config", None)
    plain["torch_dtype"] = "float32"
    if plain.get("model_type") == "kimi_k2":
        plain["model_type"] = "deepseek_v3"
    (scratch / "config.json").write_text(json.dumps(plain, indent=2))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(scratch), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    if info.get("missing_keys"):
        sys.exit(f"transformers left weights random: {sorted(info['missing_keys'])[:8]}")
    model.eval()
    return model


def break_dsa_ties_toward_lower_keys():
    """Make GLM-5's indexer choose among exactly equal scores the lower key index (squeeze's rule): its torch.topk
    is replaced, for the indexer's forward only, by a stable descending sort cut at k."""
    from collections import namedtuple

    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as dsa

    TopK = namedtuple("TopK", "values indices")
    original = dsa.GlmMoeDsaIndexer.forward

    def stable_topk(tensor, k, dim=-1, largest=True, sorted=True):
        values, indices = tensor.sort(dim=dim, descending=largest, stable=True)
        return TopK(values.narrow(dim, 0, k), indices.narrow(dim, 0, k))

    def forward(self, *args, **kwargs):
        topk = torch.Tensor.topk
        torch.Tensor.topk = stable_topk
        try:
            return original(self, *args, **kwargs)
        finally:
            torch.Tensor.topk = topk

    dsa.GlmMoeDsaIndexer.forward = forward


def check_byte_tokenizer(folder: pathlib.Path):
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    model = tokenizer["model"]
    if model.get("merges") or len(model["vocab"]) != 256:
        sys.exit(f"{folder}/tokenizer.json is not the byte-level tokenizer of squeeze synth (merges or extra tokens)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=pathlib.Path)
    parser.add_argument("--data", type=pathlib.Path, required=True)
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--chunks", type=int)
    parser.add_argument("--squeeze-json", type=pathlib.Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dsa-ties", choices=["topk", "lower"], default="topk",
                        help="GLM-5 DSA: exact ties as torch.topk orders them (default) or toward the lower key index")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.dsa_ties == "lower":
        break_dsa_ties_toward_lower_keys()
    check_byte_tokenizer(args.model)
    data = args.data.read_bytes()
    count = len(data) // args.ctx
    if args.chunks is not None:
        count = min(count, args.chunks)
    ids = torch.tensor(list(data[: count * args.ctx]), dtype=torch.long).view(count, args.ctx)
    total, tokens = 0.0, 0
    with tempfile.TemporaryDirectory() as scratch:
        model = load_model(args.model, pathlib.Path(scratch))
        with torch.no_grad():
            for start in range(0, count, 16):
                batch = ids[start:start + 16]
                logits = model(input_ids=batch).logits.double()
                nll = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
                total += float(nll)
                tokens += batch.shape[0] * (args.ctx - 1)
    mean = total / tokens
    result = {"model": str(args.model), "data": str(args.data), "ctx": args.ctx, "chunks": count,
              "dsa_ties": args.dsa_ties,
              "tokens": tokens, "mean_nll": mean, "ppl": math.exp(mean),
              "torch": torch.__version__, "transformers": transformers.__version__}
    status = 0
    if args.squeeze_json:
        theirs = json.loads(args.squeeze_json.read_text())
        result["squeeze_mean_nll"] = theirs["mean_nll"]
        result["squeeze_tokens"] = theirs["tokens"]
        result["difference"] = theirs["mean_nll"] - mean
        if theirs["tokens"] != tokens or abs(result["difference"]) > TOLERANCE:
            status = 1
    print(json.dumps(result, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
