//! `squeeze eval --reference REF --candidate CAND`: the four deployment modes in one layer-streamed pass, scored
//! as llama.cpp's KL mode does (each chunk's first half is the prompt, the second half is scored).
//!
//! | mode | prompt (first half) | scored (second half) |
//! |---|---|---|
//! | `reference` | REF weights, BF16 KV | REF weights, BF16 KV |
//! | `kv` | REF weights, FP8 KV | REF weights, FP8 KV |
//! | `weights` | CAND weights, BF16 KV | CAND weights, BF16 KV |
//! | `split` | REF weights, BF16 KV (the prefill node), cache handed over as FP8 | CAND weights, FP8 KV, teacher-forced |
//!
//! "BF16 KV" is the runtime's f32 cache (no rounding); FP8 KV is `decode(encode(x / s)) · s` on exactly the cached
//! values, with the scales `--kv-scales` names: `engine` (default) what the chosen engine really caches with
//! ([`crate::engines`]: CAND's `k_scale`/`v_scale` for GQA, 1.0 for MLA, dynamic per-128 tiles for GLM-5's sparse
//! MLA), `calibrated` CAND's scales (1.0 where missing, reported) or `one` 1.0 everywhere. Per layer the residual stream of every mode
//! is compared with the reference's on the scored positions (relative L2) and, on MoE layers, the routed top-k
//! expert sets (share of scored tokens whose set equals the reference's).

use std::path::PathBuf;
use std::time::Instant;

use super::kld_stats::TokenSamples;
use super::parity::{
    summarize, KvScaleChoice, KvScalesUsed, LayerSums, ModeStats, ParityOptions, ParityReport, ParityStats, Summaries,
};
use crate::arch::hyper::{narrow, widen};
use crate::arch::rope::rope_setup;
use crate::arch::{
    embed, head_name, run_layers, ExpertTimes, KvFp8, KvSource, KvTap, LayerContext, LayerState, LayerStep, LayerTap,
    Model, Residual,
};
use crate::chunks::{load_sequences, Fit};
use crate::engines::kv_scales::{kv_scale_handling, CacheLayout, ScaleUse, DYNAMIC_TILE};
use crate::format::kv_scales::{KvLayout, KvScales};
use crate::job_error::JobError;
use crate::load::weights::WeightReader;
use crate::model::config::Attention;
use crate::parity::Mode;
use crate::part::Part;
use crate::progress::Reporter;
use crate::runtime::matrix::Matrix;
use crate::runtime::rope_table::RopeTable;
use crate::runtime::{Backend, RuntimeError, Spans, Tensor};

/// One mode's running state through the layers.
struct Stream {
    mode: Mode,
    hidden: Tensor,
    state: LayerState,
    routes: Vec<Vec<usize>>,
    layers: Vec<LayerSums>,
}

/// The two models of a parity run, their readers, and the positions every mode is scored on.
struct Pass<'a> {
    reference: &'a Model,
    candidate: &'a Model,
    ref_reader: WeightReader<'a>,
    cand_reader: WeightReader<'a>,
    /// Whether a requested mode runs CAND's weights (then CAND's layers are streamed too).
    needs_candidate: bool,
    spans: Spans,
    /// Prompt tokens per chunk (the first half).
    prompt: usize,
    /// The same for each sequence.
    prompts: Vec<usize>,
    table: RopeTable,
    mla_scale: f32,
}

/// Runs every requested mode and returns the report with the gates evaluated.
pub fn evaluate_parity(
    options: &ParityOptions,
    backend: &dyn Backend,
    reporter: &dyn Reporter,
) -> Result<ParityReport, JobError> {
    let started = Instant::now();
    let (reference, candidate) = open_models(options)?;
    let config = reference.config();
    // Half of each chunk is the prompt; at least two scored positions must remain.
    let fit = Fit {
        vocab: config.vocab_size,
        windows: &[&config.window, &candidate.config().window],
        min_ctx: 4,
        allow_long_context: options.allow_long_context,
    };
    let loaded = load_sequences(&options.input, &options.reference, options.chunks, &fit)?;
    let all = loaded.sequences;
    let (sequences, chunk_range) = super::part_stats::select(&all, options.part)?;
    let ctx = sequences[0].len();
    let modes = requested_modes(&options.modes);
    let prompt = ctx / 2;
    let (kv_fp8, kv_scales) = resolve_kv_scales(options, &candidate, modes.iter().any(|m| m.fp8_kv()))?;
    if modes.iter().any(|m| m.fp8_kv()) {
        if let KvMode::Static(scales) = &kv_fp8 {
            if let Some(warning) = scales.warning(&options.candidate) {
                reporter.warn(warning.strip_prefix("warning: ").unwrap_or(&warning));
            }
        }
    }

    let pass = Pass::new(&reference, &candidate, &modes, &sequences, prompt);
    let mut streams = pass.embed(&modes, &sequences, backend)?;
    reporter.begin("layers", config.num_hidden_layers as u64 + 1);
    pass.run(&mut streams, &kv_fp8, backend, reporter)?;
    let samples = pass.score(&streams, &sequences, backend)?;
    reporter.advance(1);
    reporter.end();
    let stats = ParityStats {
        streams: streams
            .iter_mut()
            .zip(samples)
            .map(|(stream, samples)| ModeStats {
                mode: stream.mode,
                samples,
                layers: std::mem::take(&mut stream.layers),
            })
            .collect(),
        rows_per_chunk: (ctx - prompt) as u64,
        moe_layers: (0..config.num_hidden_layers).map(|layer| config.runs_moe(layer)).collect(),
    };
    let Summaries { mode_reports, json_modes, mut failures } = summarize(&stats, &modes, &options.gates)?;
    // Both models' drafts over this part's chunks: one `eval --mtp` of each; the scored positions go to the part
    // file.
    let mut draft_samples = None;
    let mtp = match options.max_mtp_drop {
        Some(max_drop) => {
            let drafts = |model: &PathBuf| -> Result<(super::mtp::DraftReport, super::mtp::DraftStats), JobError> {
                let eval = super::EvalOptions {
                    model: model.clone(),
                    input: options.input.clone(),
                    chunks: options.chunks,
                    save_logits: None,
                    part: options.part,
                    save_stats: None,
                    mtp: true,
                    mtp_depth: options.mtp_depth,
                    allow_long_context: options.allow_long_context,
                };
                let no_drafts = || JobError::Input(format!("{}: the --mtp eval reported no drafts", model.display()));
                let (report, samples) = super::evaluate_with_drafts(&eval, backend, reporter)?;
                Ok((report.mtp.ok_or_else(no_drafts)?, samples.ok_or_else(no_drafts)?))
            };
            let (reference_report, reference_samples) = drafts(&options.reference)?;
            let (candidate_report, candidate_samples) = drafts(&options.candidate)?;
            let parity = super::mtp::DraftParity::new(reference_report, candidate_report, max_drop);
            failures.extend(parity.failure());
            draft_samples = Some((reference_samples, candidate_samples));
            Some(parity)
        }
        None => None,
    };

    let report = ParityReport {
        reference: options.reference.display().to_string(),
        candidate: options.candidate.display().to_string(),
        architecture: config.architecture.name().to_string(),
        chunks: sequences.len(),
        ctx,
        prompt,
        missing_kv_scales: match &kv_fp8 {
            KvMode::Static(scales) => scales.missing_layers.clone(),
            KvMode::DynamicTiles { .. } | KvMode::DeepseekV4 => Vec::new(),
        },
        kv_scales,
        modes: json_modes,
        gates: options.gates,
        failures,
        mtp,
        warnings: loaded.warnings,
        seconds: started.elapsed().as_secs_f64(),
        mode_reports,
    };
    if let Some(path) = &options.save_stats {
        let identity = crate::part::PartIdentity::of(
            &all,
            &[reference.checkpoint(), candidate.checkpoint()],
            options.part.unwrap_or(Part::WHOLE),
            chunk_range,
        );
        let drafts = draft_samples.as_ref().map(|(reference, candidate)| (reference, candidate));
        super::part_stats::write_parity(path, &identity, &modes, &report, &stats, drafts)?;
    }
    Ok(report)
}

/// Opens REF and CAND, refusing a candidate that is not a quantization of the reference.
fn open_models(options: &ParityOptions) -> Result<(Model, Model), JobError> {
    let reference = Model::open(&options.reference)?;
    let candidate = Model::open(&options.candidate)?;
    let config = reference.config();
    let other = candidate.config();
    if (config.hidden_size, config.num_hidden_layers, config.vocab_size, config.architecture.name())
        != (other.hidden_size, other.num_hidden_layers, other.vocab_size, other.architecture.name())
    {
        return Err(JobError::Input(format!(
            "{} and {} are different models (architecture, hidden size, layers or vocabulary differ); the candidate must be a quantization of the reference",
            options.reference.display(),
            options.candidate.display()
        )));
    }
    Ok((reference, candidate))
}

/// The modes to run, in order, without repeats; all of them when none is asked for.
fn requested_modes(asked: &[Mode]) -> Vec<Mode> {
    let mut modes = asked.to_vec();
    modes.sort();
    modes.dedup();
    if modes.is_empty() {
        modes = Mode::ALL.to_vec();
    }
    modes
}

impl<'a> Pass<'a> {
    fn new(reference: &'a Model, candidate: &'a Model, modes: &[Mode], sequences: &[Vec<u32>], prompt: usize) -> Self {
        let ctx = sequences[0].len();
        let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
        let spans = Spans::new(&lengths);
        let (table, mla_scale) = rope_setup(reference.config(), ctx);
        Self {
            reference,
            candidate,
            ref_reader: WeightReader::new(reference.checkpoint()),
            cand_reader: WeightReader::new(candidate.checkpoint()),
            needs_candidate: modes.iter().any(|m| matches!(m, Mode::Weights | Mode::Split)),
            spans,
            prompt,
            prompts: vec![prompt; sequences.len()],
            table,
            mla_scale,
        }
    }

    /// One stream per mode, the reference first (it is what every mode is compared with, so it always runs), each
    /// starting from its weights' embeddings.
    fn embed(&self, modes: &[Mode], sequences: &[Vec<u32>], backend: &dyn Backend) -> Result<Vec<Stream>, JobError> {
        let ids: Vec<u32> = sequences.concat();
        let ref_embedded = embed(&self.ref_reader, self.reference.config(), &ids)?;
        let cand_embedded =
            if self.needs_candidate { embed(&self.cand_reader, self.candidate.config(), &ids)? } else { Vec::new() };
        let width = self.reference.config().hidden_size;
        let streams = std::iter::once(Mode::Reference).chain(modes.iter().copied().filter(|&m| m != Mode::Reference));
        let stream = |mode: Mode| -> Result<Stream, JobError> {
            let embedded = if matches!(mode, Mode::Weights | Mode::Split) { &cand_embedded } else { &ref_embedded };
            Ok(Stream {
                mode,
                hidden: widen(backend, self.reference.config(), backend.upload(embedded, width)?)?,
                state: LayerState { tokens: ids.clone(), ..LayerState::default() },
                routes: Vec::new(),
                layers: Vec::new(),
            })
        };
        streams.map(stream).collect()
    }

    /// Advances every stream through every decoder layer in one layer-streamed pass over REF (and CAND when a
    /// mode runs its weights), recording each mode's per-layer error against the reference.
    fn run(
        &self,
        streams: &mut [Stream],
        kv_fp8: &KvMode,
        backend: &dyn Backend,
        reporter: &dyn Reporter,
    ) -> Result<(), JobError> {
        let (config, other) = (self.reference.config(), self.candidate.config());
        let (table, mla_scale) = (&self.table, self.mla_scale);
        let ref_context = LayerContext { backend, reader: &self.ref_reader, config, table, mla_scale };
        let cand_context = LayerContext { backend, reader: &self.cand_reader, config: other, table, mla_scale };
        let models: &[&Model] =
            if self.needs_candidate { &[self.reference, self.candidate] } else { &[self.reference] };
        run_layers(models, backend, reporter, &mut |step| {
            self.advance(step, streams, kv_fp8.layer(step.index), &ref_context, &cand_context)
        })?;
        Ok(())
    }

    /// One decoder layer of every stream: the reference on REF's layer with its own cache; `kv` on REF's layer
    /// with the FP8 cache; `weights` on CAND's; `split` on CAND's with the prompt rows cached by REF's layer from
    /// the reference's residual stream.
    fn advance(
        &self,
        step: &LayerStep,
        streams: &mut [Stream],
        layer_fp8: KvFp8,
        ref_context: &LayerContext,
        cand_context: &LayerContext,
    ) -> Result<(), RuntimeError> {
        let config = self.reference.config();
        let width = config.residual_width();
        let ref_layer = &step.layers[0];
        let cand_layer = step.layers.get(1);
        let (first, rest) = streams.split_first_mut().expect("the reference stream exists");
        let prefill_hidden = ref_context.backend.row_range(&first.hidden, 0..first.hidden.rows())?;
        let times = ExpertTimes::default();
        let mut tap = LayerTap { kv: KvTap::default(), routes: Some(&mut first.routes), experts: None };
        let spans = &self.spans;
        let residual = Residual { hidden: &mut first.hidden, spans, state: &mut first.state };
        ref_layer.forward(ref_context, residual, KvSource::Own, &times, Some(&mut tap))?;
        // The per-layer error visits the host (a tap of every stream's residual stream).
        let reference_hidden = ref_context.backend.download(&first.hidden)?;
        for stream in rest.iter_mut() {
            let fp8 = if stream.mode.fp8_kv() { Some(layer_fp8) } else { None };
            let mut tap =
                LayerTap { kv: KvTap { observer: None, fp8 }, routes: Some(&mut stream.routes), experts: None };
            let (layer, context, kv) = match (stream.mode, cand_layer) {
                (Mode::Kv, _) => (ref_layer, ref_context, KvSource::Own),
                (Mode::Weights, Some(cand)) => (cand, cand_context, KvSource::Own),
                (Mode::Split, Some(cand)) => (
                    cand,
                    cand_context,
                    KvSource::Split { prefill: ref_layer, prefill_input: &prefill_hidden, prompt: &self.prompts },
                ),
                _ => unreachable!("the candidate layer is loaded for the modes that use it"),
            };
            let residual = Residual { hidden: &mut stream.hidden, spans, state: &mut stream.state };
            layer.forward(context, residual, kv, &times, Some(&mut tap))?;
            let moe = config.runs_moe(step.index);
            let hidden = context.backend.download(&stream.hidden)?;
            let mut sums = LayerSums::default();
            for rows in self.scored_rows_by_chunk() {
                let (difference, norm) = squared_sums(&hidden, &reference_hidden, rows.clone(), width);
                sums.difference.push(difference);
                sums.norm.push(norm);
                if moe {
                    sums.same_routes.push(same_routes(&stream.routes, &first.routes, rows));
                }
            }
            stream.layers.push(sums);
        }
        // The reference against itself: no difference, every route the same.
        let chunks = self.spans.iter().count();
        first.layers.push(LayerSums {
            difference: vec![0.0; chunks],
            norm: vec![0.0; chunks],
            same_routes: if config.runs_moe(step.index) {
                self.scored_rows_by_chunk().map(|rows| rows.len() as u64).collect()
            } else {
                Vec::new()
            },
        });
        Ok(())
    }

    /// Each chunk's scored rows (flat row indices).
    fn scored_rows_by_chunk(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        let prompt = self.prompt;
        self.spans.iter().map(move |(start, length)| start + prompt.min(length)..start + length)
    }

    /// Final norm and head — REF's for the modes on REF weights, CAND's for the others — on the scored rows only,
    /// and each mode's per-token statistics against the reference's logits.
    fn score(
        &self,
        streams: &[Stream],
        sequences: &[Vec<u32>],
        backend: &dyn Backend,
    ) -> Result<Vec<TokenSamples>, JobError> {
        let (config, other) = (self.reference.config(), self.candidate.config());
        let (width, vocab) = (config.hidden_size, config.vocab_size);
        let (ref_reader, cand_reader) = (&self.ref_reader, &self.cand_reader);
        let prompt = self.prompt;
        let ctx = sequences[0].len();
        let ref_norm = ref_reader.parameter(config.final_norm_name(), width)?;
        let ref_head: Matrix = ref_reader.matrix(head_name(config, ref_reader), [vocab, width])?;
        let cand_parts = if self.needs_candidate {
            Some((
                cand_reader.parameter(other.final_norm_name(), width)?,
                cand_reader.matrix(head_name(other, cand_reader), [vocab, width])?,
            ))
        } else {
            None
        };
        let rows_per_seq = ctx - 1 - prompt;
        let logits_of = |stream: &Stream, start: usize| -> Result<Vec<f32>, RuntimeError> {
            let (norm, head, reader) = match (stream.mode, &cand_parts) {
                (Mode::Weights | Mode::Split, Some((norm, head))) => (norm, head, cand_reader),
                _ => (&ref_norm, &ref_head, ref_reader),
            };
            let rows = backend.row_range(&stream.hidden, start + prompt..start + prompt + rows_per_seq)?;
            let mut rows = narrow(backend, reader, config, rows)?;
            backend.rms_norm(&mut rows, width, norm, config.rms_norm_eps as f32)?;
            backend.download(&backend.linear(&rows, head, None)?)
        };
        let mut samples: Vec<TokenSamples> = vec![TokenSamples::default(); streams.len()];
        for (sequence, (start, _)) in self.spans.iter().enumerate() {
            let base = logits_of(&streams[0], start)?;
            for (stream, sample) in streams.iter().zip(samples.iter_mut()) {
                let logits = if stream.mode == Mode::Reference { base.clone() } else { logits_of(stream, start)? };
                for row in 0..rows_per_seq {
                    let target = sequences[sequence][prompt + row + 1] as usize;
                    sample.add(&base[row * vocab..][..vocab], &logits[row * vocab..][..vocab], target);
                }
            }
        }
        Ok(samples)
    }
}

/// The FP8 KV storage of the FP8-KV modes, resolved for every layer.
enum KvMode {
    Static(KvScales),
    DynamicTiles { latent: usize },
    DeepseekV4,
}

impl KvMode {
    fn layer(&self, index: usize) -> KvFp8<'_> {
        match self {
            KvMode::Static(scales) => KvFp8::Static(&scales.layers[index]),
            KvMode::DynamicTiles { latent } => KvFp8::DynamicTiles { tile: DYNAMIC_TILE, latent: *latent },
            KvMode::DeepseekV4 => KvFp8::DeepseekV4,
        }
    }
}

/// Resolves `--kv-scales` (and `--engine`) against the candidate's cache layout.
fn resolve_kv_scales(
    options: &ParityOptions,
    candidate: &Model,
    fp8_modes: bool,
) -> Result<(KvMode, KvScalesUsed), JobError> {
    let config = candidate.config();
    let layout = CacheLayout::of(config);
    let handling = kv_scale_handling(options.engine, layout);
    let (applied, reason) = match options.kv_scales {
        KvScaleChoice::Engine => (handling.uses, format!("{}: {}", options.engine.label(), handling.summary)),
        KvScaleChoice::Calibrated => {
            (ScaleUse::Checkpoint, "--kv-scales calibrated: the candidate's k_scale/v_scale".into())
        }
        KvScaleChoice::One => (ScaleUse::Unit, "--kv-scales one: scale 1.0 in every layer".into()),
    };
    if fp8_modes && layout == CacheLayout::Compressed && applied != ScaleUse::PowerOfTwoTiles {
        return Err(JobError::Input(format!(
            "--kv-scales {}: DeepSeek-V4's FP8 caches take no stored scales (each row's are computed as it is \
             written); use --kv-scales engine",
            if options.kv_scales == KvScaleChoice::One { "one" } else { "calibrated" }
        )));
    }
    let mode = match applied {
        _ if layout == CacheLayout::Compressed => KvMode::DeepseekV4,
        ScaleUse::PowerOfTwoTiles => KvMode::DeepseekV4,
        ScaleUse::Checkpoint => KvMode::Static(KvScales::read(candidate.checkpoint(), config)?),
        ScaleUse::Unit => KvMode::Static(KvScales::unit(KvLayout::of(config), config.num_hidden_layers)),
        ScaleUse::DynamicTiles => match &config.attention {
            Attention::Mla { kv_lora_rank, .. } => KvMode::DynamicTiles { latent: *kv_lora_rank },
            Attention::Gqa { .. } => {
                return Err(JobError::Input("dynamic-tile FP8 caches exist only for MLA models".into()))
            }
        },
    };
    Ok((mode, KvScalesUsed { choice: options.kv_scales, engine: options.engine, layout, applied, reason }))
}

/// Σ (a − b)² and Σ b² over the rows.
fn squared_sums(a: &[f32], b: &[f32], rows: std::ops::Range<usize>, width: usize) -> (f64, f64) {
    let (mut difference, mut norm) = (0f64, 0f64);
    for row in rows {
        for (x, y) in a[row * width..(row + 1) * width].iter().zip(&b[row * width..(row + 1) * width]) {
            difference += ((x - y) as f64).powi(2);
            norm += (*y as f64).powi(2);
        }
    }
    (difference, norm)
}

/// Rows whose expert sets agree.
fn same_routes(routes: &[Vec<usize>], reference: &[Vec<usize>], rows: std::ops::Range<usize>) -> u64 {
    rows.filter(|&row| {
        let (mut a, mut b) =
            (routes.get(row).cloned().unwrap_or_default(), reference.get(row).cloned().unwrap_or_default());
        a.sort_unstable();
        b.sort_unstable();
        a == b
    })
    .count() as u64
}
