//! The causal LM opened from a checkpoint folder: token embedding, the decoder layers streamed one at a time
//! through the one layer-streamed loop ([`run_layers`], with a per-layer hook), final norm and `lm_head`.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::Serialize;

use super::context::{LayerContext, LayerState, Residual};
use super::embedding::{embed, head_name};
use super::hyper::{narrow, widen};
use super::layer::{Layer, Stage};
use super::moe::ExpertTimes;
use super::mtp::MtpLayer;
use super::mtp_chain::chained_drafts;
use super::rope::rope_setup;
use super::tap::KvSource;
use crate::io::Checkpoint;
use crate::load::layer_stream::LayerStream;
use crate::load::open::open_checkpoint;
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::progress::Reporter;
use crate::runtime::backend::Backend;
use crate::runtime::matrix::Matrix;
use crate::runtime::{RuntimeError, Spans, Tensor};

/// Receives each sequence's logits: `(sequence index, [len, vocab] logits)`.
pub type LogitsSink<'a> = dyn FnMut(usize, &[f32]) -> Result<(), RuntimeError> + 'a;

/// Receives each sequence's MTP drafts: `(sequence index, [len − 1, vocab] depth-1 draft logits, chained greedy
/// drafts)`, the chains `[starts, depth]` as [`super::mtp_chain::chained_drafts`] makes them (empty at depth 1).
pub type DraftSink<'a> = dyn FnMut(usize, &[f32], &[u32]) -> Result<(), RuntimeError> + 'a;

/// One decoder layer of a layer-streamed pass, as the hook sees it.
pub struct LayerStep<'a> {
    pub index: usize,
    /// The layer of each model of the pass, in the order the models were given.
    pub layers: &'a [Layer],
    /// Seconds spent waiting for the layers (their loading not hidden behind the previous layer's compute).
    pub waited_seconds: f64,
}

/// Runs one decoder layer of a pass: the caller's forward of its streams through `step.layers`, and whatever it
/// observes.
pub type LayerHook<'a> = dyn FnMut(&LayerStep) -> Result<(), RuntimeError> + 'a;

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
    /// Router and DSA top-k decisions whose boundary margin is within the backend's near-tie margins (may flip
    /// between implementations without either being wrong).
    pub near_ties: usize,
}

/// The one layer-streamed loop: the decoder layers of `models` (one model, or several of the same shape advanced
/// in lockstep) are loaded ahead on a thread each, and for every layer index `hook` runs the caller's streams
/// through them; then the backend's first failure is raised, the reporter advances one unit and the layers are
/// dropped.
pub fn run_layers(
    models: &[&Model],
    backend: &dyn Backend,
    reporter: &dyn Reporter,
    hook: &mut LayerHook,
) -> Result<(), RuntimeError> {
    let Some(first) = models.first() else { return Ok(()) };
    crate::runtime::allocator::retain_freed_memory();
    let count = first.config.num_hidden_layers;
    let mut streams: Vec<LayerStream<Layer>> =
        models.iter().map(|model| LayerStream::start(model.checkpoint.dir(), count, backend.prefetcher())).collect();
    for index in 0..count {
        let mut layers = Vec::with_capacity(streams.len());
        let mut waited_seconds = 0.0;
        for stream in &mut streams {
            let (layer, waited) = stream.next_layer()?;
            layers.push(layer);
            waited_seconds += waited;
        }
        hook(&LayerStep { index, layers: &layers, waited_seconds })?;
        drop(layers);
        reporter.advance(1);
    }
    Ok(())
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
        self.run(backend, sequences, reporter, sink, None)
    }

    /// [`Model::forward`], and the MTP layer's drafts: right after each sequence's logits, `drafts(index, logits,
    /// chains)` receives its `[len − 1, vocab]` draft logits (row `t` drafts token `t + 2`; see [`super::mtp`]) and,
    /// with `depth` above 1, its chained greedy drafts ([`super::mtp_chain`]). An error when the model has no MTP
    /// layer.
    pub fn forward_with_drafts(
        &self,
        backend: &dyn Backend,
        sequences: &[Vec<u32>],
        reporter: &dyn Reporter,
        sink: &mut LogitsSink,
        drafts: &mut DraftSink,
        depth: usize,
    ) -> Result<ForwardStats, RuntimeError> {
        if self.config.num_nextn_predict_layers == 0 {
            return Err(self.no_mtp_layer());
        }
        if depth > 1 && self.config.deepseek_v4().is_some() {
            return Err(RuntimeError::Input(format!(
                "{}: --mtp-depth above 1 waits for DeepSeek-V4: vLLM's drafter feeds its own streams back (mtp.py \
                 `previous_hidden_states`) with caches per layer type, which the chained drafts here do not model; \
                 --mtp (one draft per position) runs",
                self.checkpoint.dir().display()
            )));
        }
        if depth > 1 && self.config.hyper_connections().is_some() {
            return Err(RuntimeError::Input(format!(
                "{}: --mtp-depth above 1 waits for GLM-5.3-Flash: vLLM's drafter feeds its post-norm state back and \
                 reuses the first draft's indexer selection in the later ones (glm5next/common/mtp.py), which the \
                 chained drafts here do not model; --mtp (one draft per position) runs",
                self.checkpoint.dir().display()
            )));
        }
        self.run(backend, sequences, reporter, sink, Some((drafts, depth)))
    }

    /// Replays `sequence` alone, checking every value on the way, and says where the first non-finite one comes
    /// from: an embedding row, a layer's attention or MLP output (their weights were checked finite when loaded, so
    /// their activations overflowed), the residual sum after one, the final norm or the head. `None` when the
    /// replay stays finite. For the message of a non-finite logit, so that it names the tensor instead of guessing.
    pub fn locate_nonfinite(&self, backend: &dyn Backend, sequence: &[u32]) -> Result<Option<String>, RuntimeError> {
        let config = &self.config;
        let reader = WeightReader::new(&self.checkpoint);
        let width = config.hidden_size;
        let first_bad = |values: &[f32], columns: usize| {
            values.iter().position(|v| !v.is_finite()).map(|index| (index / columns.max(1), values[index]))
        };
        let embedded = embed(&reader, config, sequence)?;
        if let Some((position, value)) = first_bad(&embedded, width) {
            return Ok(Some(format!(
                "row {} of `model.embed_tokens.weight` (the token at position {position}) holds {value}: the \
                 checkpoint is corrupt",
                sequence[position]
            )));
        }
        let spans = Spans::new(&[sequence.len()]);
        let (table, mla_scale) = rope_setup(config, sequence.len());
        let mut hidden = widen(backend, config, backend.upload(&embedded, width)?)?;
        let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
        let mut state = LayerState { tokens: sequence.to_vec(), ..LayerState::default() };
        let mut found: Option<String> = None;
        let replayed = run_layers(&[self], backend, &crate::progress::Silent, &mut |step| {
            let prefix = format!("model.layers.{}", step.index);
            let mut probe = |stage: Stage, tensor: &Tensor| {
                let Some((position, value)) = first_bad(&backend.download(tensor)?, tensor.columns()) else {
                    return Ok(());
                };
                found = Some(match stage {
                    Stage::Attention => format!(
                        "the output of `{prefix}.self_attn` at position {position} ({value}); its weights are finite, \
                         so its activations overflow: look at `{prefix}.input_layernorm.weight` and \
                         `{prefix}.self_attn.*`"
                    ),
                    Stage::AttentionResidual => format!(
                        "the residual stream at position {position} ({value}) after adding the finite output of \
                         `{prefix}.self_attn`: the sum overflows"
                    ),
                    Stage::MlpResidual => format!(
                        "the output of `{prefix}.mlp` added to the residual stream at position {position} ({value}); \
                         its weights are finite, so its activations overflow: look at \
                         `{prefix}.post_attention_layernorm.weight` and `{prefix}.mlp.*`"
                    ),
                });
                // Stops the replay: the first one is found.
                Err(RuntimeError::Input(String::new()))
            };
            let residual = Residual { hidden: &mut hidden, spans: &spans, state: &mut state };
            step.layers[0].forward_probed(&context, residual, &mut probe)
        });
        if found.is_some() {
            return Ok(found);
        }
        replayed?;
        let mut hidden = narrow(backend, &reader, config, hidden)?;
        let norm = reader.parameter(config.final_norm_name(), width)?;
        backend.rms_norm(&mut hidden, width, &norm, config.rms_norm_eps as f32)?;
        if let Some((position, value)) = first_bad(&backend.download(&hidden)?, width) {
            return Ok(Some(format!("the final norm `model.norm.weight`'s output at position {position} ({value})")));
        }
        let head_name = head_name(config, &reader);
        let head: Matrix = reader.matrix(head_name, [config.vocab_size, width])?;
        let logits = backend.linear(&hidden, &head, None)?;
        Ok(first_bad(&backend.download(&logits)?, config.vocab_size).map(|(position, value)| {
            format!("the output of `{head_name}` at position {position} ({value}); its weights are finite, so the logits overflow")
        }))
    }

    fn no_mtp_layer(&self) -> RuntimeError {
        RuntimeError::Input(format!(
            "{}: the model has no MTP layer (num_nextn_predict_layers is 0 in config.json), so there is no draft to \
             measure; --mtp needs a checkpoint that keeps its MTP layer (GLM-4.5+, GLM-5+, DeepSeek-V4)",
            self.checkpoint.dir().display()
        ))
    }

    fn run(
        &self,
        backend: &dyn Backend,
        sequences: &[Vec<u32>],
        reporter: &dyn Reporter,
        sink: &mut LogitsSink,
        mut drafts: Option<(&mut DraftSink, usize)>,
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
        let mut hidden = widen(backend, config, backend.upload(&embed(&reader, config, &ids)?, width)?)?;
        stats.load_seconds += started.elapsed().as_secs_f64();

        reporter.begin("layers", config.num_hidden_layers as u64 + 1);
        let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
        let mut state = LayerState { tokens: ids, ..LayerState::default() };
        run_layers(&[self], backend, reporter, &mut |step| {
            // Only the wait counts as load time: the rest of the loading overlapped the previous layer's compute.
            let times = ExpertTimes::default();
            let computing = Instant::now();
            let residual = Residual { hidden: &mut hidden, spans: &spans, state: &mut state };
            step.layers[0].forward(&context, residual, KvSource::Own, &times, None)?;
            let compute_wall = computing.elapsed().as_secs_f64();
            let (expert_load, expert_compute) =
                (times.load_nanos.load(Ordering::Relaxed) as f64, times.compute_nanos.load(Ordering::Relaxed) as f64);
            let expert_share =
                if expert_load + expert_compute > 0.0 { expert_load / (expert_load + expert_compute) } else { 0.0 };
            // The expert phase interleaves loading and compute across threads: split its wall time by thread time.
            let moved = times.phase_nanos.load(Ordering::Relaxed) as f64 * 1e-9 * expert_share;
            stats.load_seconds += step.waited_seconds + moved;
            stats.compute_seconds += compute_wall - moved;
            Ok(())
        })?;
        stats.near_ties = state.near_ties;

        let started = Instant::now();
        let norm = reader.parameter(config.final_norm_name(), width)?;
        let head: Matrix = reader.matrix(head_name(config, &reader), [config.vocab_size, width])?;
        stats.load_seconds += started.elapsed().as_secs_f64();
        let started = Instant::now();
        let mut mtp_load_seconds = 0.0;
        let mtp_layer = match drafts {
            Some(_) => {
                let loading = Instant::now();
                let layer = MtpLayer::load(&reader, config)?.ok_or_else(|| self.no_mtp_layer())?;
                mtp_load_seconds = loading.elapsed().as_secs_f64();
                Some(layer)
            }
            None => None,
        };
        // DeepSeek-V4's MTP layer drafts from the streams before the hyper-head.
        let streams = match &mtp_layer {
            Some(layer) if layer.drafts_from_streams() => Some(backend.row_range(&hidden, 0..hidden.rows())?),
            _ => None,
        };
        let mut hidden = narrow(backend, &reader, config, hidden)?;
        backend.rms_norm(&mut hidden, width, &norm, config.rms_norm_eps as f32)?;
        let mtp = match (drafts.as_ref(), mtp_layer) {
            (Some(&(_, depth)), Some(layer)) => {
                let source = streams.as_ref().unwrap_or(&hidden);
                let (states, mtp_spans) = layer.hidden(&context, source, sequences, &spans)?;
                let ranges: Vec<(usize, usize)> = mtp_spans.iter().collect();
                let chains = if depth > 1 {
                    chained_drafts(&context, &layer, &hidden, sequences, &spans, depth)?
                } else {
                    vec![Vec::new(); sequences.len()]
                };
                Some((layer, states, ranges, chains))
            }
            _ => None,
        };
        for (index, (start, length)) in spans.iter().enumerate() {
            let logits = backend.linear(&backend.row_range(&hidden, start..start + length)?, &head, None)?;
            sink(index, &backend.download(&logits)?)?;
            if let (Some((layer, states, ranges, chains)), Some((drafts, _))) = (&mtp, drafts.as_mut()) {
                let (start, length) = ranges[index]; // one MTP span per sequence (MtpLayer::hidden)
                drafts(index, &layer.logits(backend, states, start..start + length)?, &chains[index])?;
            }
        }
        stats.load_seconds += mtp_load_seconds;
        stats.compute_seconds += started.elapsed().as_secs_f64() - mtp_load_seconds;
        reporter.advance(1);
        reporter.end();
        Ok(stats)
    }
}
