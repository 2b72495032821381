//! A weight as a device keeps it resident: the forms the CUDA backend uploads a loaded matrix in
//! ([`crate::runtime::cuda`]'s weight store), kept with the matrix so that it is freed with it.

use super::DeviceBuffer;

/// A weight as it lives on the device.
pub enum DeviceWeight {
    /// f32 `[rows, columns]`.
    Dense(DeviceBuffer),
    /// BF16 bits `[rows, columns]` of a matrix whose values are all BF16 numbers ([`Matrix::bf16_values`]: a BF16
    /// checkpoint's linear weights, the dense weights of squeeze's INT4 output): half the bytes, the same values.
    Bf16(DeviceBuffer),
    /// BF16 bits `[2, rows, columns]` of an f32 weight split in two, `W = W_hi + W_lo` (within 2⁻¹⁸ of W): a
    /// block-FP8 weight dequantized on the device (the f32 bytes, multiplied on tensor cores over many rows).
    Bf16Pair(DeviceBuffer),
    /// compressed-tensors INT4: packed words and BF16 scale bits.
    Int4 { packed: DeviceBuffer, scales: DeviceBuffer, group_size: usize },
}
