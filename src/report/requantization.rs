//! What requantizing a natively 4-bit release costs in weight error (Kimi K2.5/K2.6 INT4 → NVFP4, MXFP4 or W4A8;
//! Kimi K3 and DeepSeek-V4 MXFP4 → INT4, or → NVFP4 where the cast is exact but for the groups it names): a
//! sample of the plan's requantized tensors is converted exactly as `quantize` would (round to nearest, the recipe's
//! rule) and compared with the source's own dequantized values. `verify OUT --source SRC` measures every tensor of
//! a finished conversion; `eval --reference SRC --candidate OUT` measures the effect on the logits.

use half::bf16;
use rayon::prelude::*;

use crate::format::compressed_tensors::{Fp4Module, Int4Module};
use crate::format::row_reader::RowReader;
use crate::io::IoError;
use crate::plan::prepare::Prepared;
use crate::plan::transform::{transform, Compute};
use crate::plan::{Action, PlannedItem};

/// Tensors converted for the estimate, spread evenly over the requantized ones.
pub const SAMPLE: usize = 8;

/// The weight error of requantizing an INT4 source, on a sample of its tensors.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Requantization {
    /// The source's 4-bit format (`int4`, `mxfp4`) and group size.
    pub source_format: &'static str,
    pub source_group_size: usize,
    /// The output scheme (`nvfp4`, `mxfp4`, `w4a8-fp8`).
    pub scheme: String,
    /// Tensors measured, and how many the plan requantizes.
    pub sampled: usize,
    pub requantized: usize,
    /// Relative L2 error against the source's dequantized values: mean and largest over the sample.
    pub mean_relative_l2: f64,
    pub max_relative_l2: f64,
    /// The tensor with the largest error.
    pub worst: String,
}

/// The estimate for a plan that requantizes INT4 source tensors; `None` when it requantizes none.
pub fn estimate(prepared: &Prepared) -> Result<Option<Requantization>, IoError> {
    let requantized: Vec<&PlannedItem> = prepared.plan.items.iter().filter(|item| item.requantizes_source()).collect();
    let Some(first) = requantized.first() else { return Ok(None) };
    let source_group_size = first.source_group_size().unwrap_or_default();
    let count = requantized.len().min(SAMPLE);
    let sample: Vec<&PlannedItem> = (0..count).map(|i| requantized[i * requantized.len() / count]).collect();
    let errors: Vec<(f64, &str)> = sample
        .par_iter()
        .map(|item| {
            // Inexact cast groups are measured, not refused: the estimate says what they cost.
            let compute = Compute { allow_inexact_cast: true, ..Compute::default() };
            let outputs = transform(&prepared.checkpoint, item, compute)?;
            let source = RowReader::new(&prepared.checkpoint, &item.source)?.read_all();
            Ok((crate::metrics::rel_l2(&dequantize(item, &outputs), &source), item.module()))
        })
        .collect::<Result<_, IoError>>()?;
    let (max_relative_l2, worst) =
        errors.iter().copied().fold((f64::NEG_INFINITY, ""), |a, b| if b.0 > a.0 { b } else { a });
    let mxfp4 = matches!(first.source.kind, crate::format::vendor_source::SourceKind::Mxfp4 { .. });
    Ok(Some(Requantization {
        source_format: if mxfp4 { "mxfp4" } else { "int4" },
        source_group_size,
        scheme: first.action.name().to_string(),
        sampled: count,
        requantized: requantized.len(),
        mean_relative_l2: errors.iter().map(|(error, _)| error).sum::<f64>() / count as f64,
        max_relative_l2,
        worst: worst.to_string(),
    }))
}

/// The values an item's output bytes (in [`transform`]'s order) decode to, as the engines read them.
fn dequantize(item: &PlannedItem, outputs: &[Vec<u8>]) -> Vec<f32> {
    let (rows, columns) = (item.source.shape[0], item.source.shape[1]);
    match item.action {
        Action::Int4 { group_size, .. } => Int4Module {
            rows,
            columns,
            group_size,
            words: outputs[0].chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            scales: outputs[1].chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            scale_dtype: crate::io::Dtype::BF16,
            zero_points: None,
            g_idx: None,
        }
        .dequantize(),
        Action::Fp4 { kind, .. } => Fp4Module {
            kind,
            rows,
            columns,
            packed: outputs[0].clone(),
            scales: outputs[1].clone(),
            global_scale: outputs.get(2).map_or(1.0, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        }
        .dequantize(),
        _ => unreachable!("only quantized items are sampled"),
    }
}
