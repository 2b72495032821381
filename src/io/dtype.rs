//! Element types the checkpoints use, their byte sizes and safetensors names: the single source of truth for
//! tensor byte counts, used by the writer, the planner and `report` alike.

pub use safetensors::Dtype;

/// Bytes of one element of `dtype` (all dtypes squeeze writes are whole bytes).
pub fn element_bytes(dtype: Dtype) -> usize {
    dtype.bitsize() / 8
}

/// Number of elements of a shape.
pub fn element_count(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Bytes of a tensor of `dtype` and `shape`.
pub fn tensor_bytes(dtype: Dtype, shape: &[usize]) -> u64 {
    (element_count(shape) * element_bytes(dtype)) as u64
}

/// The safetensors name of a dtype (`"F8_E4M3"`, `"BF16"`, ...).
pub fn dtype_name(dtype: Dtype) -> String {
    dtype.to_string()
}
