//! The quantize command's device path: INT4 quantize (from block-scaled FP8 or f32) and FP8 block dequant of one
//! tensor, launched through the runtime's [`Device`] (a GPU or the emulated device) in row chunks, gathered in row
//! order; byte-identical to the CPU path. Launch parameters are those of kernels/int4_quantize.cu and
//! kernels/fp8_dequant.cu (256 threads per block, one group or element per thread).

use super::checks::unsupported;
use super::fp8::{self, Fp8OnDevice};
use crate::quant::scale_rule::{MseSearch, ScaleRule};
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

/// Threads per block of every kernel (the kernels declare `__launch_bounds__(256)`).
const THREADS_PER_BLOCK: u32 = 256;

/// Source bytes per chunk: large enough to keep the device busy, small enough to bound device memory.
const CHUNK_BYTES: usize = 32 << 20;

/// The INT4 output of one tensor: packed words `[rows, columns / 8]` and BF16 scale bits `[rows, columns / group]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Int4Output {
    pub packed: Vec<u32>,
    pub scales: Vec<u16>,
}

/// A block-scaled FP8 tensor as the device path takes it.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Tensor<'a> {
    pub name: &'a str,
    pub codes: &'a [u8],
    pub block_scales: &'a [f32],
    pub rows: usize,
    pub columns: usize,
    pub block_rows: usize,
    pub block_columns: usize,
}

/// What to quantize.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    Fp8(&'a Fp8Tensor<'a>),
    F32 { name: &'a str, values: &'a [f32], rows: usize, columns: usize },
}

impl Source<'_> {
    fn name(&self) -> &str {
        match self {
            Source::Fp8(tensor) => tensor.name,
            Source::F32 { name, .. } => name,
        }
    }
    fn shape(&self) -> (usize, usize) {
        match self {
            Source::Fp8(tensor) => (tensor.rows, tensor.columns),
            Source::F32 { rows, columns, .. } => (*rows, *columns),
        }
    }
    fn element_bytes(&self) -> usize {
        match self {
            Source::Fp8(_) => 1,
            Source::F32 { .. } => 4,
        }
    }
    /// The source bytes of rows `rows`.
    fn bytes(&self, rows: std::ops::Range<usize>) -> &[u8] {
        match self {
            Source::Fp8(tensor) => &tensor.codes[rows.start * tensor.columns..rows.end * tensor.columns],
            Source::F32 { values, columns, .. } => {
                let values = &values[rows.start * columns..rows.end * columns];
                // SAFETY: f32 has no padding and u8 has alignment 1; same memory, 4 bytes per value.
                unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
            }
        }
    }
}

/// How a tensor is quantized.
#[derive(Debug, Clone, Copy)]
pub struct Int4Settings {
    pub group_size: usize,
    pub rule: ScaleRule,
    pub search: MseSearch,
    /// Fill the output buffers with 0xA5 bytes before the first launch, so an element a kernel skips cannot pass as
    /// a value left by an earlier tensor (the self-test; the quantize command skips the extra copy).
    pub poison_outputs: bool,
}

/// The `rule` launch parameter of the INT4 kernels (`squeeze::ScaleRule` in kernels/common.cuh).
pub(super) fn rule_code(rule: ScaleRule) -> i32 {
    match rule {
        ScaleRule::CtMinmax => 0,
        ScaleRule::Absmax7 => 1,
        ScaleRule::Mse => 2,
    }
}

/// The `mse` search as the kernels take it: steps tried, grid, norm (steps computed as src/quant/int4.rs does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct MseParams {
    pub steps: i32,
    pub grid: i32,
    pub norm: f32,
}

impl From<MseSearch> for MseParams {
    fn from(search: MseSearch) -> Self {
        Self { steps: (search.max_shrink * search.grid as f32) as i32, grid: search.grid as i32, norm: search.norm }
    }
}

/// The kernel name for a source and group size, e.g. `int4_quantize_fp8_g32`: `g32`/`g64` keep the group in
/// registers, `gany` re-reads.
fn int4_kernel(fp8: bool, group_size: usize) -> String {
    let variant = match group_size {
        32 => "g32",
        64 => "g64",
        _ => "gany",
    };
    format!("int4_quantize_{}_{variant}", if fp8 { "fp8" } else { "f32" })
}

/// Checks what the INT4 kernels assume: `group_size % 8 == 0` (whole words per group) and whole groups per row.
pub fn check_int4_shape(tensor: &str, columns: usize, group_size: usize) -> Result<(), CudaError> {
    if group_size == 0 || !group_size.is_multiple_of(8) {
        return Err(unsupported(
            tensor,
            format!("group size {group_size} is not a multiple of 8; the GPU kernels pack whole words per group"),
        ));
    }
    if !columns.is_multiple_of(group_size) {
        return Err(unsupported(tensor, format!("{columns} columns are not a whole number of groups of {group_size}")));
    }
    Ok(())
}

/// Blocks needed for `items` threads.
fn blocks_for(items: usize) -> u32 {
    items.div_ceil(THREADS_PER_BLOCK as usize).max(1) as u32
}

/// Device-resident INT4 kernel operands: `rows` rows of input from absolute row `first_row` (FP8 block scales of
/// the whole tensor alongside), outputs for those rows.
pub struct Int4Buffers<'a> {
    pub input: &'a DeviceBuffer,
    /// The whole tensor's FP8 block scales with the grid's block rows and columns; `None` for an f32 input.
    pub block_scales: Option<(&'a DeviceBuffer, usize, usize)>,
    pub packed: &'a DeviceBuffer,
    pub scales: &'a DeviceBuffer,
}

/// Launches one INT4 kernel over device-resident buffers (no copies): `rows` rows of `columns` from `first_row`.
pub fn launch_int4(
    device: &dyn Device,
    buffers: &Int4Buffers<'_>,
    rows: usize,
    columns: usize,
    first_row: usize,
    settings: &Int4Settings,
) -> Result<(), CudaError> {
    let group_size = settings.group_size;
    let kernel = int4_kernel(buffers.block_scales.is_some(), group_size);
    let groups = rows * columns / group_size;
    let (rows, columns, first_row) = (rows as i64, columns as i64, first_row as i64);
    let mse = MseParams::from(settings.search);
    let mut args = vec![Arg::Buffer(buffers.input)];
    match buffers.block_scales {
        Some((block_scales, block_rows, block_columns)) => {
            args.extend([Arg::Buffer(block_scales), Arg::Buffer(buffers.packed), Arg::Buffer(buffers.scales)]);
            args.extend([Arg::I64(rows), Arg::I64(columns), Arg::I64(first_row), Arg::I32(group_size as i32)]);
            args.extend([Arg::I32(block_rows as i32), Arg::I32(block_columns as i32)]);
        }
        None => {
            args.extend([Arg::Buffer(buffers.packed), Arg::Buffer(buffers.scales)]);
            args.extend([Arg::I64(rows), Arg::I64(columns), Arg::I32(group_size as i32)]);
        }
    }
    args.extend([Arg::I32(rule_code(settings.rule)), Arg::I32(mse.steps), Arg::I32(mse.grid), Arg::F32(mse.norm)]);
    device.launch(&kernel, LaunchShape::linear(blocks_for(groups), THREADS_PER_BLOCK), &args)
}

/// Quantizes `source` on `device`, chunk by chunk (each chunk's input written, its kernel launched, its outputs read).
pub fn quantize_int4(
    device: &dyn Device,
    source: &Source<'_>,
    settings: &Int4Settings,
) -> Result<Int4Output, CudaError> {
    let group_size = settings.group_size;
    let (rows, columns) = source.shape();
    check_int4_shape(source.name(), columns, group_size)?;
    let mut output = Int4Output { packed: vec![0; rows * columns / 8], scales: vec![0; rows * columns / group_size] };
    if rows * columns == 0 {
        return Ok(output);
    }
    let element_bytes = source.element_bytes();
    let rows_per_chunk = (CHUNK_BYTES / (columns * element_bytes)).clamp(1, rows);
    let (words, groups) = (rows_per_chunk * columns / 8, rows_per_chunk * columns / group_size);
    let input = device.alloc(rows_per_chunk * columns * element_bytes)?;
    let (packed, scales) = (device.alloc_for::<u32>(words)?, device.alloc_for::<u16>(groups)?);
    if settings.poison_outputs {
        device.write(&packed, &vec![0xA5; words * 4])?;
        device.write(&scales, &vec![0xA5; groups * 2])?;
    }
    // The block scales of the whole tensor, once, before any chunk runs.
    let block_scales = match source {
        Source::Fp8(tensor) => Some((device.upload(tensor.block_scales)?, tensor.block_rows, tensor.block_columns)),
        Source::F32 { .. } => None,
    };
    let buffers = Int4Buffers {
        input: &input,
        block_scales: block_scales
            .as_ref()
            .map(|(buffer, block_rows, block_columns)| (buffer, *block_rows, *block_columns)),
        packed: &packed,
        scales: &scales,
    };
    for first_row in (0..rows).step_by(rows_per_chunk) {
        let chunk_rows = rows_per_chunk.min(rows - first_row);
        device.write(&input, source.bytes(first_row..first_row + chunk_rows))?;
        launch_int4(device, &buffers, chunk_rows, columns, first_row, settings)?;
        let (word, word_count) = (first_row * columns / 8, chunk_rows * columns / 8);
        let (scale, scale_count) = (first_row * columns / group_size, chunk_rows * columns / group_size);
        output.packed[word..word + word_count].copy_from_slice(&device.download::<u32>(&packed, word_count)?);
        output.scales[scale..scale + scale_count].copy_from_slice(&device.download::<u16>(&scales, scale_count)?);
    }
    Ok(output)
}

/// Dequantizes a block-scaled FP8 tensor to f32 (`bf16 = false`, 4 bytes per element, little-endian) or BF16 bits
/// (2 bytes). `tensor.codes` may be a slice of whole rows starting at row `first_row` of the block grid (its block
/// scales whole). The output is poisoned first, so an element the kernel skips cannot pass as a value.
pub fn dequantize_fp8(
    device: &dyn Device,
    tensor: &Fp8Tensor<'_>,
    first_row: usize,
    bf16: bool,
) -> Result<Vec<u8>, CudaError> {
    let elements = tensor.rows * tensor.columns;
    let codes = device.upload(tensor.codes)?;
    let scales = device.upload(tensor.block_scales)?;
    let out_bytes = elements * if bf16 { 2 } else { 4 };
    let out = device.alloc(out_bytes)?;
    device.write(&out, &vec![0xA5; out_bytes])?;
    let on_device = Fp8OnDevice {
        codes: &codes,
        scales: &scales,
        rows: tensor.rows,
        columns: tensor.columns,
        first_row,
        block: [tensor.block_rows, tensor.block_columns],
    };
    fp8::dequantize(device, &on_device, &out, bf16)?;
    device.download::<u8>(&out, out_bytes)
}
