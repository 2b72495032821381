//! DeepSeek-V4's KV compressors (transformers 5.24 `DeepseekV4HCACompressor`, `DeepseekV4CSACompressor` and the
//! CSA indexer's own): every `ratio` tokens of a sequence close a window that becomes one compressed entry — per
//! channel a softmax over the window's gates (`wgate` plus the learned position bias `ape`) weighting its projected
//! values (`wkv`), RMS-normed (`norm`) and rotated to the window's first position with the `compress` RoPE.
//! CSA (ratio 4) overlaps windows: each token projects two series, and entry `w` mixes window `w − 1`'s first
//! series with window `w`'s second over `2 · ratio` slots (entry 0 has only its own). An incomplete last window
//! makes no entry; entry `w` is complete — visible to a query — from position `(w + 1) · ratio − 1` on.

use rayon::prelude::*;

use super::rope::rotate_tail;
use crate::load::weights::WeightReader;
use crate::runtime::backend::Backend;
use crate::runtime::matrix::Matrix;
use crate::runtime::rope_table::RopeTable;
use crate::runtime::tensor::Tensor;
use crate::runtime::{RuntimeError, Spans};

/// One compressor's weights (`….compressor.*`).
pub struct Compressor {
    /// `wkv` `[series · dim, hidden]`.
    kv: Matrix,
    /// `wgate` `[series · dim, hidden]`.
    gate: Matrix,
    /// `ape` `[ratio, series · dim]`.
    position_bias: Vec<f32>,
    /// `norm.weight` `[dim]`.
    norm: Vec<f32>,
    ratio: usize,
    dim: usize,
    /// Two series per token (CSA's overlapping windows) rather than one (HCA).
    overlap: bool,
}

impl Compressor {
    /// The compressor stored under `at` (`layers.N.attn.compressor`) of a layer of compression `ratio` making
    /// entries of `dim` channels from a residual of `hidden`.
    pub fn load(
        reader: &WeightReader,
        at: &str,
        (ratio, dim, hidden): (usize, usize, usize),
    ) -> Result<Self, RuntimeError> {
        let overlap = ratio == 4;
        let width = if overlap { 2 * dim } else { dim };
        Ok(Self {
            kv: reader.matrix(&format!("{at}.wkv.weight"), [width, hidden])?,
            gate: reader.matrix(&format!("{at}.wgate.weight"), [width, hidden])?,
            position_bias: reader.matrix(&format!("{at}.ape"), [ratio, width])?.values().to_vec(),
            norm: reader.vector(&format!("{at}.norm.weight"), dim)?,
            ratio,
            dim,
            overlap,
        })
    }

    /// Its projections (for device prefetch).
    pub fn matrices(&self) -> [&Matrix; 2] {
        [&self.kv, &self.gate]
    }

    /// The compression ratio.
    pub fn ratio(&self) -> usize {
        self.ratio
    }

    /// Each token's projections `[tokens, series · dim]` of the mixer input `x` `[tokens, hidden]`: values, gates.
    pub fn project(&self, backend: &dyn Backend, x: &Tensor) -> Result<[Vec<f32>; 2], RuntimeError> {
        Ok([
            backend.download(&backend.linear(x, &self.kv, None)?)?,
            backend.download(&backend.linear(x, &self.gate, None)?)?,
        ])
    }

    /// Each sequence's entries `[windows, dim]` (`windows = length / ratio`) from its tokens' projections
    /// ([`Compressor::project`]), RMS-normed with epsilon `eps`, rotated by `table` (the `compress` RoPE).
    pub fn entries(&self, [kv, gate]: &[Vec<f32>; 2], spans: &Spans, table: &RopeTable, eps: f32) -> Vec<Vec<f32>> {
        let (ratio, dim) = (self.ratio, self.dim);
        let width = if self.overlap { 2 * dim } else { dim };
        spans
            .iter()
            .map(|(start, length)| {
                let windows = length / ratio;
                let mut entries = vec![0f32; windows * dim];
                entries.par_chunks_exact_mut(dim).enumerate().for_each(|(window, entry)| {
                    // (row, column offset) of each slot's series: the previous window's first series, then this
                    // window's own (second with overlap).
                    let mut slots: Vec<(usize, usize)> = Vec::with_capacity(2 * ratio);
                    if self.overlap && window > 0 {
                        slots.extend((0..ratio).map(|i| (start + (window - 1) * ratio + i, 0)));
                    }
                    let own = if self.overlap { dim } else { 0 };
                    slots.extend((0..ratio).map(|i| (start + window * ratio + i, own)));
                    let mut logits = vec![0f32; slots.len()];
                    for (channel, value) in entry.iter_mut().enumerate() {
                        for (logit, &(row, offset)) in logits.iter_mut().zip(&slots) {
                            let slot = (row - start) % ratio;
                            *logit = gate[row * width + offset + channel]
                                + self.position_bias[slot * width + offset + channel];
                        }
                        let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let total: f32 = logits.iter().map(|l| (l - top).exp()).sum();
                        *value = logits
                            .iter()
                            .zip(&slots)
                            .map(|(l, &(row, offset))| kv[row * width + offset + channel] * ((l - top).exp() / total))
                            .sum();
                    }
                    let mean = entry.iter().map(|v| v * v).sum::<f32>() / dim as f32;
                    let inverse = 1.0 / (mean + eps).sqrt();
                    entry.iter_mut().zip(&self.norm).for_each(|(v, w)| *v = w * (*v * inverse));
                    rotate_tail(entry, table, window * ratio, false);
                });
                entries
            })
            .collect()
    }
}
