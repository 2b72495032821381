//! `squeeze inspect`: what a checkpoint holds: architecture, layer and expert counts, dtype histogram,
//! quantization config, bytes by tensor class.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::io::dtype::tensor_bytes;
use crate::io::{Checkpoint, IoError};
use crate::model::{ModelConfig, TensorClass};

#[derive(Debug, Clone, Serialize)]
pub struct InspectReport {
    pub path: String,
    pub model_type: Option<String>,
    pub architecture: Option<String>,
    /// The vision-language wrapper around the text model (Kimi K2.6's `KimiK25ForConditionalGeneration`), if any;
    /// its vision tower and projector are counted as the class `vision`.
    pub wrapper: Option<crate::io::composite::Wrapper>,
    pub layers: Option<usize>,
    pub mtp_layers: Option<usize>,
    pub routed_experts: Option<usize>,
    pub experts_per_token: Option<usize>,
    pub shards: usize,
    pub tensors: usize,
    pub file_bytes: u64,
    pub dtypes: BTreeMap<String, DtypeCount>,
    pub classes: BTreeMap<String, ClassBytes>,
    pub quantization_config: Option<Value>,
    /// Why the config could not be read as a known architecture, if it could not.
    pub config_problem: Option<String>,
    /// Malformed quantized modules (a `weight_packed` whose shape disagrees with its `weight_shape`, …), one per
    /// module, naming the tensor: the checkpoint cannot be loaded as it is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct DtypeCount {
    pub tensors: usize,
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassBytes {
    pub tensors: usize,
    pub bytes: u64,
}

pub fn inspect(dir: &Path) -> Result<InspectReport, IoError> {
    let checkpoint = Checkpoint::open(dir)?;
    let raw = checkpoint.config();
    let parsed = raw.map(ModelConfig::from_json);
    let config = parsed.as_ref().and_then(|p| p.as_ref().ok());
    let mut dtypes: BTreeMap<String, DtypeCount> = BTreeMap::new();
    let mut classes: BTreeMap<String, ClassBytes> = BTreeMap::new();
    for shard in checkpoint.shards() {
        for (name, entry) in shard.entries() {
            let bytes = tensor_bytes(entry.dtype, &entry.shape);
            let dtype = dtypes.entry(entry.dtype.to_string()).or_default();
            dtype.tensors += 1;
            dtype.bytes += bytes;
            let class = classes
                .entry(TensorClass::of(name, config.map(|c| c.num_hidden_layers)).name().to_string())
                .or_default();
            class.tensors += 1;
            class.bytes += bytes;
        }
    }
    Ok(InspectReport {
        path: dir.display().to_string(),
        model_type: raw.and_then(|c| c.get("model_type")).and_then(Value::as_str).map(String::from),
        architecture: config.map(|c| c.architecture.name().to_string()),
        wrapper: raw.and_then(crate::io::composite::wrapper),
        layers: config.map(|c| c.num_hidden_layers),
        mtp_layers: config.map(|c| c.num_nextn_predict_layers),
        routed_experts: config.map(|c| c.n_routed_experts),
        experts_per_token: config.map(|c| c.num_experts_per_tok),
        shards: checkpoint.shards().len(),
        tensors: checkpoint.tensor_count(),
        file_bytes: checkpoint.shard_bytes(),
        dtypes,
        classes,
        quantization_config: raw.and_then(crate::io::composite::quantization_config).cloned(),
        config_problem: match parsed {
            Some(Err(error)) => Some(format!("config.json: {error}")),
            None => Some("no config.json".into()),
            Some(Ok(_)) => None,
        },
        problems: crate::format::compressed_tensors::layout_problems(&checkpoint),
    })
}
