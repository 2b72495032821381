//! `squeeze quantize`'s source checked against its `config.json`: the tensors the architecture names have the
//! shapes and float dtypes the config implies, and nothing the config needs is missing or misplaced (the checks the
//! runtime makes, [`crate::model::validate`]).

use crate::io::dtype::Dtype;
use crate::io::{Checkpoint, IoError};
use crate::model::{tensor_specs, ModelConfig};

/// Checks tensors whose names the architecture knows against the shapes the config implies.
pub fn check_against_config(checkpoint: &Checkpoint, config: &ModelConfig) -> Result<(), IoError> {
    for spec in tensor_specs(config) {
        let Some(tensor) = checkpoint.get(&spec.name) else { continue };
        let shard = checkpoint.shard_of(&spec.name).map(|s| s.path().to_path_buf()).unwrap_or_default();
        if tensor.shape != spec.shape.as_slice() {
            return Err(IoError::tensor(
                shard,
                &spec.name,
                format!(
                    "has shape {:?} but config.json implies {:?}; the config does not belong to these weights",
                    tensor.shape, spec.shape
                ),
            ));
        }
        let float = matches!(tensor.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32 | Dtype::F8_E4M3);
        if !float {
            return Err(IoError::tensor(
                shard,
                &spec.name,
                format!("has dtype {} but a {:?} tensor must be a float type", tensor.dtype, spec.role),
            ));
        }
    }
    match crate::model::validate::summary(checkpoint, config) {
        Some(problem) => Err(IoError::folder(checkpoint.dir(), problem)),
        None => Ok(()),
    }
}
