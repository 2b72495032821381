//! `squeeze synth`: a tiny random checkpoint of a real architecture, in the vendor's FP8 format, with the real
//! tensor names, config keys and a working tokenizer. Tests and the demo stand on it.

mod config;
mod random;
mod tokenizer;

use std::fs;
use std::path::PathBuf;

use rayon::prelude::*;
use serde::Serialize;

use crate::format::compressed_tensors::int4_tensors;
use crate::format::mxfp4_source::Mxfp4Naming;
use crate::io::atomic::write_json;
use crate::io::checkpoint::INDEX_FILE;
use crate::io::composite::{stored_name, NameStyle};
use crate::io::dtype::Dtype;
use crate::io::writer::{PlannedTensor, ShardWriter};
use crate::io::IoError;
use crate::model::{tensor_specs, ModelConfig, TensorClass, TensorRole};
use crate::quant::fp4::{self, MXFP4_GROUP};
use crate::quant::fp8_block::{quantize_matrix, quantize_matrix_e8m0, BlockGrid};
use crate::quant::{int4, pack, ScaleRule};
use half::bf16;

pub use config::{SynthArch, SynthSize};

#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub arch: SynthArch,
    pub size: SynthSize,
    pub shards: usize,
    pub seed: u64,
    pub out: PathBuf,
    pub force: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct SynthReport {
    pub out: PathBuf,
    pub architecture: String,
    pub tensors: usize,
    pub parameters: u64,
    pub bytes: u64,
    pub shards: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("{0}")]
    Invalid(String),
}

/// How a release stores what `tensor_specs` lists.
struct Release {
    /// Inside a vision-language wrapper (`language_model.` names, a vision tower carried).
    wrapped: bool,
    /// How the text model's tensors are named.
    style: NameStyle,
    /// The center of mHC's `scale` values: GLM-5.3-Flash's multiply its projection as trained ones do (about 1),
    /// so the mixing varies per token.
    hc_scale_center: f32,
    fp8_scales: Fp8Scales,
    /// How MXFP4 experts are named (`ExpertMxfp4` specs).
    mxfp4: Mxfp4Naming,
    /// Routed experts per MoE layer (the ids a hash router's table may hold).
    experts: usize,
}

/// The scales of FP8 linears.
#[derive(Clone, Copy, PartialEq)]
enum Fp8Scales {
    /// F32 multipliers under `<module>.<suffix>` (`weight_scale_inv`, or compressed-tensors' `weight_scale`).
    F32(&'static str),
    /// DeepSeek-V4's E8M0 powers of two under `<module>.scale`.
    E8m0,
}

impl Release {
    fn of(arch: SynthArch, experts: usize) -> Self {
        let style = match arch {
            SynthArch::KimiK26 | SynthArch::KimiK3 => NameStyle::Moonshot,
            SynthArch::Glm53Flash => NameStyle::Transformers,
            _ => NameStyle::Plain,
        };
        let (wrapped, fp8_scales, mxfp4) = match arch {
            SynthArch::Glm45 => (false, Fp8Scales::F32("weight_scale"), Mxfp4Naming::CompressedTensors),
            SynthArch::KimiK26 | SynthArch::KimiK3 => {
                (true, Fp8Scales::F32("weight_scale_inv"), Mxfp4Naming::CompressedTensors)
            }
            SynthArch::DeepseekV4 => (false, Fp8Scales::E8m0, Mxfp4Naming::Deepseek),
            _ => (false, Fp8Scales::F32("weight_scale_inv"), Mxfp4Naming::CompressedTensors),
        };
        let hc_scale_center = if arch == SynthArch::Glm53Flash { 1.0 } else { 0.0 };
        Self { wrapped, style, hc_scale_center, fp8_scales, mxfp4, experts }
    }
}

/// Writes the synthetic checkpoint.
pub fn synth(options: &SynthOptions) -> Result<SynthReport, SynthError> {
    let out = &options.out;
    if out.exists() && fs::read_dir(out).map_err(|e| IoError::file(out, e))?.next().is_some() && !options.force {
        return Err(SynthError::Invalid(format!(
            "{}: is not empty; choose a new folder or pass --force",
            out.display()
        )));
    }
    if options.shards == 0 {
        return Err(SynthError::Invalid("--shards must be at least 1".into()));
    }
    if options.size.vocab < 258 {
        return Err(SynthError::Invalid(
            "--vocab must be at least 258 (256 bytes + 2 special tokens of the synthetic tokenizer)".into(),
        ));
    }
    if options.size.release_heads && options.arch != SynthArch::DeepseekV4 {
        return Err(SynthError::Invalid("--release-heads applies to --arch deepseek-v4 only".into()));
    }
    fs::create_dir_all(out).map_err(|e| IoError::file(out, e))?;
    let config_json = config::config_json(options.arch, &options.size);
    let config = ModelConfig::from_json(&config_json).map_err(|e| SynthError::Invalid(format!("config.json: {e}")))?;
    let release = Release::of(options.arch, config.n_routed_experts);
    let native_int4 = options.arch == SynthArch::KimiK26;
    let style = release.style;

    // Lay out every stored tensor (FP8 weights followed by their scales; natively INT4 releases: routed experts
    // as their three INT4 tensors, other linears BF16, then the vision tower) and split into shards by bytes.
    let mut specs = tensor_specs(&config);
    for spec in &mut specs {
        spec.name = stored_name(&spec.name, style);
        if native_int4
            && spec.role == TensorRole::Linear
            && TensorClass::of(&spec.name, None) != TensorClass::RoutedExperts
        {
            spec.role = TensorRole::LinearBf16;
        }
    }
    if release.wrapped {
        for (name, shape) in config::VISION.tensors(config.hidden_size) {
            let role = if shape.len() == 1 { TensorRole::Norm } else { TensorRole::Embedding };
            specs.push(crate::model::TensorSpec { name, shape, role });
        }
    }
    let layout = stored_tensors(&specs, &release, native_int4);
    let total: u64 = layout.iter().map(|(_, t)| t.bytes()).sum();
    let shard_of = shard_assignment(&layout, total, options.shards);
    let shard_count = shard_of.last().map(|s| s + 1).unwrap_or(1);
    let file_name = |shard: usize| format!("model-{:05}-of-{:05}.safetensors", shard + 1, shard_count);

    let mut weight_map = serde_json::Map::new();
    for shard in 0..shard_count {
        let members: Vec<usize> = (0..layout.len()).filter(|&i| shard_of[i] == shard).collect();
        let tensors: Vec<PlannedTensor> = members.iter().map(|&i| layout[i].1.clone()).collect();
        let mut writer = ShardWriter::create(&out.join(file_name(shard)), tensors.clone())?;
        // Generate a spec's tensors together (an FP8 weight and its scale come from one draw), in parallel batches.
        let spec_indices: Vec<usize> = {
            let mut list: Vec<usize> = members.iter().map(|&i| layout[i].0).collect();
            list.dedup();
            list
        };
        let mut next = 0;
        for batch in spec_indices.chunks(16) {
            let generated: Vec<Vec<Vec<u8>>> =
                batch.par_iter().map(|&s| generate(&specs[s], options.seed, &release, native_int4)).collect();
            for pieces in generated {
                for bytes in pieces {
                    let name = tensors[next].name.clone();
                    next += 1;
                    writer.write_tensor(&name, &bytes)?;
                    weight_map.insert(name, file_name(shard).into());
                }
            }
        }
        writer.finish()?;
    }
    write_json(
        &out.join(INDEX_FILE),
        &serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map }),
    )?;
    write_json(&out.join("config.json"), &config_json)?;
    write_json(
        &out.join("generation_config.json"),
        &serde_json::json!({ "bos_token_id": 0, "eos_token_id": config::EOS_ID, "do_sample": false }),
    )?;
    tokenizer::write(out, options.arch, config.vocab_size)?;
    Ok(SynthReport {
        out: out.clone(),
        architecture: config.architecture.name().into(),
        tensors: layout.len(),
        parameters: specs.iter().map(|s| s.shape.iter().product::<usize>() as u64).sum(),
        bytes: total,
        shards: shard_count,
    })
}

/// Every stored tensor of `specs` with the index of its spec, as the release stores it: FP8 weights followed by
/// their scales (F32 or E8M0), natively INT4 routed experts as their three INT4 tensors, MXFP4 experts as codes and
/// E8M0 scales, the rest in their role's dtype.
fn stored_tensors(
    specs: &[crate::model::TensorSpec],
    release: &Release,
    native_int4: bool,
) -> Vec<(usize, PlannedTensor)> {
    let mut layout: Vec<(usize, PlannedTensor)> = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        match spec.role {
            TensorRole::Linear if native_int4 => {
                let module = spec.name.trim_end_matches(".weight");
                for mut tensor in int4_tensors(module, spec.shape[0], spec.shape[1], config::KIMI_INT4_GROUP) {
                    if tensor.name.ends_with(".weight_shape") {
                        tensor = PlannedTensor::new(tensor.name, Dtype::I32, vec![2]);
                        // as Moonshot's shards store it
                    }
                    layout.push((index, tensor));
                }
            }
            TensorRole::Linear => {
                let grid = BlockGrid::new(spec.shape[0], spec.shape[1], 128, 128);
                let module = spec.name.trim_end_matches(".weight");
                layout.push((index, PlannedTensor::new(spec.name.clone(), Dtype::F8_E4M3, spec.shape.clone())));
                let (scale_name, scale_dtype) = match release.fp8_scales {
                    Fp8Scales::F32(suffix) => (format!("{module}.{suffix}"), Dtype::F32),
                    Fp8Scales::E8m0 => (format!("{module}.scale"), Dtype::F8_E8M0),
                };
                layout.push((index, PlannedTensor::new(scale_name, scale_dtype, grid.scale_shape().to_vec())));
            }
            TensorRole::ExpertMxfp4 => {
                let [rows, columns] = [spec.shape[0], spec.shape[1]];
                let module = spec.name.trim_end_matches(".weight");
                let [packed, scales] = release.mxfp4.stored_names(module);
                let (packed_dtype, scale_dtype) = match release.mxfp4 {
                    Mxfp4Naming::CompressedTensors => (Dtype::U8, Dtype::U8),
                    Mxfp4Naming::Deepseek => (Dtype::I8, Dtype::F8_E8M0),
                };
                layout.push((index, PlannedTensor::new(packed, packed_dtype, vec![rows, columns / 2])));
                layout.push((index, PlannedTensor::new(scales, scale_dtype, vec![rows, columns / MXFP4_GROUP])));
            }
            TensorRole::RouterBias | TensorRole::Float32 => {
                layout.push((index, PlannedTensor::new(spec.name.clone(), Dtype::F32, spec.shape.clone())))
            }
            TensorRole::TokenTable => {
                layout.push((index, PlannedTensor::new(spec.name.clone(), Dtype::I32, spec.shape.clone())))
            }
            _ => layout.push((index, PlannedTensor::new(spec.name.clone(), Dtype::BF16, spec.shape.clone()))),
        }
    }
    layout
}

/// The shard of each stored tensor: `shards` runs of about equal bytes (`total` in all), a scale in its weight's.
fn shard_assignment(layout: &[(usize, PlannedTensor)], total: u64, shards: usize) -> Vec<usize> {
    let per_shard = total.div_ceil(shards as u64).max(1);
    let mut shard_of = Vec::with_capacity(layout.len());
    let mut running = 0u64;
    for (index, (spec_index, tensor)) in layout.iter().enumerate() {
        // Keep a weight and its scale together: a scale follows its weight's shard.
        let shard = if index > 0 && layout[index - 1].0 == *spec_index {
            shard_of[index - 1]
        } else {
            ((running / per_shard) as usize).min(shards - 1)
        };
        running += tensor.bytes();
        shard_of.push(shard);
    }
    shard_of
}

/// The stored bytes of one spec: FP8 codes and scales for linears (`native_int4`: INT4 `weight_packed`, BF16
/// `weight_scale` with 15-level codes as quantization-aware training leaves them, I32 `weight_shape`), BF16/F32
/// otherwise.
fn generate(spec: &crate::model::TensorSpec, seed: u64, release: &Release, native_int4: bool) -> Vec<Vec<u8>> {
    let mut rng = random::Rng::for_name(seed, &spec.name);
    match spec.role {
        TensorRole::Linear if release.fp8_scales == Fp8Scales::E8m0 => {
            let (rows, columns) = (spec.shape[0], spec.shape[1]);
            let weights = random::linear_weights(&mut rng, rows, columns);
            let (codes, exponents) = quantize_matrix_e8m0(&BlockGrid::new(rows, columns, 128, 128), &weights);
            vec![codes, exponents]
        }
        TensorRole::ExpertMxfp4 => {
            // As quantization-aware training leaves them: MXFP4 of trained-looking weights.
            let (rows, columns) = (spec.shape[0], spec.shape[1]);
            let weights = random::linear_weights(&mut rng, rows, columns);
            let (mut codes, mut packed) = (vec![0u8; columns], vec![0u8; rows * columns / 2]);
            let mut exponents = vec![0u8; rows * columns / MXFP4_GROUP];
            for (row, values) in weights.chunks(columns).enumerate() {
                fp4::mxfp4_quantize_row(
                    values,
                    &mut codes,
                    &mut exponents[row * columns / MXFP4_GROUP..][..columns / MXFP4_GROUP],
                );
                fp4::pack(&codes, &mut packed[row * columns / 2..][..columns / 2]);
            }
            vec![packed, exponents]
        }
        TensorRole::Float32 => {
            let hc_scale = spec.name.contains(".hc_") && spec.name.ends_with("_scale");
            let center = if hc_scale { release.hc_scale_center } else { 0.0 };
            let values: Vec<f32> =
                (0..spec.shape.iter().product::<usize>()).map(|_| center + rng.normal() * 0.1).collect();
            vec![values.iter().flat_map(|v| v.to_le_bytes()).collect()]
        }
        TensorRole::TokenTable => {
            // Hash routing: each token's experts, distinct within a row (the width is the router's top-k).
            let (tokens, top_k) = (spec.shape[0], spec.shape[1]);
            let experts = release.experts.max(top_k).max(1);
            let ids: Vec<i32> = (0..tokens * top_k).map(|i| ((i / top_k * 7 + i % top_k) % experts) as i32).collect();
            vec![ids.iter().flat_map(|v| v.to_le_bytes()).collect()]
        }
        TensorRole::Linear if native_int4 => {
            let (rows, columns) = (spec.shape[0], spec.shape[1]);
            let weights = random::linear_weights(&mut rng, rows, columns);
            let group = config::KIMI_INT4_GROUP;
            let (words_per_row, groups_per_row) = (pack::packed_columns(columns), columns.div_ceil(group));
            let (mut words, mut scales) = (vec![0u32; rows * words_per_row], vec![bf16::ZERO; rows * groups_per_row]);
            let mut q = vec![0i8; columns];
            for (row, values) in weights.chunks(columns).enumerate() {
                let row_scales = &mut scales[row * groups_per_row..][..groups_per_row];
                int4::quantize_row(values, group, ScaleRule::Absmax7, &mut q, row_scales);
                pack::pack_row(&q, &mut words[row * words_per_row..][..words_per_row]);
            }
            let shape = [rows as i32, columns as i32];
            vec![
                words.iter().flat_map(|w| w.to_le_bytes()).collect(),
                scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
                shape.iter().flat_map(|d| d.to_le_bytes()).collect(),
            ]
        }
        TensorRole::Linear => {
            let (rows, columns) = (spec.shape[0], spec.shape[1]);
            let weights = random::linear_weights(&mut rng, rows, columns);
            let grid = BlockGrid::new(rows, columns, 128, 128);
            let (codes, scales) = quantize_matrix(&grid, &weights);
            vec![codes, scales.iter().flat_map(|s| s.to_le_bytes()).collect()]
        }
        TensorRole::RouterBias => {
            let values: Vec<f32> = (0..spec.shape[0]).map(|_| rng.normal() * 0.01).collect();
            vec![values.iter().flat_map(|v| v.to_le_bytes()).collect()]
        }
        TensorRole::Norm => {
            let is_bias = spec.name.ends_with(".bias");
            let values: Vec<f32> = (0..spec.shape[0])
                .map(|_| if is_bias { rng.normal() * 0.02 } else { 1.0 + rng.normal() * 0.05 })
                .collect();
            vec![random::to_bf16_bytes(&values)]
        }
        TensorRole::Bias => {
            let values: Vec<f32> = (0..spec.shape[0]).map(|_| rng.normal() * 0.02).collect();
            vec![random::to_bf16_bytes(&values)]
        }
        TensorRole::Embedding => {
            let values: Vec<f32> = (0..spec.shape.iter().product::<usize>()).map(|_| rng.normal() * 0.02).collect();
            vec![random::to_bf16_bytes(&values)]
        }
        TensorRole::LinearBf16 => {
            let (rows, columns) = (spec.shape[0], spec.shape[1]);
            vec![random::to_bf16_bytes(&random::linear_weights(&mut rng, rows, columns))]
        }
    }
}
