//! The one check of a checkpoint against its `config.json`, for every command that reads one: the runtime before
//! it reads a layer ([`describe`], through `crate::load::open`), `quantize` and `report` on their source and
//! `verify --source` ([`check_source`]), and `verify` on any folder ([`mismatches`]).
//!
//! Every tensor the architecture needs for the configured layers is present with the configured shape (as a
//! plain/FP8 `weight` or as an INT4 `weight_packed` whose `weight_shape` says it), no decoder layer holds
//! multi-token-prediction tensors, and no layer lies beyond the configured ones — so a config edited to disagree
//! with the weights fails with the tensor named instead of running the wrong network. GLM-5.2's `shared` DSA layers
//! need no indexer tensors; where a checkpoint still ships them they are carried and not run, as vLLM's and SGLang's
//! loaders drop them.

use std::collections::BTreeSet;

use crate::format::compressed_tensors::{packed_name, read_shape, shape_name};
use crate::io::dtype::Dtype;
use crate::io::{Checkpoint, IoError};
use crate::model::ModelConfig;
use crate::model::{tensor_specs, TensorRole};

/// Problems listed in one error before "and N more".
const SHOWN: usize = 5;

/// The problems found, empty when the checkpoint matches the config.
pub fn mismatches(checkpoint: &Checkpoint, config: &ModelConfig) -> Vec<String> {
    let mut problems = Vec::new();
    problems.extend(kda_layers_disagree(checkpoint, config));
    problems.extend(hyper_streams_disagree(checkpoint, config));
    let specs = tensor_specs(config);
    let shape_names: Vec<String> =
        specs.iter().map(|spec| shape_name(spec.name.strip_suffix(".weight").unwrap_or(&spec.name))).collect();
    checkpoint.will_need(shape_names.iter().map(String::as_str));
    for spec in specs {
        if layer_of(&spec.name).is_some_and(|layer| layer >= config.num_hidden_layers) {
            continue; // MTP layers are carried, not run: vendors differ in what they hold.
        }
        let module = spec.name.strip_suffix(".weight").unwrap_or(&spec.name);
        let stored = match checkpoint.get(&spec.name) {
            // DeepSeek's MXFP4 experts: `weight` holds two codes per byte (F4 counts them one by one).
            Some(tensor) if spec.role == TensorRole::ExpertMxfp4 && tensor.dtype != Dtype::F4 => match tensor.shape {
                [rows, half] => Some(vec![*rows, 2 * half]),
                other => Some(other.to_vec()),
            },
            Some(tensor) => Some(tensor.shape.to_vec()),
            None => packed_shape(checkpoint, module),
        };
        match stored {
            None => problems.push(format!("`{}` is missing", spec.name)),
            Some(shape) if shape != spec.shape => {
                problems.push(format!("`{}` has shape {shape:?}, the config implies {:?}", spec.name, spec.shape))
            }
            Some(_) => {}
        }
    }
    let mut beyond = BTreeSet::new();
    for name in checkpoint.names_in_file_order() {
        match layer_of(name) {
            Some(layer) if layer >= config.stored_layers() => {
                beyond.insert(layer);
            }
            Some(layer) if layer < config.num_hidden_layers && name.ends_with(".eh_proj.weight") => problems.push(
                format!("`{name}` is a multi-token-prediction tensor inside decoder layer {layer}: num_hidden_layers is too large"),
            ),
            _ => {}
        }
    }
    if let Some(first) = beyond.first() {
        let more = if beyond.len() > 1 { format!(" and {} more", beyond.len() - 1) } else { String::new() };
        problems.push(format!(
            "the weights hold layer {first}{more}, beyond num_hidden_layers {} + num_nextn_predict_layers {}",
            config.num_hidden_layers, config.num_nextn_predict_layers
        ));
    }
    problems
}

/// Where the tensors put KDA layers (their `q_conv1d`) against where the config's lists do, as one problem naming
/// both and the lists that would match (a list off by one is refused earlier, by the config's parse, with the
/// 1-indexed hint); `None` when they agree or the model has no KDA layers.
fn kda_layers_disagree(checkpoint: &Checkpoint, config: &ModelConfig) -> Option<String> {
    let kinds: Vec<bool> = (0..config.num_hidden_layers).map(|layer| config.is_kda_layer(layer)).collect();
    if !kinds.contains(&true) {
        return None;
    }
    let stored: Vec<bool> = (0..config.num_hidden_layers)
        .map(|layer| checkpoint.contains(&format!("model.layers.{layer}.self_attn.q_conv1d.weight")))
        .collect();
    if stored == kinds {
        return None;
    }
    if config.hyper_connections().is_some() {
        // GLM-5.3-Flash: the 0-indexed `layer_types` list.
        let kind = |&kda: &bool| if kda { "linear_attention" } else { "indexed_attention" };
        let at = |kinds: &[bool]| -> Vec<usize> { (0..kinds.len()).filter(|&layer| kinds[layer]).collect() };
        return Some(format!(
            "the tensors hold KDA layers (self_attn.q_conv1d) at {:?} (0-indexed), but text_config.layer_types says \
             {:?}; set layer_types {:?}",
            at(&stored),
            at(&kinds),
            stored.iter().map(kind).collect::<Vec<_>>()
        ));
    }
    let numbers =
        |kda: bool, kinds: &[bool]| -> Vec<usize> { (1..=kinds.len()).filter(|&n| kinds[n - 1] == kda).collect() };
    Some(format!(
        "the tensors hold KDA layers (self_attn.q_conv1d) at {:?} (1-indexed), but linear_attn_config.kda_layers says \
         {:?}; set kda_layers {:?} and full_attn_layers {:?}",
        numbers(true, &stored),
        numbers(true, &kinds),
        numbers(true, &stored),
        numbers(false, &stored)
    ))
}

/// The number of mHC streams the tensors hold (layer 0's `hc_attn_fn` is `[(2 + N)·N, N · hidden]`) against
/// `hc_mult`, as one problem naming both and the value that matches; `None` when they agree or the model has no mHC.
fn hyper_streams_disagree(checkpoint: &Checkpoint, config: &ModelConfig) -> Option<String> {
    let configured = config.hyper_connections()?.streams;
    let name = "model.layers.0.hc_attn_fn";
    let [rows, columns] = checkpoint.get(name)?.shape[..] else { return None };
    let stored = columns / config.hidden_size.max(1);
    if stored == configured || (2 + stored) * stored != rows || stored * config.hidden_size != columns {
        return None; // agreeing, or a shape no stream count explains (the shape check names it)
    }
    Some(format!(
        "the tensors hold {stored} mHC streams (`{name}` is [{rows}, {columns}] = [(2 + N)·N, N·hidden] with N = \
         {stored}) but text_config.hc_mult is {configured}; set hc_mult {stored}"
    ))
}

/// An error message for `mismatches`, or `None` when there are none.
pub fn describe(checkpoint: &Checkpoint, config: &ModelConfig) -> Option<String> {
    summary(checkpoint, config).map(|summary| format!("{}: {summary}", checkpoint.dir().display()))
}

/// `describe` without the folder in front (for errors that name it themselves).
pub fn summary(checkpoint: &Checkpoint, config: &ModelConfig) -> Option<String> {
    let problems = mismatches(checkpoint, config);
    if problems.is_empty() {
        return None;
    }
    let mut shown = problems.iter().take(SHOWN).cloned().collect::<Vec<_>>().join("; ");
    if problems.len() > SHOWN {
        shown.push_str(&format!("; and {} more", problems.len() - SHOWN));
    }
    Some(format!(
        "config.json disagrees with the weights: {shown}; restore the config the checkpoint was released with"
    ))
}

/// A source as `quantize` reads it (and `verify --source`): first every stored tensor the architecture names, MTP
/// layers included, has the shape the config implies and a float dtype (the first that does not is the error,
/// named with its shard), then the checks of [`mismatches`] (missing and packed tensors, layers misplaced).
pub fn check_source(checkpoint: &Checkpoint, config: &ModelConfig) -> Result<(), IoError> {
    for spec in tensor_specs(config) {
        // MXFP4 experts are checked as modules (format/mxfp4_source.rs) when the items are grouped.
        if spec.role == TensorRole::ExpertMxfp4 {
            continue;
        }
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
        let table = spec.role == TensorRole::TokenTable && matches!(tensor.dtype, Dtype::I32 | Dtype::I64);
        if !float && !table {
            return Err(IoError::tensor(
                shard,
                &spec.name,
                format!("has dtype {} but a {:?} tensor must be a float type", tensor.dtype, spec.role),
            ));
        }
    }
    match summary(checkpoint, config) {
        Some(problem) => Err(IoError::folder(checkpoint.dir(), problem)),
        None => Ok(()),
    }
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()
}

/// `[out, in]` of a packed module: an INT4 one's from its `weight_shape`, an FP4 one's (U8, two codes per byte)
/// from its `weight_packed` (empty when unreadable: it then matches no shape).
fn packed_shape(checkpoint: &Checkpoint, module: &str) -> Option<Vec<usize>> {
    let packed = checkpoint.get(&packed_name(module))?;
    if packed.dtype == Dtype::U8 {
        return Some(match packed.shape {
            [rows, half] => vec![*rows, 2 * half],
            _ => Vec::new(),
        });
    }
    let shape = checkpoint.get(&shape_name(module))?;
    Some(read_shape(&shape).map(Vec::from).unwrap_or_default())
}
