#!/usr/bin/env python3
"""Write tests/golden/runtime/deepseek-v4/: transformers 5.24's logits for a `squeeze synth --arch deepseek-v4`
checkpoint (issue 50: the target of the DeepSeek-V4 reference runtime), with ablations that show the golden catches a
runtime that drops the attention sinks, the compressors or the hash routing.

Usage (from the repository root, after scripts/oracle/setup-venv.sh):

    .venv-oracle/bin/python scripts/oracle/make-v4-golden.py [--squeeze target/release/squeeze]

The checkpoint is the synth's as written — FP8 E4M3 with E8M0 128×128 block scales, routed experts FP4 (E2M1 pairs
in int8) with E8M0 scales per 32, DeepSeek's own tensor names — and transformers reads it with its own dequantization
(`FineGrainedFP8Config(dequantize=True)`, `integrations/finegrained_fp8.py`: FP8 × 2^scale per block, FP4 nibbles ×
2^scale per 32) and its own renaming (`conversion_mapping.py` "deepseek_v4"), in float32, eager attention. Three
layers cycle the layer types: sliding-window only (the hash-routed layer), CSA (ratio 4, with its indexer) and HCA
(ratio 128); 160 tokens so that HCA compresses one block and CSA's indexer chooses among up to 40 entries (top 8).

Every FP8 dimension above 128 is a multiple of 128 (hidden 256): transformers' `Fp8Dequantize` takes the block size
from the scale grid (`rows // scale_rows`), which for a 160-wide weight with DeepSeek's two 128-blocks gives 80 and
scales columns 80..127 with the wrong block's factor; DeepSeek's format (and squeeze, and vLLM) block by 128 from the
first column. Real V4 checkpoints have no such dimension.

Input ids are redrawn until no top-k decision (router, indexer) is a near-tie (relative margin 1e-4, 10× the
runtime's threshold). Ablations (relative L2 of the logits; each must exceed 1e-3 or the script refuses): the sinks
at −1e9 (no sink), every `layer_types` entry `sliding_attention` (no compressor, no indexer), every
`mlp_layer_types` entry `moe` (layer 0 routed by its gate's scores instead of `tid2eid`). The synthetic indexer has 16
heads: with 4, an entry scores exactly 0 (every head's ReLU) one time in 16 and zero-score ties at the top-k
boundary appear in every draw.
"""

import argparse
import importlib.util
import math
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import AutoModelForCausalLM, FineGrainedFP8Config

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("runtime_golden", HERE / "make-runtime-golden.py")
runtime_golden = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runtime_golden)

SEQUENCES = 2
LENGTH = 160
MIN_MARGIN = 1e-4
SIZES = ["--layers", "3", "--hidden", "256", "--experts", "6", "--moe-intermediate", "96", "--vocab", "300", "--shards", "1"]


def load(folder, edit=None):
    """transformers' model on the synth folder, dequantized by transformers; `edit` changes the config first."""
    config = transformers.AutoConfig.from_pretrained(str(folder))
    if edit:
        edit(config)
    quantization = FineGrainedFP8Config(dequantize=True, weight_block_size=(128, 128))
    model, info = AutoModelForCausalLM.from_pretrained(
        str(folder), config=config, dtype=torch.float32, attn_implementation="eager",
        quantization_config=quantization, output_loading_info=True,
    )
    return model.eval(), info


def relative(inside, outside):
    return float(((inside - outside) / torch.maximum(inside.abs(), outside.abs()).clamp_min(1e-30)).min())


def margin_hooks(model, record):
    """The smallest relative margin at every learned router's and every CSA indexer's top-k boundary."""
    handles = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind == "DeepseekV4TopKRouter":
            def router(module, args, _output, name=name):
                flat = args[0].reshape(-1, module.hidden_dim)
                choice = module.score_fn(torch.nn.functional.linear(flat, module.weight)) + module.e_score_correction_bias
                ordered = choice.sort(dim=-1, descending=True)[0]
                record.append((name, relative(ordered[:, module.top_k - 1], ordered[:, module.top_k])))
            handles.append(module.register_forward_hook(router))
        if kind == "DeepseekV4Indexer":
            def indexer(scorer, _args, scores, name=name, parent=module):
                # scores [B, S, T]; query s sees the entries below (s + 1) // rate (one forward from position 0).
                rate, top_k = parent.compress_rate, parent.index_topk
                worst = math.inf
                for s in range(scores.shape[1]):
                    visible = (s + 1) // rate
                    if visible > top_k:
                        ordered = scores[:, s, :visible].sort(dim=-1, descending=True)[0]
                        worst = min(worst, relative(ordered[:, top_k - 1], ordered[:, top_k]))
                record.append((name, worst))
            handles.append(module.scorer.register_forward_hook(indexer))
    return handles


def logits_of(model, input_ids):
    with torch.no_grad():
        return model(input_ids=input_ids).logits.float()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squeeze", default="target/release/squeeze")
    parser.add_argument("--out", default="tests/golden/runtime/deepseek-v4")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = pathlib.Path(scratch) / "v4"
        for seed in range(20):
            if folder.exists():
                shutil.rmtree(folder)
            subprocess.run([args.squeeze, "synth", "--arch", "deepseek-v4", str(folder), "--seed", str(seed), *SIZES],
                           check=True, capture_output=True)
            model, info = load(folder)
            if info["missing_keys"] or info["mismatched_keys"]:
                sys.exit(f"transformers left weights random: {sorted(info['missing_keys'])[:8]} {info['mismatched_keys']}")
            vocab = model.config.vocab_size
            input_ids = torch.randint(0, vocab, (SEQUENCES, LENGTH), generator=torch.Generator().manual_seed(3000 + seed))
            record = []
            handles = margin_hooks(model, record)
            logits = logits_of(model, input_ids)
            for handle in handles:
                handle.remove()
            smallest = min((margin for _, margin in record), default=math.inf)
            shown = [(n, round(m, 6)) for n, m in record]
            print(f"deepseek-v4 seed {seed}: smallest top-k margin {smallest:.3e} over {len(record)} decisions: {shown}")
            if smallest >= MIN_MARGIN and torch.isfinite(logits).all():
                break
        else:
            sys.exit("no seed without near-ties in 20")

        def moved(edit, what):
            other, _ = load(folder, edit)
            if what == "sinks":
                for module in other.modules():
                    if hasattr(module, "sinks"):
                        module.sinks.data.fill_(-1e9)
            change = float((logits_of(other, input_ids) - logits).norm() / logits.norm())
            print(f"  without {what}: relative L2 {change:.3e}")
            if change < 1e-3:
                sys.exit(f"dropping {what} changed nothing; the golden could not catch it")
            return change

        ablations = {
            "relative_l2_without_sinks": moved(None, "sinks"),
            "relative_l2_without_compressors": moved(
                lambda c: setattr(c, "layer_types", ["sliding_attention"] * len(c.layer_types)), "compressors"
            ),
            "relative_l2_without_hash_routing": moved(
                lambda c: setattr(c, "mlp_layer_types", ["moe"] * len(c.mlp_layer_types)), "hash routing"
            ),
        }
        goldens = {"input_ids": input_ids.to(torch.int64), "logits": logits.contiguous()}
        meta = {
            "arch": "deepseek-v4", "seed": seed, "smallest_topk_margin": smallest, "min_margin": MIN_MARGIN,
            "torch": torch.__version__, "transformers": transformers.__version__, "attn_implementation": "eager",
            "dequantization": "transformers FineGrainedFP8Config(dequantize=True)", "logits_shape": list(logits.shape),
            **ablations,
        }
        runtime_golden.write_golden(pathlib.Path(args.out), folder, goldens, meta)
        print(f"wrote {args.out}: logits {list(logits.shape)}, seed {seed}")


if __name__ == "__main__":
    main()
