//! Computing one planned item's output bytes from its source: INT4 or FP4 quantize + pack, FP8 → BF16, FP8
//! passthrough, copy. Rows are processed in parallel; results are bit-identical for any thread count.

use half::bf16;
use rayon::prelude::*;

use crate::format::compressed_tensors::{fused_partner, packed_name, Fp4Kind};
use crate::format::fp8_block::{read_scales, stored_item, RowReader, SourceKind};
use crate::io::dtype::{bf16_bits, first_nonfinite};
use crate::io::{Checkpoint, IoError};
use crate::quant::scale_rule::{MseSearch, ScaleRule};
use crate::quant::{fp4, imatrix, int4, pack};
use crate::runtime::device::Device;

use super::calibration::{Calibration, ExpertRule};
use super::{Action, PlannedItem};
use crate::runtime::cuda::int4_quantize::{check_int4_shape, quantize_int4, Fp8Tensor, Int4Settings, Source};

/// Rows handed to one rayon task (keeps scheduling overhead small on short rows).
const ROWS_PER_TASK: usize = 8;

/// How items are computed.
#[derive(Clone, Copy, Default)]
pub struct Compute<'a> {
    /// INT4 items from FP8 sources are quantized on this device (a GPU or the emulated device; byte-identical
    /// output); the rest on the CPU.
    pub device: Option<&'a dyn Device>,
    /// Carry NaN/infinite source elements through instead of refusing them.
    pub allow_nonfinite: bool,
    /// `--method imatrix|gptq`: routed experts' INT4 scales from their importance (on the CPU) or their codes and
    /// scales from the GPTQ pass, or `mse` as fallback.
    pub calibration: Option<&'a Calibration>,
    /// Source tensors' largest magnitudes, kept so that NVFP4 fused partners read each other's once.
    pub absmax: Option<&'a AbsmaxCache>,
}

/// The largest magnitude of each source tensor NVFP4 has measured, by name.
#[derive(Default)]
pub struct AbsmaxCache(std::sync::Mutex<std::collections::HashMap<String, f32>>);

impl AbsmaxCache {
    /// `name`'s absmax, measured by `measure` the first time.
    fn get(&self, name: &str, measure: impl FnOnce() -> Result<f32, IoError>) -> Result<f32, IoError> {
        if let Some(&value) = self.0.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Ok(value);
        }
        let value = measure()?;
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), value);
        Ok(value)
    }
}

/// Produces the bytes of every output tensor of `item`, in planned order. A NaN or infinite source element is an
/// error naming the tensor and its first bad element, unless `compute.allow_nonfinite`.
pub fn transform(checkpoint: &Checkpoint, item: &PlannedItem, compute: Compute) -> Result<Vec<Vec<u8>>, IoError> {
    let Compute { device, allow_nonfinite, calibration, absmax: cache } = compute;
    let name = &item.source.name;
    let expert_rule = calibration.and_then(|calibration| calibration.rule_for(name));
    let stored = item.source.stored_names();
    let shard = checkpoint.shard_of(&stored[0]).map(|s| s.path().to_path_buf()).unwrap_or_default();
    let tensor = checkpoint
        .get(&stored[0])
        .ok_or_else(|| IoError::tensor(&shard, &stored[0], "disappeared from the checkpoint"))?;
    if !allow_nonfinite {
        if let Some(index) = first_nonfinite(tensor.dtype, tensor.bytes) {
            let columns = tensor.shape.last().copied().unwrap_or(1).max(1);
            return Err(IoError::tensor(
                &shard,
                name,
                format!(
                    "element {index} (row {}, column {}) is NaN or infinite; fix the source, or pass \
                     --allow-nonfinite to carry such values into the output",
                    index / columns,
                    index % columns
                ),
            ));
        }
    }
    let reader = || RowReader::new(checkpoint, &item.source);
    let device_outputs = match (device, item.action) {
        (Some(device), Action::Int4 { group_size, scale_rule, .. })
            if matches!(expert_rule, None | Some(ExpertRule::InputAbsmax(_))) =>
        {
            int4_on_device(device, checkpoint, item, tensor.bytes, &shard, group_size, scale_rule)?
        }
        _ => None,
    };
    let outputs = match item.action {
        _ if device_outputs.is_some() => device_outputs.unwrap_or_default(),
        Action::Int4 { group_size, .. } if matches!(expert_rule, Some(ExpertRule::Quantized(_))) => {
            let Some(ExpertRule::Quantized(entry)) = &expert_rule else { unreachable!("matched above") };
            let grid = (item.source.shape.first().copied(), item.source.shape.get(1).copied());
            if grid != (Some(entry.rows), Some(entry.columns)) || entry.group_size != group_size {
                return Err(IoError::tensor(
                    &shard,
                    name,
                    format!(
                        "the GPTQ pass quantized it as [{}, {}] in groups of {}, the plan wants {:?} in groups of \
                         {group_size}; rerun without --resume",
                        entry.rows, entry.columns, entry.group_size, item.source.shape
                    ),
                ));
            }
            let (packed, scales) = entry.read()?;
            let shape: Vec<u8> =
                [entry.rows as i64, entry.columns as i64].iter().flat_map(|v| v.to_le_bytes()).collect();
            vec![packed, scales, shape]
        }
        Action::Int4 { group_size, scale_rule, .. } => {
            let source = reader()?;
            let (rows, columns) = (source.rows, source.columns);
            let words_per_row = pack::packed_columns(columns);
            let groups_per_row = columns / group_size;
            // The output bytes are written in the row tasks (each row packed into a task-local buffer and copied
            // while in cache), so no serial pass over the whole tensor follows.
            let mut packed = vec![0u8; rows * words_per_row * 4];
            let mut scales = vec![0u8; rows * groups_per_row * 2];
            packed
                .par_chunks_mut(words_per_row * 4 * ROWS_PER_TASK)
                .zip(scales.par_chunks_mut(groups_per_row * 2 * ROWS_PER_TASK))
                .enumerate()
                .for_each_init(
                    || {
                        (
                            vec![0f32; columns],
                            vec![0i8; columns],
                            vec![0u32; words_per_row],
                            vec![bf16::ZERO; groups_per_row],
                        )
                    },
                    |(weights, q, packed_row, scale_row), (task, (packed_rows, scale_rows))| {
                        for (local, (packed_bytes, scale_bytes)) in packed_rows
                            .chunks_mut(words_per_row * 4)
                            .zip(scale_rows.chunks_mut(groups_per_row * 2))
                            .enumerate()
                        {
                            source.read(task * ROWS_PER_TASK + local, weights);
                            match &expert_rule {
                                None | Some(ExpertRule::InputAbsmax(_)) => {
                                    int4::quantize_row(weights, group_size, scale_rule, q, scale_row)
                                }
                                Some(ExpertRule::Fallback) | Some(ExpertRule::Quantized(_)) => {
                                    int4::quantize_row(weights, group_size, ScaleRule::Mse, q, scale_row)
                                }
                                Some(ExpertRule::Importance(importance)) => imatrix::quantize_row(
                                    weights,
                                    importance,
                                    group_size,
                                    MseSearch::default(),
                                    q,
                                    scale_row,
                                ),
                            }
                            pack::pack_row(q, packed_row);
                            for (slot, word) in packed_bytes.chunks_exact_mut(4).zip(packed_row.iter()) {
                                slot.copy_from_slice(&word.to_le_bytes());
                            }
                            for (slot, scale) in scale_bytes.chunks_exact_mut(2).zip(scale_row.iter()) {
                                slot.copy_from_slice(&scale.to_le_bytes());
                            }
                        }
                    },
                );
            let shape: Vec<u8> = [rows as i64, columns as i64].iter().flat_map(|v| v.to_le_bytes()).collect();
            vec![packed, scales, shape]
        }
        Action::Fp4 { kind, fp4_activations } => {
            let source = reader()?;
            let global = match kind {
                Fp4Kind::Nvfp4 => {
                    let own = match cache {
                        Some(cache) => cache.get(name, || Ok(source.absmax()))?,
                        None => source.absmax(),
                    };
                    fp4::nvfp4_global_scale(own.max(partner_absmax(checkpoint, item, &shard, cache)?))
                }
                Fp4Kind::Mxfp4 => 1.0,
            };
            let (packed, scales) = fp4_rows(&source, kind, global);
            let mut outputs = vec![packed, scales];
            if kind == Fp4Kind::Nvfp4 {
                outputs.push(global.to_le_bytes().to_vec());
            }
            if fp4_activations {
                let Some(ExpertRule::InputAbsmax(absmax)) = expert_rule else {
                    return Err(IoError::tensor(
                        &shard,
                        name,
                        "a W4A4 NVFP4 rule selects it, but the calibration pass measured no input for it (W4A4 \
                         calibrates routed experts only): pass --calibration FILE, and keep other tensors out of \
                         nvfp4-w4a4 rules",
                    ));
                };
                outputs.push(fp4::nvfp4_global_scale(absmax).to_le_bytes().to_vec());
            }
            outputs
        }
        Action::Bf16 => {
            let source = reader()?;
            let (rows, columns) = (source.rows, source.columns);
            let mut out = vec![0u8; rows * columns * 2];
            out.par_chunks_mut(columns * 2 * ROWS_PER_TASK).enumerate().for_each_init(
                || vec![0f32; columns],
                |row_buffer, (task, bytes)| {
                    for (local, row_bytes) in bytes.chunks_mut(columns * 2).enumerate() {
                        source.read(task * ROWS_PER_TASK + local, row_buffer);
                        for (slot, value) in row_bytes.chunks_exact_mut(2).zip(row_buffer.iter()) {
                            slot.copy_from_slice(&bf16_bits(*value).to_le_bytes());
                        }
                    }
                },
            );
            vec![out]
        }
        Action::Fp8Block => {
            let SourceKind::Fp8 { scale_name, .. } = &item.source.kind else { unreachable!("planned only for FP8") };
            let scales = read_scales(checkpoint, scale_name).unwrap_or_default();
            vec![tensor.bytes.to_vec(), scales.iter().flat_map(|s| s.to_le_bytes()).collect()]
        }
        // An INT4 module left as it is: its three tensors.
        Action::Copy if matches!(item.source.kind, SourceKind::Int4 { .. }) => stored
            .iter()
            .map(|name| checkpoint.get(name).map(|tensor| tensor.bytes.to_vec()))
            .collect::<Option<_>>()
            .ok_or_else(|| IoError::tensor(&shard, name, "an INT4 module's tensor disappeared from the checkpoint"))?,
        Action::Copy => vec![tensor.bytes.to_vec()],
    };
    for name in &stored {
        if let Some(shard) = checkpoint.shard_of(name) {
            shard.release(name);
        }
    }
    Ok(outputs)
}

/// The absmax of an NVFP4 item's fused partner (gate ↔ up, [`fused_partner`]), 0 when it has none: both are
/// quantized under the global scale of the larger absmax, which vLLM needs (it keeps one for the fused `w13`).
fn partner_absmax(
    checkpoint: &Checkpoint,
    item: &PlannedItem,
    shard: &std::path::Path,
    cache: Option<&AbsmaxCache>,
) -> Result<f32, IoError> {
    let stored = |partner: &String| {
        checkpoint.contains(partner) || checkpoint.contains(&packed_name(partner.trim_end_matches(".weight")))
    };
    let Some(partner) = fused_partner(&item.source.name).filter(stored) else {
        return Ok(0.0);
    };
    if let Some(cache) = cache {
        return cache.get(&partner, || partner_absmax(checkpoint, item, shard, None));
    }
    let block = match &item.source.kind {
        SourceKind::Fp8 { grid, .. } => [grid.block_rows, grid.block_columns],
        SourceKind::Int4 { .. } | SourceKind::Plain => [128, 128],
    };
    let source = stored_item(checkpoint, &partner, block)
        .map_err(|e| IoError::tensor(shard, &partner, format!("its fused partner's global scale: {e}")))?;
    Ok(RowReader::new(checkpoint, &source)?.absmax())
}

/// FP4 outputs of a source: packed codes `[rows, columns/2]` and scales `[rows, columns/group]`, rows in parallel.
fn fp4_rows(source: &RowReader, kind: Fp4Kind, global: f32) -> (Vec<u8>, Vec<u8>) {
    let (rows, columns) = (source.rows, source.columns);
    let groups = columns / kind.group();
    let mut packed = vec![0u8; rows * columns / 2];
    let mut scales = vec![0u8; rows * groups];
    packed
        .par_chunks_mut(columns / 2 * ROWS_PER_TASK)
        .zip(scales.par_chunks_mut(groups * ROWS_PER_TASK))
        .enumerate()
        .for_each_init(
            || (vec![0f32; columns], vec![0u8; columns]),
            |(weights, codes), (task, (packed_rows, scale_rows))| {
                for (local, (packed_row, scale_row)) in
                    packed_rows.chunks_mut(columns / 2).zip(scale_rows.chunks_mut(groups)).enumerate()
                {
                    source.read(task * ROWS_PER_TASK + local, weights);
                    match kind {
                        Fp4Kind::Nvfp4 => fp4::nvfp4_quantize_row_packed(weights, global, packed_row, scale_row),
                        Fp4Kind::Mxfp4 => {
                            fp4::mxfp4_quantize_row(weights, codes, scale_row);
                            fp4::pack(codes, packed_row);
                        }
                    }
                }
            },
        );
    (packed, scales)
}

/// INT4 outputs of an FP8 item computed on the device; `None` when the item is not FP8 or has a shape the kernels
/// do not take (group size not a multiple of 8), which then runs on the CPU.
fn int4_on_device(
    device: &dyn Device,
    checkpoint: &Checkpoint,
    item: &PlannedItem,
    codes: &[u8],
    shard: &std::path::Path,
    group_size: usize,
    scale_rule: ScaleRule,
) -> Result<Option<Vec<Vec<u8>>>, IoError> {
    let SourceKind::Fp8 { scale_name, grid } = &item.source.kind else { return Ok(None) };
    let name = &item.source.name;
    if check_int4_shape(name, grid.columns, group_size).is_err() || codes.len() != grid.rows * grid.columns {
        return Ok(None);
    }
    let block_scales = read_scales(checkpoint, scale_name)
        .ok_or_else(|| IoError::tensor(shard, scale_name, "scale tensor missing"))?;
    let tensor = Fp8Tensor {
        name,
        codes,
        block_scales: &block_scales,
        rows: grid.rows,
        columns: grid.columns,
        block_rows: grid.block_rows,
        block_columns: grid.block_columns,
    };
    let settings = Int4Settings { group_size, rule: scale_rule, search: MseSearch::default(), poison_outputs: false };
    let output = quantize_int4(device, &Source::Fp8(&tensor), &settings)
        .map_err(|e| IoError::tensor(shard, name, format!("GPU quantize failed: {e}; rerun with --device cpu")))?;
    let shape: Vec<u8> = [grid.rows as i64, grid.columns as i64].iter().flat_map(|v| v.to_le_bytes()).collect();
    let scales: Vec<u8> = output.scales.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(Some(vec![words_to_bytes(&output.packed), scales, shape]))
}

fn words_to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
