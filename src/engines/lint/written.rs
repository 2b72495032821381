//! The output description of a written folder: its `config.json` and every tensor's header, with the values the
//! rules check (INT4 and KV scales, `weight_shape`) read from the shards.

use half::{bf16, f16};
use rayon::prelude::*;
use serde_json::Value;

use super::output::{OutputDescription, TensorFacts, Values};
use crate::format::compressed_tensors::matching::module_name;
use crate::io::dtype::{integers, Dtype};
use crate::io::{Checkpoint, TensorRef};

/// Float values of a tensor, when its dtype is a float one.
fn floats(tensor: &TensorRef) -> Option<Values> {
    let bytes = tensor.bytes;
    Some(match tensor.dtype {
        Dtype::F32 => Values::floats(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        Dtype::BF16 => Values::floats(bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        Dtype::F16 => Values::floats(bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())),
        _ => return None,
    })
}

/// Integer values of a small tensor (`weight_shape`).
fn ints(tensor: &TensorRef) -> Option<Values> {
    integers(tensor.dtype, tensor.bytes).map(Values::Ints)
}

/// Describes a written checkpoint for the linter (values read in parallel: a real output's scales are tens of GB).
pub fn describe(checkpoint: &Checkpoint) -> OutputDescription {
    let tensors = checkpoint
        .names_in_file_order()
        .into_par_iter()
        .filter_map(|name| {
            let tensor = checkpoint.get(name)?;
            let values = match module_name(name).map(|(_, suffix)| suffix) {
                Some("weight_scale" | "weight_global_scale" | "input_global_scale" | "k_scale" | "v_scale") => {
                    floats(&tensor)
                }
                Some("weight_shape") if tensor.shape.iter().product::<usize>() <= 8 => ints(&tensor),
                _ if name.ends_with(".q_scale") || name.ends_with(".kv_scale") => floats(&tensor),
                _ => None,
            };
            Some(TensorFacts { name: name.to_string(), dtype: tensor.dtype, shape: tensor.shape.to_vec(), values })
        })
        .collect();
    OutputDescription { config: checkpoint.config().cloned().unwrap_or(Value::Null), tensors }
}
