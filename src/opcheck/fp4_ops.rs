//! The FP4 dequantize kernels (kernels/fp4_dequant.cu) against the CPU's decode, bit for bit: random packed codes
//! (every nibble, both signs of zero) under random scales — NVFP4 e4m3 bytes from subnormal to 448 (NaN codes give
//! NaN on both sides) with globals from small to large, MXFP4 E8M0 exponents over the whole range including 0 (a
//! subnormal) — on awkward row counts.

use super::backend_ops::row;
use super::SelftestRow;
use crate::format::compressed_tensors::Fp4Kind;
use crate::quant::fp4::{self, MXFP4_GROUP, NVFP4_GROUP};
use crate::rng::Rng;
use crate::runtime::cuda::fp4::{dequantize, Fp4OnDevice};
use crate::runtime::device::{CudaError, Device};

/// `nvfp4_dequant_f32` and `mxfp4_dequant_f32` over fixed awkward shapes, each compared element by element.
pub fn fp4_dequant(device: &dyn Device, rng: &mut Rng) -> Result<Vec<SelftestRow>, CudaError> {
    let mut rows_out = Vec::new();
    for (rows, columns) in [(1, 32), (7, 96), (33, 480), (5, 2048)] {
        for kind in [Fp4Kind::Nvfp4, Fp4Kind::Mxfp4] {
            let group = if kind == Fp4Kind::Nvfp4 { NVFP4_GROUP } else { MXFP4_GROUP };
            let packed: Vec<u8> = (0..rows * columns / 2).map(|_| rng.below(256) as u8).collect();
            let scales: Vec<u8> = (0..rows * columns / group).map(|_| rng.below(256) as u8).collect();
            let global = [0.37f32, 2688.0, 1.0e6][rng.below(3)]; // NVFP4 only
            let mut want = vec![0f32; rows * columns];
            let mut codes = vec![0u8; columns];
            for (r, out) in want.chunks_mut(columns).enumerate() {
                fp4::unpack(&packed[r * columns / 2..][..columns / 2], &mut codes);
                let row_scales = &scales[r * columns / group..][..columns / group];
                match kind {
                    Fp4Kind::Nvfp4 => fp4::nvfp4_dequantize_row(&codes, row_scales, global, out),
                    Fp4Kind::Mxfp4 => fp4::mxfp4_dequantize_row(&codes, row_scales, out),
                }
            }
            let (packed_on, scales_on) = (device.upload(&packed)?, device.upload(&scales)?);
            let out = device.alloc_for::<f32>(rows * columns)?;
            device.write(&out, &vec![0xA5u8; rows * columns * 4])?;
            let weight = Fp4OnDevice { kind, packed: &packed_on, scales: &scales_on, global, rows, columns };
            dequantize(device, &weight, &out)?;
            let got = device.download::<f32>(&out, rows * columns)?;
            let mismatches = got
                .iter()
                .zip(&want)
                .filter(|(g, w)| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()))
                .count();
            let op = match kind {
                Fp4Kind::Nvfp4 => "nvfp4_dequant_f32",
                Fp4Kind::Mxfp4 => "mxfp4_dequant_f32",
            };
            let finite =
                |values: &[f32]| values.iter().map(|v| if v.is_finite() { *v } else { 0.0 }).collect::<Vec<_>>();
            let note = match kind {
                Fp4Kind::Nvfp4 => format!("bit-identical to the CPU decode (NaN = NaN); global scale {global}"),
                Fp4Kind::Mxfp4 => "bit-identical to the CPU decode".to_string(),
            };
            rows_out.push(
                row(op, format!("{rows}x{columns}"), &finite(&got), &finite(&want), mismatches, 0.0).with_note(note),
            );
        }
    }
    Ok(rows_out)
}
