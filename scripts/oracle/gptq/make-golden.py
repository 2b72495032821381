#!/usr/bin/env python3
"""Write tests/golden/gptq/*.safetensors: llm-compressor's GPTQ on small seeded matrices.

Usage (from the repository root, after scripts/oracle/gptq/setup.sh):

    scripts/oracle/gptq/.venv/bin/python scripts/oracle/gptq/make-golden.py [--out tests/golden/gptq]

Each case is a `torch.nn.Linear` (no bias) run through llm-compressor 0.14.0.1's GPTQ the
way `GPTQModifier.compress_module_list` runs it, calling the same functions in the same order:

    compressed_tensors ... initialize_module_for_quantization(module, scheme)
    llmcompressor.modifiers.quantization.calibration.initialize_observer(module, "weight")
    llmcompressor.modifiers.gptq.helpers.make_empty_hessian / accumulate_hessian  (one call per batch of X)
    llmcompressor.modifiers.quantization.calibration.observe(module, "weight")   (memoryless_minmax)
    module.weight_observer.get_qparams()          -> BF16 scales from the *original* weights
    llmcompressor.modifiers.gptq.helpers.prepare_batch(...)                      (H / num_samples)
    llmcompressor.modifiers.gptq.gptq_quantize.quantize_weight(..., blocksize=128, percdamp=0.01)

Scheme: symmetric INT4, strategy "group", actorder None (the modifier's default would resolve it to
"static"; squeeze has no act-order), observer memoryless_minmax (what "minmax" becomes for
weights). Each case runs twice on the same weights (BF16 values) and inputs:
  bf16.*  a BF16 module: the observer's scale is BF16, bf16(absmax / 7.5), and fake_quantize
          dequantizes in BF16, so GPTQ feeds back w - bf16(code x scale)
  f32.*   an F32 module with QuantizationArgs.scale_dtype = bfloat16: the same scale values held
          in F32, so the feedback uses the exact code x scale (squeeze's contract)
quantize_weight itself works in F32 (GPTQ_PRECISION) either way. A third, printed-only run of the
F32 module with GPTQ_PRECISION = float64 shows how many codes f32 rounding moves (none here).

Tensors per case (file `{name}.safetensors`):
    weight            F32  [out, in]   the Linear's weight (every value exact in BF16)
    inputs            BF16 [n, in]     calibration inputs X (BF16 as a BF16 model's activations are;
                                       also keeps the files small); fed as `batches` equal batches
    bf16.codes        I8   [out, in]   round(output / scale), llm-compressor's integer codes
    bf16.scales       BF16 [out, in/group]  the observer's scales, which quantize_weight uses unchanged
    bf16.dequantized  BF16 [out, in]   quantize_weight's output (= bf16(codes x scales) exactly)
    f32.codes         I8   [out, in]   the F32 module's codes (its output is codes x scales exactly)
    f32.scales        BF16 [out, in/group]  equal to bf16.scales (checked)
__metadata__: group_size, dead_columns (comma separated), description, versions, settings.
"""

import argparse
import pathlib
import sys
from importlib.metadata import version

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.lifecycle.initialize import initialize_module_for_quantization
import llmcompressor.modifiers.gptq.gptq_quantize as gptq_quantize
from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight
from llmcompressor.modifiers.gptq.helpers import accumulate_hessian, make_empty_hessian, prepare_batch
from llmcompressor.modifiers.quantization.calibration import initialize_observer, observe

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import stable_header  # noqa: E402

BLOCKSIZE = 128
PERCDAMP = 0.01
SEED = 0x6717


def correlated_inputs(rng, samples, columns, dead=()):
    """Activations with correlated channels and a few outlier channels (x8), optionally dead columns."""
    mixing = np.eye(columns) + 0.35 * rng.standard_normal((columns, columns)) / np.sqrt(columns)
    channel = np.exp(0.4 * rng.standard_normal(columns))
    channel[rng.choice(columns, 3, replace=False)] *= 8.0
    x = rng.standard_normal((samples, columns)) @ mixing * channel
    x[:, list(dead)] = 0.0
    return x


def low_rank_inputs(rng, samples, columns, rank):
    basis = rng.standard_normal((rank, columns))
    return rng.standard_normal((samples, rank)) @ basis + 0.01 * rng.standard_normal((samples, columns))


# name, out, in, group, samples, batches, dead columns, description
CASES = [
    ("full_rank_g32", 32, 128, 32, 160, 4, (), "correlated full-rank inputs, one 128-column block"),
    ("low_rank_g128", 16, 256, 128, 64, 2, (), "rank-12 inputs plus 1% noise, two 128-column blocks"),
    ("dead_columns_g32", 24, 96, 32, 112, 1, (5, 70), "inputs with columns 5 and 70 always 0 (H[i,i] = 0)"),
]


@torch.no_grad()
def llm_compressor_gptq(weight, inputs, group, batches, module_dtype, scale_dtype):
    """GPTQModifier.compress_module_list's calls for one Linear; returns (codes, scales, output, loss).

    `weight` and `inputs` are BF16 tensors (cast to `module_dtype`, exactly). `scale_dtype` is
    QuantizationArgs.scale_dtype (None: the scale takes the weight's dtype).
    """
    rows, columns = weight.shape
    samples = inputs.shape[0]
    module = torch.nn.Linear(columns, rows, bias=False, dtype=module_dtype)
    module.weight.copy_(weight.to(module_dtype))
    args = QuantizationArgs(
        num_bits=4,
        type="int",
        symmetric=True,
        strategy="group",
        group_size=group,
        actorder=None,
        scale_dtype=scale_dtype,
    )
    initialize_module_for_quantization(module, QuantizationScheme(targets=["Linear"], weights=args))
    initialize_observer(module, "weight")

    hessian = make_empty_hessian(module)
    num_samples = torch.zeros(())
    for batch in inputs.to(module_dtype).reshape(batches, 1, samples // batches, columns):
        hessian, num_samples = accumulate_hessian(batch, module, hessian, num_samples)

    observe(module, "weight")
    qparams = module.weight_observer.get_qparams()
    assert qparams["scale"].dtype == module_dtype, qparams["scale"].dtype
    weights, hessians, scales, zero_points, global_scales = prepare_batch(
        [module], [qparams], {module: hessian}, {module: num_samples}
    )
    # compress_module_list runs this under torch.no_grad(), as the whole function is here.
    quantized, losses, rtn_fallback = quantize_weight(
        weights=weights,
        hessians=hessians,
        scale=scales,
        zero_point=zero_points,
        global_scale=global_scales,
        quant_args=args,
        blocksize=BLOCKSIZE,
        percdamp=PERCDAMP,
    )
    assert not rtn_fallback.any(), "llm-compressor fell back to round-to-nearest"
    quantized = quantized[0]
    scale = qparams["scale"]
    assert torch.equal(scale.to(torch.bfloat16).to(scale.dtype), scale), "scales are not BF16 values"
    expanded = scale.float().repeat_interleave(group, dim=1)
    codes = torch.round(quantized / expanded)
    assert codes.min() >= -8 and codes.max() <= 7
    # fake_quantize dequantizes in the scale's dtype: with BF16 scales the output (and the value that
    # GPTQ's error feedback used) is bf16(code x scale), not the exact product (up to 11 significant
    # bits); with F32 scales it is the exact product.
    product = codes.to(scale.dtype) * scale.repeat_interleave(group, dim=1)
    assert torch.equal(product.float(), quantized), "quantize_weight's output is not code x scale"
    return codes.to(torch.int8), scale.to(torch.bfloat16), quantized, losses.item()


def run_case(index, name, rows, columns, group, samples, batches, dead):
    rng = np.random.default_rng(SEED + index)
    weight = torch.from_numpy(0.02 * rng.standard_normal((rows, columns))).to(torch.bfloat16)
    if name.startswith("low_rank"):
        x = low_rank_inputs(rng, samples, columns, 12)
    else:
        x = correlated_inputs(rng, samples, columns, dead)
    inputs = torch.from_numpy(x).to(torch.bfloat16)

    # A BF16 model: BF16 scales, feedback against bf16(code x scale).
    codes, scales, output, loss = llm_compressor_gptq(weight, inputs, group, batches, torch.bfloat16, None)
    # An F32 model with scale_dtype bfloat16: the same scale values held in F32, exact feedback.
    codes_f32, scales_f32, output_f32, loss_f32 = llm_compressor_gptq(
        weight, inputs, group, batches, torch.float32, torch.bfloat16
    )
    assert torch.equal(scales, scales_f32), "the two models' scales differ"
    # How sensitive the codes are to f32 rounding: the F32 model again with llm-compressor's working
    # precision (its module constant GPTQ_PRECISION) set to float64. Printed, not stored.
    gptq_quantize.GPTQ_PRECISION = torch.float64
    try:
        codes_f64 = llm_compressor_gptq(weight, inputs, group, batches, torch.float32, torch.bfloat16)[0]
    finally:
        gptq_quantize.GPTQ_PRECISION = torch.float32
    f64_agreement = (codes_f64 == codes_f32).double().mean().item()
    # llm-compressor zeroes the weight columns that no input excites.
    for column in dead:
        assert torch.all(codes[:, column] == 0) and torch.all(codes_f32[:, column] == 0)

    # Independent scale check: bf16(absmax / 7.5) per group, computed in numpy f32.
    absmax = np.abs(weight.float().numpy()).reshape(rows, columns // group, group).max(axis=2)
    want = torch.from_numpy((absmax / np.float32(7.5)).astype(np.float32)).to(torch.bfloat16)
    assert torch.equal(want, scales), "observer scale is not bf16(absmax / 7.5)"

    w = weight.double().numpy()
    xs = inputs.double().numpy()
    expanded = scales.double().repeat_interleave(group, dim=1).numpy()
    rtn = np.clip(np.round(w / expanded), -8, 7) * expanded
    reference = xs @ w.T

    def relative(approx):
        return np.linalg.norm(xs @ approx.T - reference) / np.linalg.norm(reference)

    exact = lambda c: c.double().numpy() * expanded  # noqa: E731
    print(
        f"{name}: [{rows}, {columns}] group {group}, {samples} inputs; output error (relative L2, "
        f"exact code x scale): bf16 model {relative(exact(codes)):.5f}, f32 model "
        f"{relative(exact(codes_f32)):.5f}, rtn {relative(rtn):.5f}; bf16 model with its own "
        f"bf16(code x scale) {relative(output.double().numpy()):.5f}; codes equal between the models "
        f"{(codes == codes_f32).double().mean().item():.2%}; f32 model in float64 vs float32: "
        f"{f64_agreement:.2%} of codes equal; losses {loss:.4g} / {loss_f32:.4g}"
    )
    return {
        "weight": weight.float().contiguous(),
        "inputs": inputs.contiguous(),
        "bf16.codes": codes.contiguous(),
        "bf16.scales": scales.contiguous(),
        "bf16.dequantized": output.to(torch.bfloat16).contiguous(),
        "f32.codes": codes_f32.contiguous(),
        "f32.scales": scales_f32.contiguous(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("tests/golden/gptq"))
    options = parser.parse_args()
    torch.manual_seed(0)
    options.out.mkdir(parents=True, exist_ok=True)
    versions = ", ".join(
        f"{package} {version(package)}" for package in ("llmcompressor", "compressed-tensors", "torch")
    )
    for index, (name, rows, columns, group, samples, batches, dead, description) in enumerate(CASES):
        tensors = run_case(index, name, rows, columns, group, samples, batches, dead)
        metadata = {
            "group_size": str(group),
            "dead_columns": ",".join(str(column) for column in dead),
            "description": description,
            "versions": versions,
            "settings": f"symmetric int4, strategy group, actorder None, blocksize {BLOCKSIZE}, "
            f"percdamp {PERCDAMP}, observer memoryless_minmax; bf16.*: BF16 module, "
            "f32.*: F32 module with scale_dtype bfloat16",
            "made_by": "scripts/oracle/gptq/make-golden.py",
        }
        path = options.out / f"{name}.safetensors"
        save_file(tensors, str(path), metadata=metadata)
        stable_header.sort_metadata_in_place(path)
        back = load_file(str(path))
        assert all(torch.equal(back[key], value) for key, value in tensors.items())
        print(f"  wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
