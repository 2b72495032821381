//! DeepSeek-V4's KV compressors (transformers 5.24 `DeepseekV4HCACompressor`, `DeepseekV4CSACompressor` and the
//! CSA indexer's own): every `ratio` tokens of a sequence close a window that becomes one compressed entry — per
//! channel a softmax over the window's gates (`wgate` plus the learned position bias `ape`) weighting its projected
//! values (`wkv`), RMS-normed (`norm`) and rotated to the window's first position with the `compress` RoPE.
//! CSA (ratio 4) overlaps windows: each token projects two series, and entry `w` mixes window `w − 1`'s first
//! series with window `w`'s second over `2 · ratio` slots (entry 0 has only its own). An incomplete last window
//! makes no entry; entry `w` is complete — visible to a query — from position `(w + 1) · ratio − 1` on.

use rayon::prelude::*;

use super::rope::{rotate_tail, Rotations};
use crate::load::weights::WeightReader;
use crate::runtime::backend::Backend;
use crate::runtime::compressed_cache::EntryCache;
use crate::runtime::matrix::Matrix;
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

    /// A compressor of random weights (benchmarks).
    #[cfg(test)]
    pub(super) fn random(rng: &mut crate::rng::Rng, (ratio, dim, hidden): (usize, usize, usize)) -> Self {
        let overlap = ratio == 4;
        let width = if overlap { 2 * dim } else { dim };
        let scale = (hidden as f32).powf(-0.5);
        Self {
            kv: Matrix::new(width, hidden, rng.values(width * hidden, scale)),
            gate: Matrix::new(width, hidden, rng.values(width * hidden, scale)),
            position_bias: rng.values(ratio * width, 0.1),
            norm: vec![1.0; dim],
            ratio,
            dim,
            overlap,
        }
    }

    /// A cache of random entries after `tokens` tokens whose windows all closed (benchmarks).
    #[cfg(test)]
    pub(super) fn random_cache(&self, rng: &mut crate::rng::Rng, tokens: usize) -> EntryCache {
        let width = self.width();
        EntryCache {
            entries: rng.values(tokens / self.ratio * self.dim, 1.0),
            pending: Default::default(),
            previous: if self.overlap {
                [rng.values(self.ratio * width, 1.0), rng.values(self.ratio * width, 1.0)]
            } else {
                Default::default()
            },
        }
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
    pub fn entries(&self, projected: &[Vec<f32>; 2], spans: &Spans, table: &dyn Rotations, eps: f32) -> Vec<Vec<f32>> {
        let (ratio, dim, width) = (self.ratio, self.dim, self.width());
        let rows =
            |row: usize| [&projected[0][row * width..][..ratio * width], &projected[1][row * width..][..ratio * width]];
        spans
            .iter()
            .map(|(start, length)| {
                let windows = length / ratio;
                let mut entries = vec![0f32; windows * dim];
                entries.par_chunks_exact_mut(dim).enumerate().for_each(|(window, entry)| {
                    let previous = (self.overlap && window > 0).then(|| rows(start + (window - 1) * ratio));
                    self.entry(entry, previous, rows(start + window * ratio), window, (table, eps));
                });
                entries
            })
            .collect()
    }

    /// Values, gates `[series · dim]` per token.
    fn width(&self) -> usize {
        if self.overlap {
            2 * self.dim
        } else {
            self.dim
        }
    }

    /// Entry `window` into `entry` from its window's projections `current` (values, gates `[ratio, width]`) and,
    /// overlapping, the previous window's `previous`.
    fn entry(
        &self,
        entry: &mut [f32],
        previous: Option<[&[f32]; 2]>,
        current: [&[f32]; 2],
        window: usize,
        (table, eps): (&dyn Rotations, f32),
    ) {
        let (ratio, dim, width) = (self.ratio, self.dim, self.width());
        // (projections, slot, column offset) of each slot's series: the previous window's first series, then this
        // window's own (second with overlap).
        let own = if self.overlap { dim } else { 0 };
        let mut slots: Vec<([&[f32]; 2], usize, usize)> = Vec::with_capacity(2 * ratio);
        if let Some(previous) = previous {
            slots.extend((0..ratio).map(|i| (previous, i, 0)));
        }
        slots.extend((0..ratio).map(|i| (current, i, own)));
        let mut logits = vec![0f32; slots.len()];
        for (channel, value) in entry.iter_mut().enumerate() {
            for (logit, &([_, gate], slot, offset)) in logits.iter_mut().zip(&slots) {
                let at = slot * width + offset + channel;
                *logit = gate[at] + self.position_bias[at];
            }
            let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total: f32 = logits.iter().map(|l| (l - top).exp()).sum();
            *value = logits
                .iter()
                .zip(&slots)
                .map(|(l, &([kv, _], slot, offset))| kv[slot * width + offset + channel] * ((l - top).exp() / total))
                .sum();
        }
        let mean = entry.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inverse = 1.0 / (mean + eps).sqrt();
        entry.iter_mut().zip(&self.norm).for_each(|(v, w)| *v = w * (*v * inverse));
        rotate_tail(entry, table, window * ratio, false);
    }

    /// A request's cache after its first `length` tokens, whose projections are `projected` (rows `0..length`) and
    /// entries `entries` ([`Compressor::entries`]).
    pub fn cache(&self, projected: &[Vec<f32>; 2], length: usize, entries: Vec<f32>) -> EntryCache {
        let (ratio, width) = (self.ratio, self.width());
        let complete = length / ratio * ratio;
        let part = |rows: std::ops::Range<usize>| {
            projected.clone().map(|values| values[rows.start * width..rows.end * width].to_vec())
        };
        EntryCache {
            entries,
            pending: part(complete..length),
            previous: if self.overlap && complete > 0 { part(complete - ratio..complete) } else { Default::default() },
        }
    }

    /// The position the next entry of `cache` is rotated to: its window's first.
    pub fn next_entry_position(&self, cache: &EntryCache) -> usize {
        cache.entries.len() / self.dim * self.ratio
    }

    /// Appends one token's projections `token` (values, gates `[width]`) to `cache`; when they close a window, its
    /// entry joins the cache's entries.
    pub fn append(&self, cache: &mut EntryCache, token: [&[f32]; 2], (table, eps): (&dyn Rotations, f32)) {
        for (pending, values) in cache.pending.iter_mut().zip(token) {
            pending.extend_from_slice(values);
        }
        if cache.pending[0].len() < self.ratio * self.width() {
            return;
        }
        let window = cache.entries.len() / self.dim;
        let mut entry = vec![0f32; self.dim];
        let previous =
            (self.overlap && !cache.previous[0].is_empty()).then(|| [&cache.previous[0][..], &cache.previous[1][..]]);
        self.entry(&mut entry, previous, [&cache.pending[0], &cache.pending[1]], window, (table, eps));
        cache.entries.extend_from_slice(&entry);
        let closed = std::mem::take(&mut cache.pending);
        if self.overlap {
            cache.previous = closed;
        }
    }
}
