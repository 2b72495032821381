//! MXFP4 modules as the FP4-native releases ship them, read exactly: E2M1 codes two per byte (the even element in
//! the low nibble) with one E8M0 power-of-two scale per 32 (2^(e − 127); the byte 255 is NaN and refused).
//!
//! Two namings of the same bytes:
//! - compressed-tensors `mxfp4-pack-quantized` (Kimi K3, `…block_sparse_moe.experts.E.w{1,2,3}`):
//!   `weight_packed` U8 `[out, in/2]`, `weight_scale` U8 (or F8_E8M0) `[out, in/32]`;
//! - DeepSeek's own (DeepSeek-V4 `layers.N.ffn.experts.E.w{1,2,3}`, `inference/model.py` `Linear` with
//!   `float4_e2m1fn_x2`): `weight` I8 or U8 `[out, in/2]` (or F4 `[out, in]`, the safetensors header counting 4-bit
//!   elements), `scale` F8_E8M0 (or U8) `[out, in/32]`. vLLM's DeepSeek-V4 loader views both as raw bytes
//!   (`vllm/models/deepseek_v4/nvidia/model.py`, `load_weights`).
//!
//! The item is named `<module>.weight` and has the weight's logical `[out, in]` shape.

use crate::io::dtype::Dtype;
use crate::io::{Checkpoint, IoError};
use crate::quant::fp4::MXFP4_GROUP;

/// How an MXFP4 module's two tensors are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mxfp4Naming {
    /// `weight_packed` + `weight_scale` (compressed-tensors).
    CompressedTensors,
    /// `weight` + `scale` (DeepSeek).
    Deepseek,
}

impl Mxfp4Naming {
    /// The codes' and the scales' tensor names of `module`.
    pub fn stored_names(self, module: &str) -> [String; 2] {
        match self {
            Mxfp4Naming::CompressedTensors => [format!("{module}.weight_packed"), format!("{module}.weight_scale")],
            Mxfp4Naming::Deepseek => [format!("{module}.weight"), format!("{module}.scale")],
        }
    }
}

/// E8M0's NaN byte.
pub const E8M0_NAN: u8 = 255;

/// Whether a tensor of `dtype` can hold E8M0 bytes.
pub fn is_e8m0(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F8_E8M0 | Dtype::U8)
}

/// The `[out, in]` shape of an MXFP4 module stored as `naming`, its conventions checked: packed codes of a 2-D
/// weight whose row length is a multiple of 32, one E8M0 scale per 32. Errors name the tensor and say what is wrong.
pub fn mxfp4_shape(checkpoint: &Checkpoint, module: &str, naming: Mxfp4Naming) -> Result<[usize; 2], IoError> {
    let [packed_name, scale_name] = naming.stored_names(module);
    let shard = |name: &str| {
        checkpoint.shard_of(name).map(|s| s.path().to_path_buf()).unwrap_or_else(|| checkpoint.dir().to_path_buf())
    };
    let packed = checkpoint
        .get(&packed_name)
        .ok_or_else(|| IoError::tensor(shard(&packed_name), &packed_name, "is missing from the checkpoint"))?;
    let [rows, stored_columns] = packed.shape[..] else {
        return Err(IoError::tensor(
            shard(&packed_name),
            &packed_name,
            format!("is packed E2M1 of shape {:?}; an MXFP4 weight is 2-D", packed.shape),
        ));
    };
    let columns = match packed.dtype {
        Dtype::F4 if stored_columns % 2 == 1 => {
            return Err(IoError::tensor(
                shard(&packed_name),
                &packed_name,
                format!(
                    "is F4 with an odd row length {stored_columns}: two E2M1 codes share a byte, so a row must \
                     hold an even count; the file is damaged or not an MXFP4 weight"
                ),
            ))
        }
        Dtype::F4 => stored_columns,
        Dtype::U8 | Dtype::I8 => stored_columns * 2,
        other => {
            return Err(IoError::tensor(
                shard(&packed_name),
                &packed_name,
                format!("is {other}; packed E2M1 codes are U8, I8 or F4"),
            ))
        }
    };
    if columns % MXFP4_GROUP != 0 {
        return Err(IoError::tensor(
            shard(&packed_name),
            &packed_name,
            format!("holds rows of {columns} E2M1 codes, not a multiple of MXFP4's group of {MXFP4_GROUP}"),
        ));
    }
    let scale = checkpoint.get(&scale_name).ok_or_else(|| {
        IoError::tensor(
            shard(&packed_name),
            &packed_name,
            format!("is packed E2M1 but its E8M0 scale `{scale_name}` is missing; the checkpoint is incomplete"),
        )
    })?;
    let expected = [rows, columns / MXFP4_GROUP];
    if !is_e8m0(scale.dtype) || scale.shape != expected {
        return Err(IoError::tensor(
            shard(&scale_name),
            &scale_name,
            format!(
                "is {} {:?}; the E8M0 scales of a [{rows}, {columns}] MXFP4 weight are F8_E8M0 or U8 {expected:?} \
                 (one per {MXFP4_GROUP} codes): the scales do not belong to this weight, or it is not MXFP4",
                scale.dtype, scale.shape
            ),
        ));
    }
    Ok([rows, columns])
}

/// The first E8M0 NaN byte (255) of `exponents`, as `(row, group)` of a tensor with `groups_per_row` groups.
pub fn first_nan_exponent(exponents: &[u8], groups_per_row: usize) -> Option<(usize, usize)> {
    let index = exponents.iter().position(|&e| e == E8M0_NAN)?;
    Some((index / groups_per_row.max(1), index % groups_per_row.max(1)))
}

/// The error for an E8M0 NaN byte in `scale_name` at `(row, group)`.
pub fn nan_exponent_error(checkpoint: &Checkpoint, scale_name: &str, (row, group): (usize, usize)) -> IoError {
    let shard = checkpoint.shard_of(scale_name).map(|s| s.path().to_path_buf()).unwrap_or_default();
    IoError::tensor(
        shard,
        scale_name,
        format!(
            "row {row}, group {group}: E8M0 byte 255 is NaN, which no weight can be scaled by; the checkpoint is \
             corrupt: download that shard again"
        ),
    )
}
