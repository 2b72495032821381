#!/usr/bin/env python3
"""The Python steps of scripts/bench-vs-llamacpp.sh: squeeze's FP8 models and token ids into llama.cpp's formats.

    llamacpp_bench.py convert LLAMA_SRC FP8_DIR OUT.gguf     FP8 checkpoint -> F32 GGUF (llama.cpp's converter)
    llamacpp_bench.py tokens OUT.safetensors CHUNKS CTX TEXT  the first CHUNKS x CTX bytes of TEXT as token ids,
                                                             `input_ids` [CHUNKS, CTX] I64 (squeeze's byte-level
                                                             tokenizers: id = byte value)
    llamacpp_bench.py kld-base TOKENS LOGITS OUT.kld         token ids + squeeze's logits -> a llama-perplexity
                                                             `--kl-divergence-base` file
    llamacpp_bench.py indexer-head FP8_DIR HEAD_DIM          re-draw a GLM-5 folder's DSA indexer at HEAD_DIM (in place)
    llamacpp_bench.py llama-args FP8_DIR                     extra llama-perplexity arguments the GGUF cannot carry
    llamacpp_bench.py llama-rate LOG TOKENS                  tokens/s of the one pass a llama-perplexity
                                                             `--kl-divergence` log shows

convert: runs llama.cpp's own `convert_hf_to_gguf.py` code (imported from LLAMA_SRC, `--outtype f32`) on the FP8
folder as it is: the converter dequantizes `weight_scale_inv` (DeepSeek fp8) and compressed-tensors `weight_scale`
blocks itself (fp8.float() x block scale, as squeeze's loader does). One change: the vocabulary. squeeze synth's
byte-level tokenizers have no pre-tokenizer hash the converter knows, and GLM's vocab code wants GLM's special
tokens, so every model class's `set_vocab` is replaced by a tokenizer-less vocabulary (`tokenizer.ggml.model =
"none"` plus `vocab_size`, which llama.cpp loads as that many dummy tokens, no BOS). Nothing here tokenizes text:
both runtimes get token ids. MTP/NextN layers are dropped where the converter supports it (`no_mtp`), as squeeze's
eval never runs them.

kld-base: llama-perplexity reads the token ids to evaluate from a `--kl-divergence-base` file (the one way it
takes ids instead of text), together with the base model's log-probabilities of the second half of each window.
Writing that file from squeeze's `eval --save-logits` makes llama.cpp evaluate exactly squeeze's tokens and report
how far its logits are from squeeze's (KL divergence, same top token, PPL(Q) vs PPL(base)). The layout follows
`kl_divergence()` / `log_softmax()` in tools/perplexity/perplexity.cpp: "_logits_", n_ctx u32, n_vocab i32,
n_chunk i32, the ids as i32, then per chunk n_ctx - 1 - n_ctx/2 rows of nv = 2*((n_vocab+1)/2) + 4 uint16: two
f32 (scale, min_log_prob), then each logit quantized to 16 bits over [max - 16, max].

indexer-head: llama.cpp's GLM-5 graph (src/models/glm-dsa.cpp) multiplies the indexer's q and k by a Hadamard
rotation whose side is the largest power of two >= 64 dividing the head size (llama_kv_cache::build_input_k_rot),
so it needs index_head_dim to be a power of two >= 64 (GLM-5 ships 128). squeeze synth's glm5 draws 32, and
llama-perplexity aborts while reserving its graph: `ggml.c:3354: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed` in
llama_model_glm_dsa::build_arch_graph. This re-draws, in every layer, `indexer.wq_b` and `indexer.wk` (FP8 e4m3
with 128x128 `weight_scale_inv` blocks, N(0, 0.02) before quantization) and `indexer.k_norm` weight (1) and bias (0)
at HEAD_DIM and sets `index_head_dim`; everything else is squeeze synth's. The rotation itself is orthonormal and
applied to both q and k, so it leaves the f32 indexer scores unchanged (up to rounding).

llama-args: this llama.cpp reads YaRN's beta_fast / beta_slow from a GGUF for Grok only; every other architecture
runs with its defaults, 32 and 1, whatever the converter wrote (`deepseek2.rope.scaling.yarn_beta_fast`). Kimi K2
(and squeeze synth's kimi-k2, which copies its rope_scaling) has beta_fast = beta_slow = 1, so llama.cpp computed a
different model: on the synthetic tiny Kimi, mean KLD 0.045 against squeeze and the same top token 21 % of the
time, while squeeze matched transformers 4.57.6 to 1e-8 nats (scripts/oracle/eval-ppl.py). Passing the config's
values as `--yarn-beta-fast` / `--yarn-beta-slow` brings it to KLD 0.0002, 99 % the same top token.

llama-rate: this llama.cpp's own counter (`llama_perf_context_print`'s "prompt eval time") is wrong on this path
(it stops at a synchronisation inside the decode call and printed 1.26 ms for a 86 ms pass), so the rate is taken
from what `kl_divergence()` times itself: the first pass (clear the KV cache, decode every window of the batch,
synchronise), logged as "%.2f seconds per pass". Two decimals are too coarse for the tiny models, so the time is the
difference of the log's microsecond timestamps on that line and on the "computing over" line just before the pass.
The script sets the batch to chunks x ctx so that this one pass is the whole evaluation (checked: n_seq = chunks).
"""

import json
import pathlib
import struct
import sys

import numpy as np


def convert(llama_src: str, fp8_dir: str, out: str) -> None:
    source = pathlib.Path(llama_src)
    sys.path.insert(0, str(source))
    sys.path.insert(1, str(source / "gguf-py"))
    import convert_hf_to_gguf
    import gguf

    config = json.loads((pathlib.Path(fp8_dir) / "config.json").read_text())
    vocab_size = int(config["vocab_size"])

    def tokenizer_less_vocab(self):
        self.gguf_writer.add_tokenizer_model("none")
        self.gguf_writer.add_vocab_size(vocab_size)

    lookup = convert_hf_to_gguf.get_model_class

    def get_model_class(name, mmproj=False):
        model_class = lookup(name, mmproj=mmproj)
        model_class.set_vocab = tokenizer_less_vocab
        if getattr(model_class, "supports_mtp_export", False):
            model_class.no_mtp = True
        return model_class

    convert_hf_to_gguf.get_model_class = get_model_class
    sys.argv = ["convert_hf_to_gguf.py", fp8_dir, "--outtype", "f32", "--outfile", out]
    convert_hf_to_gguf.main()
    del gguf


def tokens(out: str, chunks: int, ctx: int, text: str) -> None:
    from safetensors.numpy import save_file

    data = np.frombuffer(pathlib.Path(text).read_bytes(), dtype=np.uint8)
    if data.size < chunks * ctx:
        sys.exit(f"{text} has {data.size} bytes, fewer than {chunks} x {ctx}")
    save_file({"input_ids": data[: chunks * ctx].astype(np.int64).reshape(chunks, ctx)}, out)


def kld_base(tokens_path: str, logits_path: str, out: str) -> None:
    from safetensors.numpy import load_file

    ids = load_file(tokens_path)["input_ids"].astype(np.int32)
    logits = load_file(logits_path)["logits"].astype(np.float32)
    chunks, ctx = ids.shape
    if logits.shape[:2] != (chunks, ctx):
        sys.exit(f"{logits_path}: logits {logits.shape} do not match the token ids {ids.shape}")
    vocab = logits.shape[2]
    first = ctx // 2
    rows = ctx - 1 - first
    width = 2 * ((vocab + 1) // 2) + 4
    with open(out, "wb") as file:
        file.write(b"_logits_")
        file.write(struct.pack("<Iii", ctx, vocab, chunks))
        file.write(ids.tobytes())
        for chunk in range(chunks):
            row = logits[chunk, first : first + rows]
            max_logit = row.max(axis=1, keepdims=True)
            min_logit = np.maximum(row.min(axis=1, keepdims=True), max_logit - 16)
            log_sum_exp = np.log(np.exp((row - max_logit).astype(np.float64)).sum(axis=1, keepdims=True))
            min_log_prob = (min_logit - max_logit - log_sum_exp).astype(np.float32)
            scale = ((max_logit - min_logit) / np.float32(65535)).astype(np.float32)
            packed = np.zeros((rows, width), dtype=np.uint16)
            header = np.concatenate([scale, min_log_prob], axis=1).astype(np.float32)
            packed[:, :4] = header.view(np.uint16)
            safe = np.where(scale > 0, scale, 1)
            codes = np.where(row > min_logit, np.rint((row - min_logit) / safe), 0)
            packed[:, 4 : 4 + vocab] = np.where(scale > 0, codes, 0).astype(np.uint16)
            file.write(packed.tobytes())


def indexer_head(fp8_dir: str, head_dim: int) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    folder = pathlib.Path(fp8_dir)
    config = json.loads((folder / "config.json").read_text())
    heads = int(config["index_n_heads"])
    generator = torch.Generator().manual_seed(0)

    def fp8_blocks(rows: int, columns: int) -> tuple:
        weight = torch.randn(rows, columns, generator=generator) * 0.02
        blocks = torch.zeros((rows + 127) // 128, (columns + 127) // 128)
        codes = torch.empty(rows, columns, dtype=torch.float8_e4m3fn)
        for i in range(blocks.shape[0]):
            for j in range(blocks.shape[1]):
                block = weight[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
                scale = block.abs().max().clamp(min=1e-12) / 448.0
                blocks[i, j] = scale
                codes[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] = (block / scale).to(torch.float8_e4m3fn)
        return codes, blocks

    for shard in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(shard))
        changed = False
        for name in list(tensors):
            if not name.endswith(".indexer.wk.weight"):
                continue
            prefix = name[: -len("wk.weight")]
            hidden = tensors[name].shape[1]
            q_rank = tensors[prefix + "wq_b.weight"].shape[1]
            tensors[prefix + "wk.weight"], tensors[prefix + "wk.weight_scale_inv"] = fp8_blocks(head_dim, hidden)
            tensors[prefix + "wq_b.weight"], tensors[prefix + "wq_b.weight_scale_inv"] = fp8_blocks(
                heads * head_dim, q_rank
            )
            tensors[prefix + "k_norm.weight"] = torch.ones(head_dim, dtype=torch.bfloat16)
            tensors[prefix + "k_norm.bias"] = torch.zeros(head_dim, dtype=torch.bfloat16)
            changed = True
        if changed:
            save_file(tensors, str(shard), metadata={"format": "pt"})
    config["index_head_dim"] = head_dim
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def llama_args(fp8_dir: str) -> None:
    config = json.loads((pathlib.Path(fp8_dir) / "config.json").read_text())
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    arguments = []
    if rope.get("type", rope.get("rope_type")) == "yarn":
        for key in ("beta_fast", "beta_slow"):
            if key in rope:
                arguments += [f"--yarn-{key.replace('_', '-')}", str(rope[key])]
    print(" ".join(arguments))


def llama_rate(log: str, tokens: int) -> None:
    import re

    stamp = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) \w (.*)$")
    start = end = None
    for line in pathlib.Path(log).read_text(errors="replace").splitlines():
        match = stamp.match(line)
        if not match:
            continue
        minutes, seconds, millis, micros = (int(group) for group in match.groups()[:4])
        at = minutes * 60 + seconds + millis / 1e3 + micros / 1e6
        message = match.group(5)
        if message.startswith("kl_divergence: computing over"):
            pass_shape = re.search(r"over (\d+) chunks.*n_seq=(\d+)", message)
            if not pass_shape or pass_shape.group(1) != pass_shape.group(2):
                sys.exit(f"{log}: the evaluation is not one pass ({message!r}); set -b to chunks x ctx")
            start = at
        elif message.startswith("kl_divergence:") and "seconds per pass" in message and start is not None:
            end = at
            break
    if start is None or end is None or end <= start:
        sys.exit(f"{log}: no timed kl_divergence pass found")
    print(tokens / (end - start))


def main() -> None:
    command, *args = sys.argv[1:] or ["help"]
    if command == "convert" and len(args) == 3:
        convert(*args)
    elif command == "tokens" and len(args) == 4:
        tokens(args[0], int(args[1]), int(args[2]), args[3])
    elif command == "kld-base" and len(args) == 3:
        kld_base(*args)
    elif command == "indexer-head" and len(args) == 2:
        indexer_head(args[0], int(args[1]))
    elif command == "llama-args" and len(args) == 1:
        llama_args(*args)
    elif command == "llama-rate" and len(args) == 2:
        llama_rate(args[0], int(args[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
