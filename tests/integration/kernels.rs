//! The quantize command's kernels without a GPU: kernels/*.cu on the emulated device, launched by
//! src/convert/device_quantize.rs, against squeeze's CPU implementation on the same random inputs (awkward shapes,
//! partial FP8 blocks, NaN codes, zero groups, overflowing scales). Outputs are poisoned, so an unwritten element fails.
//! Every rule must be bit-identical, `mse` included (its |x|^2.4 is built from basic operations in both). On a real
//! GPU `squeeze selftest` reports the count of `mse` groups that differ by a tie within rounding instead.

use half::bf16;
use squeeze::convert::device_quantize::{
    dequantize_fp8, launch_int4, quantize_int4, Fp8Tensor, Int4Buffers, Int4Output, Int4Settings, Source,
};
use squeeze::opcheck::quantize_kernels::compare_int4 as compare_int4_outputs;
use squeeze::quant::fp8_block::{dequantize_row, BlockGrid};
use squeeze::quant::scale_rule::{MseSearch, ScaleRule};
use squeeze::quant::{int4, pack};
use squeeze::runtime::device::emulated::Emulator;
use squeeze::runtime::device::{Arg, Device, LaunchShape};

fn emulator() -> Box<dyn Device> {
    Box::new(Emulator::start().expect("the kernel emulator builds and starts"))
}

/// xorshift64*: fixed seeds, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// A roughly normal value (sum of uniforms), with a rare outlier.
    fn weight(&mut self) -> f32 {
        let value: f32 = (0..4).map(|_| self.unit() - 0.5).sum::<f32>() * 0.05;
        if self.next().is_multiple_of(97) {
            value * 20.0
        } else {
            value
        }
    }
}

/// FP8 codes: mostly realistic magnitudes, rare NaN codes, one all-zero row (±0 codes).
fn random_codes(rng: &mut Rng, rows: usize, columns: usize) -> Vec<u8> {
    let mut codes: Vec<u8> = (0..rows * columns)
        .map(|_| match rng.next() % 3000 {
            0 => 0x7F,
            1 => 0xFF,
            _ => {
                let code = (rng.next() % 0x7E) as u8; // finite magnitudes
                code | if rng.next().is_multiple_of(2) { 0x80 } else { 0 }
            }
        })
        .collect();
    if rows > 2 {
        for (j, code) in codes[columns..2 * columns].iter_mut().enumerate() {
            *code = if j % 3 == 0 { 0x80 } else { 0x00 };
        }
    }
    codes
}

/// Block scales: small positive multipliers, one tiny and one that overflows 448·s to infinity.
fn random_block_scales(rng: &mut Rng, count: usize) -> Vec<f32> {
    let mut scales: Vec<f32> = (0..count).map(|_| 1e-4 + rng.unit() * 1e-2).collect();
    if count > 2 {
        scales[count / 2] = 1e36;
        scales[count - 1] = 1e-30;
    }
    scales
}

fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// CPU reference for rows `first_row..first_row + rows` of an FP8 tensor: packed words and scale bits.
fn cpu_int4(
    grid: &BlockGrid,
    first_row: usize,
    rows: usize,
    codes: &[u8],
    block_scales: &[f32],
    group_size: usize,
    rule: ScaleRule,
) -> (Vec<u32>, Vec<u16>) {
    let columns = grid.columns;
    let mut weights = vec![0f32; columns];
    let (mut q, mut scales) = (vec![0i8; columns], vec![bf16::ZERO; columns / group_size]);
    let mut words = vec![0u32; pack::packed_columns(columns)];
    let (mut all_words, mut all_scales) = (Vec::new(), Vec::new());
    for local in 0..rows {
        dequantize_row(grid, first_row + local, &codes[local * columns..][..columns], block_scales, &mut weights);
        int4::quantize_row(&weights, group_size, rule, &mut q, &mut scales);
        pack::pack_row(&q, &mut words);
        all_words.extend_from_slice(&words);
        all_scales.extend(scales.iter().map(|s| s.to_bits()));
    }
    (all_words, all_scales)
}

/// Compares a kernel's INT4 output with the CPU's for weights `weights`; prints how many groups differ.
/// ct-minmax and absmax7 must be bit-identical; an `mse` group may differ only by a tie within rounding.
fn compare_int4(
    label: &str,
    weights: &[f32],
    rule: ScaleRule,
    group_size: usize,
    (want_words, want_scales): (Vec<u32>, Vec<u16>),
    got_words: Vec<u32>,
    got_scales: Vec<u16>,
) {
    assert_eq!(got_words.len(), want_words.len(), "{label}: packed length");
    assert_eq!(got_scales.len(), want_scales.len(), "{label}: scale count");
    let got = Int4Output { packed: got_words, scales: got_scales };
    let want = Int4Output { packed: want_words, scales: want_scales };
    let (different, unexplained, max_error) = compare_int4_outputs(weights, group_size, rule, &got, &want);
    println!(
        "{label}: {different} group(s) differ from the CPU ({unexplained} not an mse tie), max rel error {max_error:e}"
    );
    assert_eq!(unexplained, 0, "{label}: {unexplained} group(s) differ from the CPU path");
    // The kernels compute `mse`'s |x|^2.4 and its lane-ordered sums with the CPU's operations in the CPU's order,
    // so under emulation every rule, `mse` included, must be bit-identical.
    assert_eq!(different, 0, "{label}: {rule} must be bit-identical to the CPU");
}

#[test]
fn emulation_primitives_behave_like_cuda() {
    let device = emulator();
    let blocks = 3usize;
    let threads = 256usize;
    // Small integers: exact sums in any order.
    let input: Vec<f32> = (0..blocks * threads).map(|i| ((i * 7919) % 61) as f32 - 30.0).collect();
    let warps = input.len() / 32;
    let in_buffer = device.upload(&input).unwrap();
    let (block_sums, warp_sums) =
        (device.alloc_for::<f32>(blocks).unwrap(), device.alloc_for::<f32>(2 * warps).unwrap());
    let (ballots, broadcast) = (device.alloc_for::<u32>(warps).unwrap(), device.alloc_for::<f32>(warps).unwrap());
    let args = [
        Arg::Buffer(&in_buffer),
        Arg::Buffer(&block_sums),
        Arg::Buffer(&warp_sums),
        Arg::Buffer(&ballots),
        Arg::Buffer(&broadcast),
    ];
    device.launch("emulation_primitives", LaunchShape::linear(blocks as u32, threads as u32), &args).unwrap();
    let block_sums = device.download::<f32>(&block_sums, blocks).unwrap();
    let warp_sums = device.download::<f32>(&warp_sums, 2 * warps).unwrap();
    let ballots = device.download::<u32>(&ballots, warps).unwrap();
    let broadcast = device.download::<f32>(&broadcast, warps).unwrap();
    for (block, sum) in block_sums.iter().enumerate() {
        let want: f32 = input[block * threads..][..threads].iter().sum();
        assert_eq!(*sum, want, "block {block} sum");
    }
    for warp in 0..warps {
        let lanes = &input[warp * 32..][..32];
        let want: f32 = lanes.iter().sum();
        let want_ballot = lanes.iter().enumerate().filter(|(_, v)| **v > 0.0).fold(0u32, |b, (l, _)| b | 1 << l);
        assert_eq!((warp_sums[2 * warp], warp_sums[2 * warp + 1]), (want, want), "warp {warp}: xor and down sums");
        assert_eq!(ballots[warp], want_ballot, "warp {warp} ballot");
        assert_eq!(broadcast[warp], lanes[0], "warp {warp} lane-0 broadcast");
    }
}

#[test]
fn fp8_block_dequant_matches_the_cpu() {
    // (total rows, columns, block rows, block columns, first row, rows in the slice)
    let cases = [(130, 200, 128, 128, 0, 130), (7, 45, 3, 16, 0, 7), (20, 33, 4, 5, 6, 9), (5, 64, 1, 64, 0, 5)];
    let device = emulator();
    let mut rng = Rng(0x5EED_0001);
    for (case, &(total_rows, columns, block_rows, block_columns, first_row, rows)) in cases.iter().enumerate() {
        let grid = BlockGrid::new(total_rows, columns, block_rows, block_columns);
        let [scale_rows, scale_columns] = grid.scale_shape();
        let codes = random_codes(&mut rng, total_rows, columns);
        let block_scales = random_block_scales(&mut rng, scale_rows * scale_columns);
        let slice = codes[first_row * columns..(first_row + rows) * columns].to_vec();
        let mut want = vec![0f32; rows * columns];
        for (local, out) in want.chunks_mut(columns).enumerate() {
            dequantize_row(&grid, first_row + local, &slice[local * columns..][..columns], &block_scales, out);
        }
        let tensor = Fp8Tensor {
            name: "dequant",
            codes: &slice,
            block_scales: &block_scales,
            rows,
            columns,
            block_rows,
            block_columns,
        };
        for op in ["dequant-f32", "dequant-bf16"] {
            let bytes = dequantize_fp8(device.as_ref(), &tensor, first_row, op == "dequant-bf16").unwrap();
            if op == "dequant-f32" {
                let got: Vec<f32> =
                    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                assert_eq!(got.len(), want.len());
                for (index, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(same_f32(*g, *w), "case {case} element {index}: {g} vs CPU {w}");
                }
            } else {
                let got: Vec<u16> = bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
                assert_eq!(got.len(), want.len());
                for (index, (g, w)) in got.iter().zip(&want).enumerate() {
                    let w = bf16::from_f32(*w);
                    assert!(
                        *g == w.to_bits() || (bf16::from_bits(*g).is_nan() && w.is_nan()),
                        "case {case} element {index}: {g:#06x} vs CPU {:#06x}",
                        w.to_bits()
                    );
                }
            }
        }
    }
}

#[test]
fn int4_quantize_of_fp8_matches_the_cpu_for_every_rule() {
    // (total rows, columns, group, block rows, block columns, first row, rows in the slice)
    let cases = [
        (131, 96, 32, 128, 128, 0, 131),
        (9, 320, 64, 128, 128, 0, 9),
        (5, 384, 128, 128, 128, 0, 5),
        (7, 48, 16, 3, 40, 0, 7),
        (11, 72, 24, 4, 7, 0, 11),
        (3, 64, 32, 1, 64, 0, 3),
        (20, 160, 32, 4, 48, 6, 9),
    ];
    let device = emulator();
    let mut rng = Rng(0x5EED_0002);
    let search = MseSearch::default();
    for (case, &(total_rows, columns, group, block_rows, block_columns, first_row, rows)) in cases.iter().enumerate() {
        let grid = BlockGrid::new(total_rows, columns, block_rows, block_columns);
        let [scale_rows, scale_columns] = grid.scale_shape();
        let codes = random_codes(&mut rng, total_rows, columns);
        let block_scales = random_block_scales(&mut rng, scale_rows * scale_columns);
        let slice = codes[first_row * columns..(first_row + rows) * columns].to_vec();
        let (codes_buffer, scales_buffer) = (device.upload(&slice).unwrap(), device.upload(&block_scales).unwrap());
        for rule in ScaleRule::ALL {
            // Poisoned outputs: 0xA5 bytes.
            let packed = device.upload(&vec![0xA5A5_A5A5u32; rows * columns / 8]).unwrap();
            let scales = device.upload(&vec![0xA5A5u16; rows * columns / group]).unwrap();
            let buffers = Int4Buffers {
                input: &codes_buffer,
                block_scales: Some((&scales_buffer, block_rows, block_columns)),
                packed: &packed,
                scales: &scales,
            };
            let settings = Int4Settings { group_size: group, rule, search, poison_outputs: true };
            launch_int4(device.as_ref(), &buffers, rows, columns, first_row, &settings).unwrap();
            let got_words = device.download::<u32>(&packed, rows * columns / 8).unwrap();
            let got_scales = device.download::<u16>(&scales, rows * columns / group).unwrap();
            let want = cpu_int4(&grid, first_row, rows, &slice, &block_scales, group, rule);
            let mut weights = vec![0f32; rows * columns];
            for (local, out) in weights.chunks_mut(columns).enumerate() {
                dequantize_row(&grid, first_row + local, &slice[local * columns..][..columns], &block_scales, out);
            }
            let label = format!("case {case} ({rows}x{columns} group {group}) {rule}");
            compare_int4(&label, &weights, rule, group, want, got_words, got_scales);
        }
    }
}

#[test]
fn int4_quantize_of_f32_matches_the_cpu_for_every_rule() {
    let cases = [(67, 160, 32), (13, 192, 64), (6, 256, 128), (9, 40, 8)];
    let device = emulator();
    let mut rng = Rng(0x5EED_0003);
    for (case, &(rows, columns, group)) in cases.iter().enumerate() {
        let mut values: Vec<f32> = (0..rows * columns).map(|_| rng.weight()).collect();
        values[..group].fill(0.0); // a zero group
        for rule in ScaleRule::ALL {
            let source = Source::F32 { name: "f32", values: &values, rows, columns };
            let settings = Int4Settings { group_size: group, rule, search: MseSearch::default(), poison_outputs: true };
            let got = quantize_int4(device.as_ref(), &source, &settings).unwrap();
            let mut want_words = Vec::new();
            let mut want_scales = Vec::new();
            let (mut q, mut row_scales) = (vec![0i8; columns], vec![bf16::ZERO; columns / group]);
            let mut words = vec![0u32; columns / 8];
            for row in values.chunks(columns) {
                int4::quantize_row(row, group, rule, &mut q, &mut row_scales);
                pack::pack_row(&q, &mut words);
                want_words.extend_from_slice(&words);
                want_scales.extend(row_scales.iter().map(|s| s.to_bits()));
            }
            let label = format!("f32 case {case} ({rows}x{columns} group {group}) {rule}");
            compare_int4(&label, &values, rule, group, (want_words, want_scales), got.packed, got.scales);
        }
    }
}
