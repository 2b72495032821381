//! Kernel selection and launch parameters for kernels/*.cu, shared by the GPU path and the emulation tests.

use crate::quant::scale_rule::{MseSearch, ScaleRule};

use super::CudaError;

/// Threads per block of every kernel (the kernels declare `__launch_bounds__(256)`).
pub const THREADS_PER_BLOCK: u32 = 256;

/// The `rule` launch parameter of the INT4 kernels (`squeeze::ScaleRule` in kernels/common.cuh).
pub fn rule_code(rule: ScaleRule) -> i32 {
    match rule {
        ScaleRule::CtMinmax => 0,
        ScaleRule::Absmax7 => 1,
        ScaleRule::Mse => 2,
    }
}

/// The `mse` search as the kernels take it: steps tried, grid, norm (steps computed as src/quant/int4.rs does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MseParams {
    pub steps: i32,
    pub grid: i32,
    pub norm: f32,
}

impl From<MseSearch> for MseParams {
    fn from(search: MseSearch) -> Self {
        Self { steps: (search.max_shrink * search.grid as f32) as i32, grid: search.grid as i32, norm: search.norm }
    }
}

/// Which compiled variant quantizes groups of `group_size`: `g32`/`g64` keep the group in registers, `gany` re-reads.
pub fn int4_variant(group_size: usize) -> &'static str {
    match group_size {
        32 => "g32",
        64 => "g64",
        _ => "gany",
    }
}

/// Where an INT4 kernel's values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int4Source {
    /// Block-scaled FP8 codes with f32 block scales.
    Fp8,
    /// f32 values.
    F32,
}

/// The kernel name for a source and group size, e.g. `int4_quantize_fp8_g32`.
pub fn int4_kernel(source: Int4Source, group_size: usize) -> String {
    let source = match source {
        Int4Source::Fp8 => "fp8",
        Int4Source::F32 => "f32",
    };
    format!("int4_quantize_{source}_{}", int4_variant(group_size))
}

/// Every kernel the embedded module must export.
pub const KERNELS: [&str; 8] = [
    "fp8_block_dequant_f32",
    "fp8_block_dequant_bf16",
    "int4_quantize_fp8_g32",
    "int4_quantize_fp8_g64",
    "int4_quantize_fp8_gany",
    "int4_quantize_f32_g32",
    "int4_quantize_f32_g64",
    "int4_quantize_f32_gany",
];

/// Checks what the INT4 kernels assume: `group_size % 8 == 0` (whole words per group) and whole groups per row.
pub fn check_int4_shape(tensor: &str, columns: usize, group_size: usize) -> Result<(), CudaError> {
    if group_size == 0 || !group_size.is_multiple_of(8) {
        return Err(CudaError::Unsupported {
            tensor: tensor.to_string(),
            problem: format!(
                "group size {group_size} is not a multiple of 8; the GPU kernels pack whole words per group"
            ),
        });
    }
    if !columns.is_multiple_of(group_size) {
        return Err(CudaError::Unsupported {
            tensor: tensor.to_string(),
            problem: format!("{columns} columns are not a whole number of groups of {group_size}"),
        });
    }
    Ok(())
}

/// Blocks needed for `items` threads.
pub fn blocks_for(items: usize) -> u32 {
    items.div_ceil(THREADS_PER_BLOCK as usize).max(1) as u32
}
