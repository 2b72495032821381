//! `squeeze eval MODEL`: perplexity of one model on token chunks (from a text file through the model's tokenizer,
//! or a safetensors `input_ids` tensor), computed by the layer-streamed reference runtime.

pub mod kld_stats;
mod logits_file;
pub mod mtp;
mod nll;
pub mod parity;
pub mod parity_pass;
pub mod part_stats;
pub mod tasks;

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use crate::arch::Model;
use crate::chunks::{load_sequences, EvalInput, Fit};
use crate::job_error::JobError;
use crate::part::Part;
use crate::progress::Reporter;
use crate::runtime::backend::Uploads;
use crate::runtime::device::DeviceCounters;
use crate::runtime::{Backend, RuntimeError};

pub use logits_file::LogitsWriter;
pub use nll::NllStats;

#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub model: PathBuf,
    pub input: EvalInput,
    /// Evaluate at most this many chunks.
    pub chunks: Option<usize>,
    /// Write all logits as F32 `logits` `[n, ctx, vocab]` here.
    pub save_logits: Option<PathBuf>,
    /// `--part I/N`: evaluate only part I's chunks (the report covers those).
    pub part: Option<Part>,
    /// `--save-stats FILE`: write the per-position NLLs for `squeeze merge-eval`.
    pub save_stats: Option<PathBuf>,
    /// `--mtp`: also measure the MTP layer's draft acceptance.
    pub mtp: bool,
    /// `--mtp-depth K`: with `mtp`, also chain `K` drafts from every position (1: depth 1 only).
    pub mtp_depth: usize,
    /// `--allow-long-context`: chunks longer than the model's context window are run, with a warning.
    pub allow_long_context: bool,
}

/// The result of an evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub model: String,
    pub architecture: String,
    pub backend: String,
    pub chunks: usize,
    pub ctx: usize,
    /// Predicted positions (every position after the first of each chunk).
    pub tokens: usize,
    /// Mean negative log-likelihood in nats per predicted token.
    pub mean_nll: f64,
    /// Standard error of `mean_nll`.
    pub mean_nll_stderr: f64,
    pub ppl: f64,
    /// Standard error of `ppl` (`ppl · stderr(nll)`, first order).
    pub ppl_stderr: f64,
    pub seconds: f64,
    /// Tokens forwarded (chunks × ctx) per second.
    pub tokens_per_second: f64,
    pub load_seconds: f64,
    pub compute_seconds: f64,
    /// Router / DSA top-k decisions within a near-tie margin (informational).
    pub near_ties: usize,
    pub logits_file: Option<String>,
    /// Decoder layers streamed.
    pub layers: usize,
    /// Weight uploads of a device backend (absent on the CPU): with layer streaming they overlap compute, so the
    /// per-layer wall time `seconds / layers` is bounded below by `uploads.seconds / layers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uploads: Option<Uploads>,
    /// Host↔device copies by kind and kernel launches of a device backend (absent on the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceCounters>,
    /// `--mtp`: the MTP layer's draft acceptance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp: Option<mtp::DraftReport>,
    /// What the numbers should be read with (chunks beyond the context window under `--allow-long-context`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Runs the evaluation.
pub fn evaluate(options: &EvalOptions, backend: &dyn Backend, reporter: &dyn Reporter) -> Result<EvalReport, JobError> {
    evaluate_with_drafts(options, backend, reporter).map(|(report, _)| report)
}

/// [`evaluate`], and with `--mtp` the scored drafts (what a parity part file keeps).
pub fn evaluate_with_drafts(
    options: &EvalOptions,
    backend: &dyn Backend,
    reporter: &dyn Reporter,
) -> Result<(EvalReport, Option<mtp::DraftStats>), JobError> {
    let started = Instant::now();
    let model = Model::open(&options.model)?;
    let vocab = model.config().vocab_size;
    let fit =
        Fit { vocab, windows: &[&model.config().window], min_ctx: 2, allow_long_context: options.allow_long_context };
    let loaded = load_sequences(&options.input, &options.model, options.chunks, &fit)?;
    let all = loaded.sequences;
    let (sequences, chunk_range) = part_stats::select(&all, options.part)?;
    let ctx = sequences[0].len();
    let mut writer = match &options.save_logits {
        Some(path) => Some(LogitsWriter::create(path, [sequences.len(), ctx, vocab])?),
        None => None,
    };
    let mut stats = NllStats::default();
    let drafts = std::cell::RefCell::new(mtp::DraftSamples::new(options.mtp_depth));
    // The chunk and position of the first non-finite logit: the forward stops there, and a replay of that chunk
    // names where the value came from.
    let nonfinite = std::cell::Cell::new(None);
    let mut sink = |index: usize, logits: &[f32]| {
        if let Some(position) = logits.iter().position(|v| !v.is_finite()) {
            nonfinite.set(Some((index, position / vocab.max(1))));
            return Err(RuntimeError::Input(format!("chunk {index} produced a non-finite logit")));
        }
        stats.add_sequence(&sequences[index], logits, vocab);
        if options.mtp {
            drafts.borrow_mut().main(logits);
        }
        if let Some(writer) = writer.as_mut() {
            writer.append(logits).map_err(|e| RuntimeError::Output(e.to_string()))?;
        }
        Ok(())
    };
    let forward = if options.mtp {
        let mut draft_sink = |index: usize, logits: &[f32], chains: &[u32]| {
            drafts.borrow_mut().drafts(&sequences[index], logits, chains, vocab);
            Ok(())
        };
        model.forward_with_drafts(backend, &sequences, reporter, &mut sink, &mut draft_sink, options.mtp_depth)
    } else {
        model.forward(backend, &sequences, reporter, &mut sink)
    };
    let forward = match forward {
        Ok(forward) => forward,
        Err(error) => {
            if let Some(writer) = writer {
                writer.abandon();
            }
            if let Some((index, position)) = nonfinite.get() {
                return Err(nonfinite_logit(&model, options, backend, &sequences[index], index, position));
            }
            return Err(error.into());
        }
    };
    if let Some(writer) = writer {
        writer.finish()?;
    }
    let run = part_stats::EvalRun {
        model: options.model.display().to_string(),
        architecture: model.config().architecture.name().to_string(),
        backend: backend.describe(),
        ctx,
        layers: model.config().num_hidden_layers,
        seconds: started.elapsed().as_secs_f64(),
        load_seconds: forward.load_seconds,
        compute_seconds: forward.compute_seconds,
        near_ties: forward.near_ties,
        mtp_layer: options.mtp.then_some(model.config().num_hidden_layers),
        mtp_depth: options.mtp_depth,
        warnings: loaded.warnings,
    };
    let drafts = options.mtp.then(|| drafts.into_inner());
    if let Some(path) = &options.save_stats {
        let identity = crate::part::PartIdentity::of(
            &all,
            &[model.checkpoint()],
            options.part.unwrap_or(Part::WHOLE),
            chunk_range,
        );
        part_stats::write_eval(path, &identity, &run, &stats, drafts.as_ref().map(mtp::DraftSamples::stats))?;
    }
    let mut report =
        report(&run, sequences.len(), &stats, options.save_logits.as_ref().map(|p| p.display().to_string()));
    report.uploads = backend.uploads();
    report.device = backend.device_counters();
    if let (Some(drafts), Some(layer)) = (&drafts, run.mtp_layer) {
        report.mtp = Some(drafts.report(layer));
    }
    Ok((report, drafts.map(|drafts| drafts.stats().clone())))
}

/// The error of a non-finite logit at `position` of chunk `index` (`sequence`), naming where the first non-finite
/// value of that chunk's forward comes from ([`Model::locate_nonfinite`]).
fn nonfinite_logit(
    model: &Model,
    options: &EvalOptions,
    backend: &dyn Backend,
    sequence: &[u32],
    index: usize,
    position: usize,
) -> JobError {
    let source = match model.locate_nonfinite(backend, sequence) {
        Ok(Some(source)) => format!("the first non-finite value is {source}"),
        Ok(None) => {
            "a replay of the chunk alone stayed finite, so no tensor is to blame; rerun with --device cpu".into()
        }
        Err(error) => format!("replaying the chunk to find its source failed: {error}"),
    };
    JobError::Input(format!(
        "{}: chunk {index} produced a non-finite logit (token position {position}): {source}",
        options.model.display()
    ))
}

/// The report of `chunks` chunks whose NLLs are `stats` (a run's, or merged parts').
fn report(run: &part_stats::EvalRun, chunks: usize, stats: &NllStats, logits_file: Option<String>) -> EvalReport {
    let (mean_nll, mean_nll_stderr) = stats.mean_and_stderr();
    let ppl = mean_nll.exp();
    EvalReport {
        model: run.model.clone(),
        architecture: run.architecture.clone(),
        backend: run.backend.clone(),
        chunks,
        ctx: run.ctx,
        tokens: stats.count,
        mean_nll,
        mean_nll_stderr,
        ppl,
        ppl_stderr: ppl * mean_nll_stderr,
        seconds: run.seconds,
        tokens_per_second: (chunks * run.ctx) as f64 / run.seconds.max(1e-9),
        load_seconds: run.load_seconds,
        compute_seconds: run.compute_seconds,
        near_ties: run.near_ties,
        logits_file,
        layers: run.layers,
        uploads: None,
        device: None,
        mtp: None,
        warnings: run.warnings.clone(),
    }
}
