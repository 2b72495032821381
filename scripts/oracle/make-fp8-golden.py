#!/usr/bin/env python3
"""Write tests/golden/fp8_e4m3fn.safetensors: torch's float8_e4m3fn codec as golden data.

Usage (from the repository root, after scripts/oracle/setup-venv.sh):

    .venv-oracle/bin/python scripts/oracle/make-fp8-golden.py [--out tests/golden/fp8_e4m3fn.safetensors]

Tensors written (all produced by torch 2.15's `Tensor.to(torch.float8_e4m3fn)` and
`Tensor.view(torch.float8_e4m3fn).float()`):

  decode           F32 [256]  float32 value of every byte code 0..255 (0x7F / 0xFF are NaN)
  midpoint_values  F32 [N]    encoder probes (see below), bit-exact f32
  midpoint_codes   U8  [N]    the code torch produces for each probe
  random_values    F32 [100000]  fixed seed, |x| log-uniform in [1e-4, 500], random sign
  random_codes     U8  [100000]

Probes in midpoint_values, in this order:
  * for every pair of adjacent finite codes (positive side 0x00..0x7E, negative side
    0x80..0xFE; this includes 0 <-> smallest subnormal and subnormal <-> subnormal)
    the exact midpoint (exactly representable in f32), then nextafter(mid, -inf) and
    nextafter(mid, +inf) in f32;
  * every finite code's own value (round trip);
  * out-of-range values 449, 464, 464+ulp, 465, 479, 480, 481, 500, 1e4, 65504, 3e38,
    f32::MAX, +inf and their negatives;
  * +0, -0, the smallest f32 subnormal (+-), +NaN (0x7FC00000) and -NaN (0xFFC00000).

Overflow behaviour of torch 2.15 (checked by this script, see OVERFLOW below): it
SATURATES. Every finite |x| > 448 and +-inf encode to 0x7E / 0xFE (+-448); 464 (the tie
between 448 and the nonexistent 480) also gives 448. NaN keeps its sign: +NaN -> 0x7F,
-NaN -> 0xFF. Because torch saturates, exactly like the Rust codec is specified to, no
separate overflow_values/overflow_codes pair is needed and the overflow probes live in
midpoint_values. The script asserts this and would write the separate pair (and say so)
if a future torch produced NaN for finite overflow.
"""

import argparse
import pathlib
import sys

import numpy as np
import torch
from safetensors.numpy import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import stable_header  # noqa: E402

RANDOM_COUNT = 100_000
RANDOM_SEED = 0x5EED_F8
FP8 = torch.float8_e4m3fn


def torch_encode(values_f32: np.ndarray) -> np.ndarray:
    """Encode f32 values to e4m3fn byte codes with torch."""
    t = torch.from_numpy(np.ascontiguousarray(values_f32, dtype=np.float32))
    return t.to(FP8).view(torch.uint8).numpy().copy()


def torch_decode_all() -> np.ndarray:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    return codes.view(FP8).float().numpy().copy()


def f32(x) -> np.float32:
    return np.float32(x)


def build_probes(decode: np.ndarray) -> np.ndarray:
    probes: list[np.float32] = []
    inf = f32(np.inf)
    for side in (range(0x00, 0x7F), range(0x80, 0xFF)):  # finite codes, monotone in |value|
        codes = list(side)
        for lo, hi in zip(codes[:-1], codes[1:]):
            a, b = np.float64(decode[lo]), np.float64(decode[hi])
            mid64 = (a + b) / 2.0
            mid = f32(mid64)
            assert np.float64(mid) == mid64, f"midpoint of {lo:#x},{hi:#x} not exact in f32"
            probes += [mid, np.nextafter(mid, -inf), np.nextafter(mid, inf)]
    finite_codes = [c for c in range(256) if c not in (0x7F, 0xFF)]
    probes += [f32(decode[c]) for c in finite_codes]

    overflow = [449.0, 464.0, float(np.nextafter(f32(464.0), inf)), 465.0, 479.0, 480.0,
                481.0, 500.0, 1e4, 65504.0, 3e38, float(np.finfo(np.float32).max), np.inf]
    probes += [f32(v) for v in overflow] + [f32(-v) for v in overflow]

    tiny = np.array([1], dtype=np.uint32).view(np.float32)[0]  # smallest f32 subnormal
    probes += [f32(0.0), f32(-0.0), tiny, -tiny]
    probes += list(np.array([0x7FC00000, 0xFFC00000], dtype=np.uint32).view(np.float32))
    return np.array(probes, dtype=np.float32)


def build_random(rng: np.random.Generator, count: int) -> np.ndarray:
    log_lo, log_hi = np.log(1e-4), np.log(500.0)
    magnitude = np.exp(rng.uniform(log_lo, log_hi, size=count))
    sign = np.where(rng.random(count) < 0.5, -1.0, 1.0)
    return (sign * magnitude).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    repo_root = pathlib.Path(__file__).resolve().parents[2]
    parser.add_argument("--out", type=pathlib.Path,
                        default=repo_root / "tests/golden/fp8_e4m3fn.safetensors")
    args = parser.parse_args()

    decode = torch_decode_all()
    assert np.isnan(decode[0x7F]) and np.isnan(decode[0xFF])
    assert decode[0x7E] == 448.0 and decode[0xFE] == -448.0 and decode[0x01] == 2.0 ** -9

    probes = build_probes(decode)
    probe_codes = torch_encode(probes)
    # The vectorised and the one-element path must agree (torch has both on CPU).
    single = np.array([torch_encode(probes[i:i + 1])[0] for i in range(len(probes))], np.uint8)
    assert np.array_equal(single, probe_codes), "torch scalar and vector fp8 paths disagree"

    rng = np.random.default_rng(RANDOM_SEED)
    random_values = build_random(rng, RANDOM_COUNT)
    random_codes = torch_encode(random_values)

    # OVERFLOW: split out non-NaN inputs that torch maps to a NaN code (it does not in 2.15).
    tensors: dict[str, np.ndarray] = {"decode": decode}
    overflow_v, overflow_c = [], []
    for name, values, codes in (("midpoint", probes, probe_codes),
                                ("random", random_values, random_codes)):
        to_nan = ~np.isnan(values) & np.isin(codes, (0x7F, 0xFF))
        overflow_v.append(values[to_nan])
        overflow_c.append(codes[to_nan])
        tensors[f"{name}_values"] = values[~to_nan]
        tensors[f"{name}_codes"] = codes[~to_nan]
    overflow_values = np.concatenate(overflow_v)
    if overflow_values.size:
        tensors["overflow_values"] = overflow_values
        tensors["overflow_codes"] = np.concatenate(overflow_c)
        print(f"torch maps {overflow_values.size} finite/inf overflow inputs to NaN: "
              "written separately as overflow_values/overflow_codes")
    else:
        big = np.abs(probes) > 448
        assert np.all(probe_codes[big & (probes > 0)] == 0x7E)
        assert np.all(probe_codes[big & (probes < 0)] == 0xFE)
        print("torch saturates overflow (|x| > 448 and inf -> +-448); no overflow tensors")

    nan_in = np.isnan(probes)
    print("NaN inputs ->", [hex(c) for c in probe_codes[nan_in]])

    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out), metadata={
        "producer": "scripts/oracle/make-fp8-golden.py",
        "torch": torch.__version__,
        "random_seed": str(RANDOM_SEED),
        "overflow": "nan" if overflow_values.size else "saturate",
    })
    stable_header.sort_metadata_in_place(args.out)
    sizes = ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in tensors.items())
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes): {sizes}")


if __name__ == "__main__":
    main()
