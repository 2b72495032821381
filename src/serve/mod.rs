//! `serve-test`: continuous batching of prompts through the paged KV cache: admission while pages allow, prefill
//! (optionally on another model, the KV handed over converted to the decode dtype), decode steps that verify every
//! mapping before using it, aborts of requests whose mappings disagree, and the run's report.
//!
//! This file checks the options and opens the models; [`pool_size`] sizes the pool, [`batch`] runs the requests
//! ([`speculate`] the steps of `--speculative`), [`report`] reports them.

mod batch;
mod pool_size;
pub mod prompts;
mod report;
pub mod sampling;
mod speculate;
mod speculation;

use std::path::PathBuf;

use crate::arch::paged::PagedModel;
use crate::arch::v4_kv_fp8::V4Cache;
use crate::format::kv_scales::{KvDtype, KvLayout, KvScales};
use crate::model::tokenizer::Tokenizer;
use crate::progress::Reporter;
use crate::runtime::kv_cache::Fault;
use crate::runtime::{Backend, RuntimeError};
pub use batch::eos_ids;
use batch::{check_fault, Batch};
use report::{assemble, RunFacts};
pub use report::{RequestReport, ServeReport, SpeculativeReport};
use sampling::Sampling;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("{0}")]
    Input(String),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub model: PathBuf,
    pub prefill_model: Option<PathBuf>,
    pub prompts: Vec<String>,
    pub max_new_tokens: usize,
    pub concurrency: usize,
    pub page_size: usize,
    pub kv_pages: Option<usize>,
    pub kv_dtype: KvDtype,
    pub sampling: Sampling,
    pub seed: u64,
    /// The fault and the decode step before whose verification it is injected.
    pub fault: Option<(Fault, u64)>,
    /// Verify mappings before each decode step (off only to measure its cost).
    pub verify: bool,
    /// `--speculative mtp=K`: greedy decoding verifying K chained MTP drafts per step, checked against plain greedy.
    pub speculative: Option<usize>,
    /// `--allow-long-context`: requests whose prompt and generation pass the model's context window are run, with a
    /// warning in the report.
    pub allow_long_context: bool,
}

/// Runs the smoke test; notices (missing KV scales, injected faults, aborted requests) go to `reporter`.
pub fn serve_test(
    backend: &dyn Backend,
    options: &ServeOptions,
    reporter: &dyn Reporter,
) -> Result<ServeReport, ServeError> {
    let input = |message: String| ServeError::Input(message);
    if options.prompts.is_empty() {
        return Err(input("no prompts given; pass --prompt TEXT or --prompts FILE with at least one line".into()));
    }
    if options.page_size == 0 || options.concurrency == 0 || options.max_new_tokens == 0 {
        return Err(input("--page-size, --concurrency and --max-new-tokens must be at least 1".into()));
    }
    let tokenizer = Tokenizer::from_dir(&options.model).map_err(|e| input(e.to_string()))?;
    let mut encoded = Vec::with_capacity(options.prompts.len());
    for (index, prompt) in options.prompts.iter().enumerate() {
        let ids = tokenizer.encode(prompt).map_err(|e| input(e.to_string()))?;
        if ids.is_empty() {
            return Err(input(format!("prompt {index} is empty after tokenization; remove it")));
        }
        encoded.push(ids);
    }
    check_speculative(options)?;
    let longest = encoded.iter().map(Vec::len).max().unwrap_or(0);
    let decoder = open_decoder(options, longest + options.max_new_tokens)?;
    if let Some(raw) = decoder.checkpoint().config() {
        for (index, (prompt, ids)) in options.prompts.iter().zip(&encoded).enumerate() {
            if let Some(problem) = crate::io::composite::media_in_prompt(raw, prompt, ids) {
                return Err(input(format!(
                    "prompt {index} {problem}: serve-test runs the text model only (the vision tower is carried, \
                     never run); remove the image or video from the prompt"
                )));
            }
        }
    }
    let prefiller = open_prefiller(options, &decoder, longest + options.max_new_tokens)?;
    let warnings = check_windows(options, &encoded, &decoder, prefiller.as_ref())?;
    let config = decoder.config();
    // DeepSeek-V4's FP8 caches compute their scales as rows are written: no stored scales to read.
    let scales = if options.kv_dtype == KvDtype::Fp8 && config.deepseek_v4().is_none() {
        let scales = KvScales::read(decoder.checkpoint(), config).map_err(RuntimeError::from)?;
        if let Some(warning) = scales.warning(&options.model) {
            reporter.warn(warning.strip_prefix("warning: ").unwrap_or(&warning));
        }
        scales
    } else {
        KvScales::unit(KvLayout::of(config), config.num_hidden_layers)
    };
    let mut shape = decoder.pool_shape(options.page_size, 0);
    pool_size::size_pool(&mut shape, options.kv_dtype, options.kv_pages)?;
    let need = pool_size::pages_needed(&shape, &encoded, options.max_new_tokens)?;
    check_fault(options, encoded.len(), decoder.has_states(), decoder.compressed_shape().is_some())?;

    let eos = eos_ids(decoder.checkpoint().config());
    let element_scales = decoder.element_scales(&scales);
    let new_pool = || decoder.new_pool(shape, options.kv_dtype, element_scales.clone());
    let mut pool = new_pool();
    let batch = Batch {
        backend,
        decoder: &decoder,
        prefiller: prefiller.as_ref().unwrap_or(&decoder),
        options,
        reporter,
        encoded: &encoded,
        need: &need,
        eos: &eos,
    };
    let finished = batch.run(&mut pool)?;
    // Speculative decoding must yield plain greedy decoding's tokens: decode them again without drafts (and
    // without the fault) on a pool of the same shape.
    let greedy = match options.speculative {
        Some(_) => {
            let plain = ServeOptions { speculative: None, fault: None, ..options.clone() };
            let mut plain_pool = new_pool();
            Some(Batch { options: &plain, ..batch }.run(&mut plain_pool)?)
        }
        None => None,
    };
    let facts = RunFacts {
        options,
        tokenizer: &tokenizer,
        encoded: &encoded,
        eos: &eos,
        shape,
        page_bytes: shape.page_bytes(options.kv_dtype),
        kv_scales_missing: options.kv_dtype == KvDtype::Fp8 && scales.any_missing(),
        device: backend.device_counters(),
    };
    let mut report = assemble(&facts, &pool, finished, greedy);
    report.warnings = warnings;
    Ok(report)
}

/// Every request within the context windows: the decoder's over its prompt and `--max-new-tokens` (as vLLM counts a
/// request against `max_model_len`), a `--prefill-model`'s over the prompt it prefills. Beyond one: an error naming
/// the prompt, its length, the limit and its key, or with `--allow-long-context` the report's warnings.
fn check_windows(
    options: &ServeOptions,
    encoded: &[Vec<u32>],
    decoder: &PagedModel,
    prefiller: Option<&PagedModel>,
) -> Result<Vec<String>, ServeError> {
    let mut warnings = Vec::new();
    for (index, ids) in encoded.iter().enumerate() {
        let what = format!("prompt {index} ({} tokens) + --max-new-tokens {}", ids.len(), options.max_new_tokens);
        let mut checks = vec![(decoder.config(), what, ids.len() + options.max_new_tokens)];
        if let Some(prefiller) = prefiller {
            checks.push((
                prefiller.config(),
                format!("prompt {index} ({} tokens) on --prefill-model", ids.len()),
                ids.len(),
            ));
        }
        for (config, what, positions) in checks {
            let checked = config.window.check(&what, positions, options.allow_long_context);
            if let Some(warning) = checked.map_err(ServeError::Input)? {
                warnings.push(warning);
            }
        }
    }
    Ok(warnings)
}

/// `--speculative` drafts greedily and verifies greedily: refused with sampling and with a prefill model (whose
/// hidden states the decoder's MTP layer would have to draft from).
fn check_speculative(options: &ServeOptions) -> Result<(), ServeError> {
    let Some(depth) = options.speculative else { return Ok(()) };
    let input = |message: String| Err(ServeError::Input(message));
    if depth == 0 {
        return input("--speculative mtp=K: K must be at least 1".into());
    }
    if options.sampling.temperature > 0.0 {
        return input(format!(
            "--speculative verifies greedy drafts against greedy decoding; --temperature {} samples instead: drop              --temperature (or set it to 0)",
            options.sampling.temperature
        ));
    }
    if options.prefill_model.is_some() {
        return input(
            "--speculative with --prefill-model is not supported: the MTP layer drafts from the decoding model's own              hidden states; drop one of the two"
                .into(),
        );
    }
    Ok(())
}

/// How DeepSeek-V4's caches are stored for a pool of `dtype`: an FP8 pool stores them as vLLM's fp8_ds_mla does
/// (scales computed per row, none read from the checkpoint); the 16- and 32-bit pools exactly.
fn v4_cache(dtype: KvDtype) -> V4Cache {
    if dtype == KvDtype::Fp8 {
        V4Cache::Fp8
    } else {
        V4Cache::Exact
    }
}

/// The decoding model, with its MTP layer under `--speculative`.
fn open_decoder(options: &ServeOptions, max_positions: usize) -> Result<PagedModel, ServeError> {
    let decoder = PagedModel::open(&options.model, max_positions)?.with_v4_cache(v4_cache(options.kv_dtype));
    if options.speculative.is_none() {
        return Ok(decoder);
    }
    if decoder.has_states() {
        return Err(ServeError::Input(format!(
            "--speculative mtp: {} keeps a state per request (KDA layers, or DeepSeek-V4's caches), which cannot be \
             rolled back past rejected drafts as pages are (the engines keep a state per draft position); run \
             serve-test without --speculative",
            options.model.display()
        )));
    }
    decoder.with_mtp()?.ok_or_else(|| {
        ServeError::Input(format!(
            "--speculative mtp: {} has no MTP layer (num_nextn_predict_layers is 0 or missing in config.json);              speculative decoding with MTP needs a GLM-4.5/4.6/4.7 or GLM-5/5.1/5.2 checkpoint that keeps it",
            options.model.display()
        ))
    })
}

/// The `--prefill-model`, refused unless its KV layout is the decoder's.
fn open_prefiller(
    options: &ServeOptions,
    decoder: &PagedModel,
    max_positions: usize,
) -> Result<Option<PagedModel>, ServeError> {
    let Some(dir) = &options.prefill_model else { return Ok(None) };
    let model = PagedModel::open(dir, max_positions)?.with_v4_cache(v4_cache(options.kv_dtype));
    if !model.hands_over_to(decoder) {
        return Err(ServeError::Input(format!(
            "{}: its KV layout ({} layers × {} wide) differs from {} ({} layers × {} wide); prefill and decode must be the same architecture",
            dir.display(),
            model.config().num_hidden_layers,
            model.row_width(),
            options.model.display(),
            decoder.config().num_hidden_layers,
            decoder.row_width()
        )));
    }
    Ok(Some(model))
}
