//! A causal LM opened from a checkpoint folder and run layer-streamed: embed all sequences, advance them through
//! one decoder layer at a time (load → forward → drop), final norm, then logits one sequence at a time.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::Serialize;

use super::backend::{Backend, Matrix};
use super::rope_table::{mla_softmax_scale, RopeTable};
use super::weights::WeightReader;
use super::{RuntimeError, Spans};
use crate::io::Checkpoint;
use crate::model::config::Attention;
use crate::model::ModelConfig;
use crate::progress::Reporter;

pub use super::indexer::Selection;
pub use super::layer::{fake_fp8, CachedKv, KvFp8, KvObserver, KvTap, Layer, LayerContext, LayerTap};
pub use super::layer_stream::LayerStream;
pub use super::moe::ExpertTimes as LayerTimes;

/// Receives each sequence's logits: `(sequence index, [len, vocab] logits)`.
pub type LogitsSink<'a> = dyn FnMut(usize, &[f32]) -> Result<(), RuntimeError> + 'a;

/// A model ready to run: the mapped checkpoint and its parsed config.
pub struct Model {
    checkpoint: Checkpoint,
    config: ModelConfig,
}

/// Where the time of a forward pass went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ForwardStats {
    /// Wall seconds reading and dequantizing layer weights (routed experts: their share of the expert phase).
    pub load_seconds: f64,
    /// Wall seconds of arithmetic.
    pub compute_seconds: f64,
    /// Router and DSA top-k decisions whose boundary margin is within `NEAR_TIE_RELATIVE` (may flip between
    /// implementations without either being wrong).
    pub near_ties: usize,
}

/// The RoPE table for `positions` positions and the MLA softmax scale (1.0 for GQA) of a model.
pub fn rope_setup(config: &ModelConfig, positions: usize) -> (RopeTable, f32) {
    let (rope_head, mla_scale) = match &config.attention {
        Attention::Mla { qk_nope_head_dim, qk_rope_head_dim, .. } => {
            (*qk_rope_head_dim, mla_softmax_scale(&config.rope, qk_nope_head_dim + qk_rope_head_dim))
        }
        Attention::Gqa { head_dim, .. } => (*head_dim, 1.0),
    };
    (RopeTable::new(&config.rope, rope_head, positions), mla_scale)
}

/// The name of the output head's weight (`lm_head.weight`, or the embedding when tied and absent).
pub fn head_name(config: &ModelConfig, reader: &WeightReader) -> &'static str {
    if config.tie_word_embeddings && !reader.contains("lm_head.weight") {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    }
}

/// Opens a model folder for the runtime: the validated checkpoint and its config, refusing routers it does not run.
pub fn open_checkpoint(dir: &Path) -> Result<(Checkpoint, ModelConfig), RuntimeError> {
    if let Some(problem) = crate::io::journal::pending(dir) {
        return Err(RuntimeError::Input(problem));
    }
    let checkpoint = Checkpoint::open(dir)?;
    let json = checkpoint.config().ok_or_else(|| {
        RuntimeError::Input(format!("{}: has no config.json; the runtime needs the model's config", dir.display()))
    })?;
    let config = ModelConfig::from_json(json)?;
    if config.routing.scoring_func != "sigmoid" {
        return Err(RuntimeError::Input(format!(
            "config.json: scoring_func {:?} is not supported; the runtime implements the sigmoid router of DeepSeek-V3/Kimi K2/GLM",
            config.routing.scoring_func
        )));
    }
    if let Some(problem) = super::validate::describe(&checkpoint, &config) {
        return Err(RuntimeError::Input(problem));
    }
    Ok((checkpoint, config))
}

impl Model {
    pub fn open(dir: &Path) -> Result<Self, RuntimeError> {
        let (checkpoint, config) = open_checkpoint(dir)?;
        Ok(Self { checkpoint, config })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// Runs `sequences` through the model; `sink(index, logits)` receives each sequence's `[len, vocab]` logits.
    /// The reporter sees one unit per decoder layer (plus one for the head).
    pub fn forward(
        &self,
        backend: &dyn Backend,
        sequences: &[Vec<u32>],
        reporter: &dyn Reporter,
        sink: &mut LogitsSink,
    ) -> Result<ForwardStats, RuntimeError> {
        let config = &self.config;
        let reader = WeightReader::new(&self.checkpoint);
        let width = config.hidden_size;
        let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
        let spans = Spans::new(&lengths);
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let (table, mla_scale) = rope_setup(config, longest);
        let mut stats = ForwardStats::default();

        let started = Instant::now();
        let ids: Vec<u32> = sequences.concat();
        let mut hidden = reader.rows("model.embed_tokens.weight", width, &ids)?;
        stats.load_seconds += started.elapsed().as_secs_f64();

        reporter.begin("layers", config.num_hidden_layers as u64 + 1);
        let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
        let mut selection = None;
        let mut layers = LayerStream::start(self.checkpoint.dir(), config.num_hidden_layers, backend.prefetcher());
        for _ in 0..config.num_hidden_layers {
            // Only the wait counts as load time: the rest of the loading overlapped the previous layer's compute.
            let (layer, loaded) = layers.next_layer()?;
            let times = LayerTimes::default();
            let computing = Instant::now();
            layer.forward(&context, &mut hidden, &spans, &mut selection, &times, &mut stats.near_ties)?;
            RuntimeError::check(backend)?;
            let compute_wall = computing.elapsed().as_secs_f64();
            let (expert_load, expert_compute) =
                (times.load_nanos.load(Ordering::Relaxed) as f64, times.compute_nanos.load(Ordering::Relaxed) as f64);
            let expert_share =
                if expert_load + expert_compute > 0.0 { expert_load / (expert_load + expert_compute) } else { 0.0 };
            // The expert phase interleaves loading and compute across threads: split its wall time by thread time.
            let moved = times.phase_nanos.load(Ordering::Relaxed) as f64 * 1e-9 * expert_share;
            stats.load_seconds += loaded + moved;
            stats.compute_seconds += compute_wall - moved;
            drop(layer);
            reporter.advance(1);
        }

        let started = Instant::now();
        let norm = reader.vector("model.norm.weight", width)?;
        let head: Matrix = reader.matrix(head_name(config, &reader), [config.vocab_size, width])?;
        stats.load_seconds += started.elapsed().as_secs_f64();
        let started = Instant::now();
        backend.rms_norm(&mut hidden, width, &norm, config.rms_norm_eps as f32);
        for (index, (start, length)) in spans.iter().enumerate() {
            let logits = backend.linear(&hidden[start * width..(start + length) * width], length, &head, None);
            RuntimeError::check(backend)?;
            sink(index, &logits)?;
        }
        stats.compute_seconds += started.elapsed().as_secs_f64();
        reporter.advance(1);
        reporter.end();
        Ok(stats)
    }
}
