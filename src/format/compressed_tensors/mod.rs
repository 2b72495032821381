//! compressed-tensors, the format `squeeze quantize` writes: the tensor names and shapes of each quantized module
//! (this file), the `quantization_config` that declares them ([`config`]), the INT4 `pack-quantized` module
//! reader ([`int4`]) and the FP4 modules, NVFP4 and MXFP4, written and read ([`fp4`]).
//!
//! An INT4 module `<module>` is `weight_packed` I32 `[out, ceil(in/8)]` (eight offset-binary nibbles per word,
//! [`crate::quant::pack`]), `weight_scale` BF16 `[out, ceil(in/group)]` and `weight_shape` I64 `[2]` = `[out, in]`
//! (as squeeze writes it; [`int4`] also reads other writers' F16/F32 scales, zero points and `g_idx`);
//! a kept FP8 block module (`float-quantized`) is its F8_E4M3 `weight` with an F32 `weight_scale` per block.

pub mod config;
pub mod fp4;
pub mod int4;
pub mod matching;

use crate::io::dtype::Dtype;
use crate::io::writer::PlannedTensor;
use crate::io::Checkpoint;
use crate::quant::pack::packed_columns;

pub use config::{
    int4_args, int4_group_size, is_w4a8_activations, quantization_config, Fp4Group, Int4Args, Int4Group,
    QuantizationScheme,
};
pub use fp4::{fp4_modules, fp4_tensors, fused_partner, Fp4Kind, Fp4Layout, Fp4Module};
pub use int4::{
    check_int4_conventions, check_int4_layout, g_idx_name, read_shape, zero_point_name, Int4Layout, Int4Module,
};

/// `<module>.weight_packed`.
pub fn packed_name(module: &str) -> String {
    format!("{module}.weight_packed")
}

/// `<module>.weight_scale`.
pub fn scale_name(module: &str) -> String {
    format!("{module}.weight_scale")
}

/// `<module>.weight_shape`.
pub fn shape_name(module: &str) -> String {
    format!("{module}.weight_shape")
}

/// The INT4 modules of a checkpoint (those with an I32 `weight_packed`; FP4's are U8, [`fp4_modules`]), in file
/// order, by the text model's names.
pub fn int4_modules(checkpoint: &Checkpoint) -> Vec<String> {
    checkpoint
        .names_in_file_order()
        .into_iter()
        .filter(|name| checkpoint.get(name).is_none_or(|tensor| tensor.dtype != Dtype::U8))
        .filter_map(|name| name.strip_suffix(".weight_packed").map(|module| checkpoint.text_name(module)))
        .collect()
}

/// Every INT4 and FP4 module of a checkpoint checked for its layout ([`check_int4_layout`], [`Fp4Layout::read`]):
/// tensors present, dtypes and shapes agreeing, from the headers alone. One problem per malformed module, naming
/// the tensor; `squeeze verify` also reads every scale and weight.
pub fn layout_problems(checkpoint: &Checkpoint) -> Vec<String> {
    let modules = int4_modules(checkpoint);
    let args = match int4_args(checkpoint.config()) {
        Ok(args) => args,
        Err(problem) if !modules.is_empty() => return vec![problem],
        Err(_) => None,
    };
    let int4 = modules.into_iter().filter_map(|module| check_int4_layout(checkpoint, &module, args.as_ref()).err());
    let fp4 = fp4_modules(checkpoint).into_iter().filter_map(|module| Fp4Layout::read(checkpoint, &module).err());
    int4.chain(fp4).collect()
}

/// The three tensors of INT4 module `module` of a `[rows, columns]` weight quantized in groups of `group_size`.
pub fn int4_tensors(module: &str, rows: usize, columns: usize, group_size: usize) -> Vec<PlannedTensor> {
    vec![
        PlannedTensor::new(packed_name(module), Dtype::I32, vec![rows, packed_columns(columns)]),
        PlannedTensor::new(scale_name(module), Dtype::BF16, vec![rows, columns.div_ceil(group_size)]),
        PlannedTensor::new(shape_name(module), Dtype::I64, vec![2]),
    ]
}

/// The two tensors of a kept FP8 block weight `weight` (module `module`): the codes as stored and the F32 block
/// scales under the compressed-tensors name.
pub fn fp8_block_tensors(weight: &str, module: &str, shape: &[usize], scale_shape: [usize; 2]) -> Vec<PlannedTensor> {
    vec![
        PlannedTensor::new(weight, Dtype::F8_E4M3, shape.to_vec()),
        PlannedTensor::new(scale_name(module), Dtype::F32, scale_shape.to_vec()),
    ]
}
