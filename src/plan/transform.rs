//! Computing one planned item's output bytes from its source: INT4 or FP4 quantize + pack, FP8 → BF16, FP8
//! passthrough, copy. Rows are processed in parallel; results are bit-identical for any thread count.

use std::path::Path;

use half::bf16;
use rayon::prelude::*;

use crate::format::compressed_tensors::{fused_partner, packed_name, Fp4Kind};
use crate::format::row_reader::RowReader;
use crate::format::vendor_source::{read_scales, stored_item, SourceKind};
use crate::io::dtype::{bf16_bits, first_nonfinite};
use crate::io::{Checkpoint, IoError, TensorRef};
use crate::quant::fp4::{MXFP4_GROUP, NVFP4_GROUP};
use crate::quant::scale_rule::{MseSearch, ScaleRule};
use crate::quant::{fp4, imatrix, int4, pack};
use crate::runtime::device::Device;

use super::calibration::{Calibration, ExpertRule};
use super::expert_spill::SpillEntry;
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
    /// Cast MXFP4 groups that NVFP4 cannot hold exactly by [`fp4::cast`]'s rule instead of refusing them.
    pub allow_inexact_cast: bool,
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
    let Compute { device, allow_nonfinite, allow_inexact_cast, calibration, absmax: cache } = compute;
    let name = &item.source.name;
    let expert_rule = calibration.and_then(|calibration| calibration.rule_for(name));
    let stored = item.source.stored_names();
    let shard = checkpoint.shard_of(&stored[0]).map(|s| s.path().to_path_buf()).unwrap_or_default();
    let tensor = checkpoint
        .get(&stored[0])
        .ok_or_else(|| IoError::tensor(&shard, &stored[0], "disappeared from the checkpoint"))?;
    if !allow_nonfinite {
        check_finite(&tensor, &shard, name)?;
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
    let mxfp4 = matches!(item.source.kind, SourceKind::Mxfp4 { .. });
    let outputs = match item.action {
        _ if device_outputs.is_some() => device_outputs.unwrap_or_default(),
        // An MXFP4 source kept MXFP4: its codes and E8M0 scales, byte for byte.
        Action::Fp4 { kind: Fp4Kind::Mxfp4, fp4_activations: false } if mxfp4 => {
            copy_stored(checkpoint, &stored, &shard, name)?
        }
        Action::Fp4 { kind: Fp4Kind::Nvfp4, fp4_activations: false } if mxfp4 => {
            let log2 = cast_global_log2(checkpoint, item, &shard, cache)?;
            let source = reader()?;
            let (packed, scales, inexact) = cast_rows(&source, log2);
            if !allow_inexact_cast && !inexact.is_empty() {
                return Err(inexact_cast_error(&shard, name, &source, &inexact));
            }
            vec![packed, scales, fp4::cast::global_scale(log2).to_le_bytes().to_vec()]
        }
        Action::Int4 { group_size, .. } if matches!(expert_rule, Some(ExpertRule::Quantized(_))) => {
            let Some(ExpertRule::Quantized(entry)) = &expert_rule else { unreachable!("matched above") };
            gptq_outputs(entry, item, &shard, group_size)?
        }
        Action::Int4 { group_size, scale_rule, .. } => int4_outputs(&reader()?, group_size, scale_rule, &expert_rule),
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
                outputs.push(activation_global(&expert_rule, &shard, name)?);
            }
            outputs
        }
        Action::Bf16 => vec![bf16_rows(&reader()?)],
        Action::Fp8Block => {
            let SourceKind::Fp8 { scale_name, .. } = &item.source.kind else { unreachable!("planned only for FP8") };
            let scales = read_scales(checkpoint, scale_name).unwrap_or_default();
            vec![tensor.bytes.to_vec(), scales.iter().flat_map(|s| s.to_le_bytes()).collect()]
        }
        // An INT4 or MXFP4 module left as it is: its tensors.
        Action::Copy if stored.len() > 1 => copy_stored(checkpoint, &stored, &shard, name)?,
        Action::Copy => vec![tensor.bytes.to_vec()],
    };
    for name in &stored {
        if let Some(shard) = checkpoint.shard_of(name) {
            shard.release(name);
        }
    }
    Ok(outputs)
}

/// Refuses a source tensor with a NaN or infinite element, naming the first.
fn check_finite(tensor: &TensorRef, shard: &Path, name: &str) -> Result<(), IoError> {
    let Some(index) = first_nonfinite(tensor.dtype, tensor.bytes) else { return Ok(()) };
    let columns = tensor.shape.last().copied().unwrap_or(1).max(1);
    Err(IoError::tensor(
        shard,
        name,
        format!(
            "element {index} (row {}, column {}) is NaN or infinite; fix the source, or pass \
             --allow-nonfinite to carry such values into the output",
            index / columns,
            index % columns
        ),
    ))
}

/// A routed expert's INT4 tensors as the GPTQ pass left them (packed, scales, shape), checked against the plan.
fn gptq_outputs(
    entry: &SpillEntry,
    item: &PlannedItem,
    shard: &Path,
    group_size: usize,
) -> Result<Vec<Vec<u8>>, IoError> {
    let grid = (item.source.shape.first().copied(), item.source.shape.get(1).copied());
    if grid != (Some(entry.rows), Some(entry.columns)) || entry.group_size != group_size {
        return Err(IoError::tensor(
            shard,
            &item.source.name,
            format!(
                "the GPTQ pass quantized it as [{}, {}] in groups of {}, the plan wants {:?} in groups of \
                 {group_size}; rerun without --resume",
                entry.rows, entry.columns, entry.group_size, item.source.shape
            ),
        ));
    }
    let (packed, scales) = entry.read()?;
    let shape: Vec<u8> = [entry.rows as i64, entry.columns as i64].iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(vec![packed, scales, shape])
}

/// A weight's INT4 tensors (packed, scales, shape) quantized on the rayon pool, each row by the scale rule or the
/// calibrated method's rule for it.
fn int4_outputs(
    source: &RowReader,
    group_size: usize,
    scale_rule: ScaleRule,
    expert_rule: &Option<ExpertRule>,
) -> Vec<Vec<u8>> {
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
            || (vec![0f32; columns], vec![0i8; columns], vec![0u32; words_per_row], vec![bf16::ZERO; groups_per_row]),
            |(weights, q, packed_row, scale_row), (task, (packed_rows, scale_rows))| {
                for (local, (packed_bytes, scale_bytes)) in
                    packed_rows.chunks_mut(words_per_row * 4).zip(scale_rows.chunks_mut(groups_per_row * 2)).enumerate()
                {
                    source.read(task * ROWS_PER_TASK + local, weights);
                    match &expert_rule {
                        None | Some(ExpertRule::InputAbsmax(_)) => {
                            int4::quantize_row(weights, group_size, scale_rule, q, scale_row)
                        }
                        Some(ExpertRule::Fallback) | Some(ExpertRule::Quantized(_)) => {
                            int4::quantize_row(weights, group_size, ScaleRule::Mse, q, scale_row)
                        }
                        Some(ExpertRule::Importance(importance)) => {
                            imatrix::quantize_row(weights, importance, group_size, MseSearch::default(), q, scale_row)
                        }
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

/// The global scale of a W4A4 expert's input (NVFP4 activations), from the calibration pass's input absmax.
fn activation_global(expert_rule: &Option<ExpertRule>, shard: &Path, name: &str) -> Result<Vec<u8>, IoError> {
    let Some(ExpertRule::InputAbsmax(absmax)) = expert_rule else {
        return Err(IoError::tensor(
            shard,
            name,
            "a W4A4 NVFP4 rule selects it, but the calibration pass measured no input for it (W4A4 \
             calibrates routed experts only): pass --calibration FILE, and keep other tensors out of \
             nvfp4-w4a4 rules",
        ));
    };
    Ok(fp4::nvfp4_global_scale(*absmax).to_le_bytes().to_vec())
}

/// A weight's BF16 bytes, converted on the rayon pool.
fn bf16_rows(source: &RowReader) -> Vec<u8> {
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
    out
}

/// The error for an MXFP4 weight whose groups `inexact` NVFP4 cannot hold exactly.
fn inexact_cast_error(shard: &std::path::Path, name: &str, source: &RowReader, inexact: &[(usize, usize)]) -> IoError {
    let (row, group) = inexact[0];
    let shared = if fused_partner(name).is_some() {
        " (of this weight and its fused gate/up partner, which share one global scale)"
    } else {
        ""
    };
    IoError::tensor(
        shard,
        name,
        format!(
            "{} of its {} MXFP4 groups (the first at row {row}, columns {}..{}) have an E8M0 exponent more than 17 \
             below the largest{shared} and cannot be cast to NVFP4 without loss (E4M3 holds 2^-9 to 2^8); pass \
             --allow-inexact-cast to re-encode those groups at E4M3's smallest scale (each value rounded to the \
             nearest E2M1 code at that step; every other group stays bit-exact), or convert with the -mxfp4 or \
             -int4 recipe instead",
            inexact.len(),
            source.rows * source.columns / MXFP4_GROUP,
            group * MXFP4_GROUP,
            (group + 1) * MXFP4_GROUP,
        ),
    )
}

/// Refuses, before anything is written, an MXFP4 weight the plan casts to NVFP4 that has groups the cast cannot
/// hold exactly (the error names it and its first such group). Reads only the E8M0 scales where a weight's (and
/// its fused partner's) exponents all lie within 17 of each other (exact whatever the codes); reads the codes of
/// the others to find the groups that are not zero.
pub fn check_casts(checkpoint: &Checkpoint, plan: &super::Plan) -> Result<(), IoError> {
    let exponents = |name: &str| -> Option<(u8, u8)> {
        let item = stored_item(checkpoint, name, [128, 128]).ok()?;
        let SourceKind::Mxfp4 { naming, .. } = item.kind else { return None };
        let [_, scale_name] = naming.stored_names(item.module());
        let bytes = checkpoint.get(&scale_name)?.bytes;
        Some((bytes.iter().copied().min()?, bytes.iter().copied().max()?))
    };
    plan.items.par_iter().try_for_each(|item| {
        let cast = matches!(item.action, Action::Fp4 { kind: Fp4Kind::Nvfp4, fp4_activations: false });
        if !cast || !matches!(item.source.kind, SourceKind::Mxfp4 { .. }) {
            return Ok(());
        }
        let name = &item.source.name;
        let spans = std::iter::once(name.clone()).chain(fused_partner(name)).filter_map(|n| exponents(&n));
        let (low, high) = spans.fold((u8::MAX, 0), |(low, high), (l, h)| (low.min(l), high.max(h)));
        if i32::from(high) - i32::from(low) <= 17 {
            return Ok(());
        }
        let shard = checkpoint.shard_of(&item.source.stored_names()[0]).map(|s| s.path().to_path_buf());
        let shard = shard.unwrap_or_default();
        let log2 = cast_global_log2(checkpoint, item, &shard, None)?;
        let source = RowReader::new(checkpoint, &item.source)?;
        let (_, _, inexact) = cast_rows(&source, log2);
        match inexact.is_empty() {
            true => Ok(()),
            false => Err(inexact_cast_error(&shard, name, &source, &inexact)),
        }
    })
}

/// The bytes of a module's stored tensors, as stored.
fn copy_stored(
    checkpoint: &Checkpoint,
    stored: &[String],
    shard: &std::path::Path,
    name: &str,
) -> Result<Vec<Vec<u8>>, IoError> {
    stored
        .iter()
        .map(|name| checkpoint.get(name).map(|tensor| tensor.bytes.to_vec()))
        .collect::<Option<_>>()
        .ok_or_else(|| IoError::tensor(shard, name, "one of the module's tensors disappeared from the checkpoint"))
}

/// log2 of the NVFP4 global scale that casts an MXFP4 item losslessly ([`fp4::cast::global_log2`]), from the
/// largest exponent of the item and of its fused partner (gate ↔ up share one global, as vLLM's `w13` needs).
fn cast_global_log2(
    checkpoint: &Checkpoint,
    item: &PlannedItem,
    shard: &std::path::Path,
    cache: Option<&AbsmaxCache>,
) -> Result<i32, IoError> {
    // The cache holds f32s: an exponent byte is one exactly (−1 for a weight whose groups are all zero).
    let measure = |name: &str| -> Result<f32, IoError> {
        let source = stored_item(checkpoint, name, [128, 128])
            .map_err(|e| IoError::tensor(shard, name, format!("its MXFP4 exponents: {e}")))?;
        let reader = RowReader::new(checkpoint, &source)?;
        let Some((packed, exponents)) = reader.mxfp4_parts() else {
            return Err(IoError::tensor(
                shard,
                name,
                "is the fused gate/up partner of an MXFP4 weight cast to NVFP4 but is not MXFP4 itself; both \
                 halves must share a format",
            ));
        };
        Ok(fp4::cast::max_exponent(packed, exponents).map_or(-1.0, f32::from))
    };
    let cached = |name: &str| match cache {
        Some(cache) => cache.get(&format!("{name}#e8m0"), || measure(name)),
        None => measure(name),
    };
    let mut largest = cached(&item.source.name)?;
    if let Some(partner) = stored_partner(checkpoint, &item.source.name) {
        largest = largest.max(cached(&partner)?);
    }
    Ok(fp4::cast::global_log2((largest >= 0.0).then_some(largest as u8)))
}

/// The lossless cast of an MXFP4 source's rows under global 2^`log2`: packed codes `[rows, columns/2]`, E4M3 scales
/// `[rows, columns/16]`, and the `(row, group)` of every group that could not be cast exactly.
fn cast_rows(source: &RowReader, log2: i32) -> (Vec<u8>, Vec<u8>, Vec<(usize, usize)>) {
    let (rows, columns) = (source.rows, source.columns);
    let (codes, exponents) = source.mxfp4_parts().unwrap_or_default();
    let mut packed = vec![0u8; rows * columns / 2];
    let mut scales = vec![0u8; rows * columns / NVFP4_GROUP];
    let inexact = packed
        .par_chunks_mut(columns / 2)
        .zip(scales.par_chunks_mut(columns / NVFP4_GROUP))
        .zip(codes.par_chunks(columns / 2).zip(exponents.par_chunks(columns / MXFP4_GROUP)))
        .enumerate()
        .flat_map_iter(|(row, ((packed_out, scales_out), (codes, exponents)))| {
            let inexact = fp4::cast::mxfp4_to_nvfp4_row(codes, exponents, log2, packed_out, scales_out);
            inexact.into_iter().map(move |group| (row, group))
        })
        .collect();
    (packed, scales, inexact)
}

/// The fused gate/up partner of weight `name` ([`fused_partner`]) when the checkpoint stores it (as a weight, or as
/// a packed module's `weight_packed`).
fn stored_partner(checkpoint: &Checkpoint, name: &str) -> Option<String> {
    fused_partner(name).filter(|partner| {
        checkpoint.contains(partner) || checkpoint.contains(&packed_name(partner.trim_end_matches(".weight")))
    })
}

/// The absmax of an NVFP4 item's fused partner (gate ↔ up, [`fused_partner`]), 0 when it has none: both are
/// quantized under the global scale of the larger absmax, which vLLM needs (it keeps one for the fused `w13`).
fn partner_absmax(
    checkpoint: &Checkpoint,
    item: &PlannedItem,
    shard: &std::path::Path,
    cache: Option<&AbsmaxCache>,
) -> Result<f32, IoError> {
    let Some(partner) = stored_partner(checkpoint, &item.source.name) else {
        return Ok(0.0);
    };
    if let Some(cache) = cache {
        return cache.get(&partner, || partner_absmax(checkpoint, item, shard, None));
    }
    let block = match &item.source.kind {
        SourceKind::Fp8 { grid, .. } => [grid.block_rows, grid.block_columns],
        SourceKind::Int4 { .. } | SourceKind::Mxfp4 { .. } | SourceKind::Plain => [128, 128],
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
