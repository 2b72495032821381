#!/usr/bin/env python3
"""Check a squeeze INT4 output folder against compressed-tensors 0.20.1 and transformers 5.24.

Usage (repository root, after scripts/oracle/setup-venv.sh):

    .venv-oracle/bin/python scripts/oracle/check-output.py OUT_DIR [--source SRC_DIR]
        [--match REGEX] [--max-tensors N] [--skip-load] [--strict-dense] [--json]

OUT_DIR   squeeze output: config.json with a compressed-tensors pack-quantized
          quantization_config, shards with <prefix>.weight_packed I32 [out, ceil(in/8)],
          <prefix>.weight_scale BF16 [out, ceil(in/group)], <prefix>.weight_shape I64 (or I32) [2].
--source  the FP8 block source squeeze read (<prefix>.weight F8_E4M3 + <prefix>.weight_scale_inv
          F32 per 128x128 block, partial edge blocks; compressed-tensors float-quantized
          `weight_scale` and plain BF16/F32 weights are accepted too).
--match   only check quantized prefixes matching this regex (re.search); --max-tensors caps the count.
--skip-load  skip check (c); use it for real-size checkpoints (c) loads the whole model into RAM.

Checks, per quantized prefix:
  (a) unpack_from_int32 (compressed-tensors) == independent numpy unpack, and compressed-tensors'
      dequantize(q, scale) == numpy q * f32(bf16 scale), bit for bit; shapes/dtypes as above;
      scales finite and > 0.
  (b) with --source: the source dequantized exactly in f32 (fp8 * scale_inv[i//128][j//128]),
      quantized and packed by compressed-tensors (PackedQuantizationCompressor.compress =
      quantize + pack_to_int32) WITH THE STORED SCALES reproduces weight_packed bit for bit;
      prints the nibble agreement rate and which scale rule the stored scales follow
      (minmax absmax/7.5, absmax/7, or other: clip search). Dense BF16 outputs whose source is FP8
      are compared with bf16(f32 dequant) (informational unless --strict-dense).
  (c) transformers loads the folder: AutoModelForCausalLM.from_pretrained(copy,
      quantization_config=CompressedTensorsConfig(dequantize=True), output_loading_info=True)
      on a temporary copy (symlinked shards; config.json with model_type kimi_k2 -> deepseek_v3
      and auto_map dropped, see docs/correctness.md); no missing/unexpected routed-expert
      keys (MTP layers >= num_hidden_layers excepted), loaded expert weights equal
      bf16(q * scale), a short forward pass gives finite logits.

Exit status: 0 all checks pass, 1 a mismatch was found, 2 bad input or usage.
"""

import argparse
import json
import math
import os
import pathlib
import re
import shutil
import sys
import tempfile
from collections import defaultdict

import numpy as np
import torch
from safetensors import safe_open

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import ctoracle  # noqa: E402
from compressed_tensors.utils.match import match_name  # noqa: E402

EXPERT_RE = re.compile(r"\.mlp\.experts\.")
LAYER_RE = re.compile(r"\blayers\.(\d+)\.")


class InputError(Exception):
    pass


class Folder:
    """All tensors of a safetensors checkpoint folder, opened lazily."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.where: dict[str, pathlib.Path] = {}
        self._open: dict[pathlib.Path, object] = {}
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise InputError(f"{path}: no *.safetensors files")
        index = path / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            for name, file in weight_map.items():
                self.where[name] = path / file
        for file in files:
            for name in self._handle(file).keys():
                if name in self.where and self.where[name] != file:
                    raise InputError(f"{path}: tensor {name} in {file.name} but index says "
                                     f"{self.where[name].name}")
                self.where[name] = file
        missing = [n for n, f in self.where.items() if not f.exists()]
        if missing:
            raise InputError(f"{path}: index names missing shard for {missing[:3]}")

    def _handle(self, file):
        if file not in self._open:
            self._open[file] = safe_open(str(file), framework="pt")
        return self._open[file]

    def __contains__(self, name):
        return name in self.where

    def names(self):
        return self.where.keys()

    def dtype(self, name) -> str:
        return self._handle(self.where[name]).get_slice(name).get_dtype()

    def shape(self, name):
        return list(self._handle(self.where[name]).get_slice(name).get_shape())

    def get(self, name) -> torch.Tensor:
        return self._handle(self.where[name]).get_tensor(name)


class Report:
    def __init__(self):
        self.failures: list[str] = []
        self.warnings: list[str] = []
        self.info: dict[str, object] = {}

    def fail(self, message):
        self.failures.append(message)
        print(f"FAIL  {message}")

    def warn(self, message):
        self.warnings.append(message)
        print(f"warn  {message}")


# ------------------------------------------------------------------ config

def read_quant_config(out_dir: pathlib.Path, report: Report):
    config_path = out_dir / "config.json"
    if not config_path.exists():
        raise InputError(f"{config_path}: missing")
    config = json.loads(config_path.read_text())
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        raise InputError(f"{config_path}: no quantization_config")
    if qc.get("quant_method") != "compressed-tensors":
        report.fail(f"config.json quant_method is {qc.get('quant_method')!r}, "
                    "expected 'compressed-tensors'")
    group_sizes = set()
    for group_name, group in (qc.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        fmt = group.get("format") or qc.get("format")
        expect = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
        for key, value in expect.items():
            if weights.get(key) != value:
                report.fail(f"config_groups.{group_name}.weights.{key} = {weights.get(key)!r}, "
                            f"expected {value!r}")
        if fmt != "pack-quantized":
            report.fail(f"config_groups.{group_name} format {fmt!r}, expected 'pack-quantized'")
        if weights.get("dynamic") not in (False, None):
            report.fail(f"config_groups.{group_name}.weights.dynamic must be false")
        if isinstance(weights.get("group_size"), int):
            group_sizes.add(weights["group_size"])
    if not group_sizes:
        report.fail("config.json quantization_config has no config group with a group_size")
    status = qc.get("quantization_status")
    if status != "compressed":
        report.fail(f"quantization_status {status!r}, expected 'compressed'")
    return config, qc, sorted(group_sizes)


def read_source_block_size(src_dir: pathlib.Path):
    config_path = src_dir / "config.json"
    if not config_path.exists():
        return [128, 128]
    qc = json.loads(config_path.read_text()).get("quantization_config") or {}
    if "weight_block_size" in qc:
        return list(qc["weight_block_size"])
    for group in (qc.get("config_groups") or {}).values():
        block = (group.get("weights") or {}).get("block_structure")
        if block:
            return list(block)
    return [128, 128]


# ------------------------------------------------------------------ helpers

def bf16_to_f32_numpy(t: torch.Tensor) -> np.ndarray:
    return ctoracle.bf16_bits_to_f32(t.view(torch.int16).numpy().view(np.uint16))


def ct_dequant_f32(q: torch.Tensor, scale_f32: torch.Tensor, group_size: int) -> torch.Tensor:
    """compressed-tensors dequantize; pads a partial last group (its code requires in % g == 0)."""
    in_features = q.shape[1]
    padded = scale_f32.shape[1] * group_size
    if padded != in_features:
        q = torch.nn.functional.pad(q, (0, padded - in_features))
    return ctoracle.ct_dequantize(q, scale_f32, group_size)[:, :in_features]


def ct_quantize_pack_any(weight_f32: torch.Tensor, scale_f32: torch.Tensor, group_size: int):
    in_features = weight_f32.shape[1]
    padded = scale_f32.shape[1] * group_size
    if padded == in_features:
        return ctoracle.ct_quantize_pack(weight_f32, scale_f32, group_size)
    padded_weight = torch.nn.functional.pad(weight_f32, (0, padded - in_features))
    q = ctoracle.quantize_via_ct(padded_weight, scale_f32, group_size)[:, :in_features]
    return ctoracle.ct_pack(q.contiguous())


def dequant_source(src: Folder, prefix: str, block_size) -> torch.Tensor | None:
    """Exact f32 weight from the source folder, or None when the source has no such weight."""
    name = f"{prefix}.weight"
    if name not in src:
        return None
    weight = src.get(name)
    if weight.dtype in (torch.bfloat16, torch.float16, torch.float32):
        return weight.to(torch.float32)
    if weight.dtype != torch.float8_e4m3fn:
        raise InputError(f"source {name}: unsupported dtype {weight.dtype}")
    scale_name = next((n for n in (f"{prefix}.weight_scale_inv", f"{prefix}.weight_scale")
                       if n in src), None)
    if scale_name is None:
        raise InputError(f"source {name}: FP8 without weight_scale_inv / weight_scale")
    scale = src.get(scale_name).to(torch.float32)
    out_features, in_features = weight.shape
    if scale.numel() == 1:
        expanded = scale.reshape(1, 1).expand(out_features, in_features)
    elif list(scale.shape) == [out_features, 1]:
        expanded = scale.expand(out_features, in_features)
    else:
        b0, b1 = block_size
        grid = [math.ceil(out_features / b0), math.ceil(in_features / b1)]
        if list(scale.shape) != grid:
            raise InputError(f"source {scale_name}: shape {list(scale.shape)}, expected {grid} "
                             f"for {name} {list(weight.shape)} with blocks {b0}x{b1}")
        rows = torch.arange(out_features) // b0
        cols = torch.arange(in_features) // b1
        expanded = scale[rows][:, cols]
    if not torch.isfinite(scale).all():
        raise InputError(f"source {scale_name}: non-finite scale")
    return weight.to(torch.float32) * expanded


# ------------------------------------------------------------------ checks (a) and (b)

def check_structure(out: Folder, prefix: str, group_sizes, report: Report):
    names = {k: f"{prefix}.{k}" for k in ("weight_packed", "weight_scale", "weight_shape")}
    for key, name in names.items():
        if name not in out:
            report.fail(f"{prefix}: missing {key}")
            return None
    if out.dtype(names["weight_packed"]) != "I32":
        report.fail(f"{names['weight_packed']}: dtype {out.dtype(names['weight_packed'])}, expected I32")
        return None
    if out.dtype(names["weight_scale"]) != "BF16":
        report.fail(f"{names['weight_scale']}: dtype {out.dtype(names['weight_scale'])}, expected BF16")
        return None
    shape_dtype = out.dtype(names["weight_shape"])
    if shape_dtype not in ("I64", "I32"):
        report.fail(f"{names['weight_shape']}: dtype {shape_dtype}, expected I64")
        return None
    if shape_dtype == "I32":
        report.warn(f"{names['weight_shape']}: I32 (squeeze writes I64)")
    shape = out.get(names["weight_shape"]).tolist()
    if len(shape) != 2 or min(shape) <= 0:
        report.fail(f"{names['weight_shape']}: {shape} is not [out, in]")
        return None
    out_features, in_features = shape
    packed_shape = out.shape(names["weight_packed"])
    if packed_shape != [out_features, math.ceil(in_features / 8)]:
        report.fail(f"{names['weight_packed']}: shape {packed_shape}, expected "
                    f"{[out_features, math.ceil(in_features / 8)]}")
        return None
    scale_shape = out.shape(names["weight_scale"])
    fitting = [g for g in group_sizes if scale_shape == [out_features, math.ceil(in_features / g)]]
    if not fitting:
        report.fail(f"{names['weight_scale']}: shape {scale_shape} fits no configured group size "
                    f"{group_sizes} for weight [{out_features}, {in_features}]")
        return None
    return out_features, in_features, fitting[0]


def check_tensor(out: Folder, src: Folder | None, prefix: str, group_sizes, block_size,
                 report: Report, stats):
    structure = check_structure(out, prefix, group_sizes, report)
    if structure is None:
        return
    out_features, in_features, group_size = structure
    packed = out.get(f"{prefix}.weight_packed")
    scale_bf16 = out.get(f"{prefix}.weight_scale")
    scale_np = bf16_to_f32_numpy(scale_bf16)
    scale_f32 = torch.from_numpy(scale_np.copy())

    bad_scale = ~np.isfinite(scale_np) | (scale_np <= 0)
    if bad_scale.any():
        report.fail(f"{prefix}.weight_scale: {int(bad_scale.sum())} non-finite or non-positive "
                    f"scales (first {scale_np[bad_scale][:3].tolist()})")
        return

    # (a) compressed-tensors unpack/dequant vs numpy
    q_ct = ctoracle.ct_unpack(packed, (out_features, in_features))
    q_np = ctoracle.unpack_numpy(packed.numpy(), in_features)
    if not np.array_equal(q_ct.numpy(), q_np):
        report.fail(f"{prefix}: unpack_from_int32 and numpy unpack disagree on "
                    f"{int((q_ct.numpy() != q_np).sum())} elements")
        return
    deq_ct = ct_dequant_f32(q_ct, scale_f32, group_size).numpy()
    deq_np = q_np.astype(np.float32) * np.repeat(scale_np, group_size, axis=1)[:, :in_features]
    if not np.array_equal(deq_ct.view(np.uint32), deq_np.view(np.uint32)):
        report.fail(f"{prefix}: compressed-tensors dequantize differs from numpy q*scale "
                    f"(max abs {float(np.abs(deq_ct - deq_np).max())})")
        return
    stats["a_tensors"] += 1
    stats["a_elements"] += q_np.size
    if in_features % 8:
        words = packed.numpy().view(np.uint32)[:, -1]
        padding_bits = (words >> np.uint32(4 * (in_features % 8))) if in_features % 8 else 0
        if np.any(padding_bits != 0):
            report.warn(f"{prefix}: padding nibbles are not 0 (pack_to_int32 writes 0)")

    # (b) reproduce from the source with the stored scales
    if src is None:
        return
    weight = dequant_source(src, prefix, block_size)
    if weight is None:
        report.fail(f"{prefix}: no {prefix}.weight in the source")
        return
    if list(weight.shape) != [out_features, in_features]:
        report.fail(f"{prefix}: source shape {list(weight.shape)} != weight_shape "
                    f"{[out_features, in_features]}")
        return
    repacked = ct_quantize_pack_any(weight, scale_f32, group_size)
    q_src = ctoracle.unpack_numpy(repacked.numpy(), in_features)
    equal_nibbles = int((q_src == q_np).sum())
    stats["b_tensors"] += 1
    stats["b_elements"] += q_np.size
    stats["b_equal"] += equal_nibbles
    if not np.array_equal(repacked.numpy(), packed.numpy()):
        where = np.argwhere(q_src != q_np)
        detail = ""
        if len(where):
            r, c = where[0]
            detail = (f"; first at [{r},{c}]: w={float(weight[r, c])!r} "
                      f"scale={float(scale_np[r, c // group_size])!r} stored q={int(q_np[r, c])} "
                      f"compressed-tensors q={int(q_src[r, c])}")
        report.fail(f"{prefix}: weight_packed differs from compressed-tensors' quantize+pack of "
                    f"the source ({q_np.size - equal_nibbles} of {q_np.size} nibbles{detail})")

    # which scale rule (informational)
    absmax = np.abs(weight.numpy())
    pad = scale_np.shape[1] * group_size - in_features
    absmax = np.pad(absmax, ((0, 0), (0, pad))).reshape(out_features, -1, group_size).max(axis=2)
    for rule, divisor in (("absmax/7.5", 7.5), ("absmax/7", 7.0)):
        expected = (absmax / np.float32(divisor)).astype(np.float32)
        expected[expected == 0] = np.finfo(np.float32).eps
        expected = bf16_to_f32_numpy(torch.from_numpy(expected).to(torch.bfloat16))
        stats[f"rule {rule}"] += int((expected == scale_np).sum())
    stats["scale_groups"] += scale_np.size


def check_dense(out: Folder, src: Folder, block_size, quantized_prefixes, report, stats, pattern):
    """Dense BF16 outputs whose source is FP8: compare with bf16(exact f32 dequant)."""
    for name in sorted(out.names()):
        if not name.endswith(".weight") or out.dtype(name) != "BF16":
            continue
        prefix = name[: -len(".weight")]
        if prefix in quantized_prefixes or (pattern and not re.search(pattern, prefix)):
            continue
        if name not in src or src.dtype(name) not in ("F8_E4M3",):
            continue
        expected = dequant_source(src, prefix, block_size).to(torch.bfloat16)
        got = out.get(name)
        stats["dense_tensors"] += 1
        if got.shape != expected.shape:
            report.fail(f"{name}: shape {list(got.shape)} != source {list(expected.shape)}")
            continue
        differ = int((got.view(torch.int16) != expected.view(torch.int16)).sum())
        if differ:
            stats["dense_differ"] += 1
            message = (f"{name}: {differ} of {got.numel()} BF16 values differ from "
                       f"bf16(f32 dequant of the FP8 source)")
            if stats["strict_dense"]:
                report.fail(message)
            else:
                report.warn(message)


# ------------------------------------------------------------------ check (c)

def prepare_load_copy(out_dir: pathlib.Path, tmp: pathlib.Path, report: Report):
    for item in out_dir.iterdir():
        if item.name == "config.json":
            continue
        os.symlink(item.resolve(), tmp / item.name)
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("model_type") == "kimi_k2":
        config["model_type"] = "deepseek_v3"
        print("load: config.json model_type kimi_k2 -> deepseek_v3 in the temporary copy")
    if "auto_map" in config:
        config.pop("auto_map")
        print("load: dropped auto_map (use transformers' own classes, no remote code)")
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    return config


def check_load(out_dir: pathlib.Path, out: Folder, quantized_prefixes, report: Report):
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    with tempfile.TemporaryDirectory(prefix="squeeze-load-") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        config = prepare_load_copy(out_dir, tmp, report)
        num_layers = config.get("num_hidden_layers", 1 << 30)
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                tmp, quantization_config=CompressedTensorsConfig(dequantize=True),
                output_loading_info=True)
        except Exception as error:  # any load failure is a finding, not a crash
            report.fail(f"load: from_pretrained raised {type(error).__name__}: "
                        f"{str(error).splitlines()[0] if str(error) else ''}")
            return 0
    model.eval()

    def is_mtp(key):
        match = LAYER_RE.search(key)
        return match is not None and int(match.group(1)) >= num_layers

    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(str(k) for k in (info.get(kind) or []))
        mtp = [k for k in keys if is_mtp(k)]
        rest = [k for k in keys if not is_mtp(k)]
        if mtp:
            print(f"load: {len(mtp)} {kind} in MTP layers >= {num_layers} (not part of the "
                  "transformers model; ignored)")
        experts = [k for k in rest if EXPERT_RE.search(k)]
        others = [k for k in rest if not EXPERT_RE.search(k)]
        if experts:
            report.fail(f"load: {len(experts)} routed-expert {kind}, e.g. {experts[:4]}")
        if others:
            report.warn(f"load: {len(others)} other {kind}, e.g. {others[:4]}")
    for message in info.get("error_msgs") or []:
        report.fail(f"load: {message}")

    # loaded expert weights must be exactly bf16(q * scale)
    state = model.state_dict()
    compared, differ = 0, 0
    fused_cache: dict[str, torch.Tensor] = {}
    for prefix in sorted(quantized_prefixes):
        if is_mtp(prefix):
            continue
        q = ctoracle.ct_unpack(out.get(f"{prefix}.weight_packed"),
                               out.get(f"{prefix}.weight_shape").tolist())
        scale = torch.from_numpy(bf16_to_f32_numpy(out.get(f"{prefix}.weight_scale")).copy())
        group_size = math.ceil(q.shape[1] / scale.shape[1])
        expected = (q.float() * scale.repeat_interleave(group_size, 1)[:, :q.shape[1]])
        expected = expected.to(torch.bfloat16).float()
        loaded = None
        if f"{prefix}.weight" in state:
            loaded = state[f"{prefix}.weight"].float()
        else:
            match = re.match(r"(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$", prefix)
            if match:
                base, expert, proj = match.group(1), int(match.group(2)), match.group(3)
                fused_name = f"{base}.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
                if fused_name in state:
                    fused = fused_cache.setdefault(fused_name, state[fused_name].float())[expert]
                    if proj == "down_proj":
                        loaded = fused
                    else:
                        half = fused.shape[0] // 2
                        loaded = fused[:half] if proj == "gate_proj" else fused[half:]
        if loaded is None:
            report.warn(f"load: cannot find {prefix} in the loaded model's state dict")
            continue
        compared += 1
        if loaded.shape != expected.shape or not torch.equal(loaded, expected):
            differ += 1
            diff = (float((loaded - expected).abs().max()) if loaded.shape == expected.shape
                    else f"shape {list(loaded.shape)} vs {list(expected.shape)}")
            report.fail(f"load: {prefix} loaded weight != bf16(q*scale) (max abs diff {diff})")
    print(f"load: compared {compared} quantized weights in the loaded model with bf16(q*scale); "
          f"{differ} differ")

    vocab = getattr(model.config, "vocab_size", 2)
    ids = torch.arange(8).remainder(vocab).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    if not torch.isfinite(logits).all():
        report.fail("load: forward pass gives non-finite logits")
    else:
        print(f"load: forward pass on 8 tokens ok, logits {list(logits.shape)} finite")
    return compared


# ------------------------------------------------------------------ main

def main() -> int:
    parser = argparse.ArgumentParser(
        description="check a squeeze INT4 pack-quantized output folder",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("out_dir", type=pathlib.Path)
    parser.add_argument("--source", type=pathlib.Path)
    parser.add_argument("--match", help="only check quantized prefixes matching this regex")
    parser.add_argument("--max-tensors", type=int)
    parser.add_argument("--skip-load", action="store_true", help="skip check (c)")
    parser.add_argument("--strict-dense", action="store_true",
                        help="fail when dense BF16 outputs differ from bf16(dequant(source))")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    report = Report()
    try:
        config, qc, group_sizes = read_quant_config(args.out_dir, report)
        out = Folder(args.out_dir)
        src = Folder(args.source) if args.source else None
        block_size = read_source_block_size(args.source) if args.source else None
    except (InputError, OSError, json.JSONDecodeError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    all_prefixes = sorted(n[: -len(".weight_packed")] for n in out.names()
                          if n.endswith(".weight_packed"))
    for name in out.names():
        if name.endswith((".weight_scale", ".weight_shape")):
            prefix = name.rsplit(".", 1)[0]
            if f"{prefix}.weight_packed" not in out and f"{prefix}.weight" not in out:
                report.fail(f"{name}: no {prefix}.weight_packed next to it")
    for prefix in all_prefixes:
        ignored = [i for i in qc.get("ignore") or [] if match_name(prefix, i)]
        if ignored:
            report.fail(f"{prefix}: quantized but matches ignore entry {ignored[0]!r}")
        if f"{prefix}.weight" in out:
            report.fail(f"{prefix}: has both weight and weight_packed")
    prefixes = [p for p in all_prefixes if not args.match or re.search(args.match, p)]
    if args.max_tensors is not None:
        prefixes = prefixes[: args.max_tensors]
    if not prefixes:
        report.fail("no quantized tensors (<prefix>.weight_packed) to check")

    stats = defaultdict(int)
    stats["strict_dense"] = args.strict_dense
    try:
        for i, prefix in enumerate(prefixes):
            check_tensor(out, src, prefix, group_sizes, block_size, report, stats)
            if (i + 1) % 200 == 0:
                print(f"... {i + 1}/{len(prefixes)} tensors", file=sys.stderr)
        if src is not None:
            check_dense(out, src, block_size, set(all_prefixes), report, stats, args.match)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    loaded = None
    if not args.skip_load:
        loaded = check_load(args.out_dir, out, set(all_prefixes), report)

    summary = {
        "out_dir": str(args.out_dir),
        "group_sizes": group_sizes,
        "quantized_tensors": len(all_prefixes),
        "checked_tensors": len(prefixes),
        "a_ok_tensors": stats["a_tensors"],
        "a_elements": stats["a_elements"],
    }
    if src is not None:
        total = max(stats["b_elements"], 1)
        groups = max(stats["scale_groups"], 1)
        summary.update({
            "b_tensors": stats["b_tensors"],
            "b_nibble_agreement": stats["b_equal"] / total,
            "b_nibbles_differ": stats["b_elements"] - stats["b_equal"],
            "scale_rule_share": {rule: stats[f"rule {rule}"] / groups
                                 for rule in ("absmax/7.5", "absmax/7")},
            "dense_fp8_tensors_compared": stats["dense_tensors"],
            "dense_tensors_differ": stats["dense_differ"],
        })
    if loaded is not None:
        summary["c_loaded_weights_compared"] = loaded
    summary["warnings"] = len(report.warnings)
    summary["failures"] = len(report.failures)
    summary["ok"] = not report.failures

    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print("\nsummary")
        for key, value in summary.items():
            if isinstance(value, float):
                value = f"{100 * value:.6f} %"
            elif isinstance(value, dict):
                value = ", ".join(f"{k} {100 * v:.2f} %" for k, v in value.items())
            print(f"  {key:28} {value}")
        print("OK" if summary["ok"] else f"MISMATCH: {len(report.failures)} failure(s)")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
