//! `serve-test`: continuous batching of prompts through the paged KV cache: admission while pages allow, prefill
//! (optionally on another model, the KV handed over converted to the decode dtype), decode steps that verify every
//! mapping before using it, aborts of requests whose mappings disagree, and the run's report.

pub mod decoder;
pub mod prompts;
pub mod sampling;

use std::collections::{BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use crate::model::tokenizer::Tokenizer;
use crate::progress::Reporter;
use crate::runtime::kv_cache::{inject, FaultKind, InjectedFault, KvDtype, KvPool, PoolShape, RequestId};
use crate::runtime::kv_scales::{KvLayout, KvScales};
use crate::runtime::{Backend, RuntimeError};
use decoder::{DecodeItem, DecodeModel};
use sampling::{Rng, Sampling};

/// Pool size when `--kv-pages` is not given: this share of available memory, at most `MAX_DEFAULT_PAGES`.
const DEFAULT_MEMORY_SHARE: f64 = 0.25;
const MAX_DEFAULT_PAGES: usize = 1 << 16;

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
    /// Fault kind and the decode step before whose verification it is injected.
    pub fault: Option<(FaultKind, u64)>,
    /// Verify mappings before each decode step (off only to measure its cost).
    pub verify: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct RequestReport {
    pub id: RequestId,
    pub prompt: String,
    /// The prompt's token ids as decoded from (what an engine oracle is fed to see the same input).
    pub prompt_token_ids: Vec<u32>,
    pub status: &'static str,
    /// Number of generated tokens.
    pub tokens: usize,
    pub token_ids: Vec<u32>,
    /// The completion only.
    pub text: String,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServeReport {
    pub model: PathBuf,
    pub prefill_model: Option<PathBuf>,
    pub kv_dtype: KvDtype,
    pub page_size: usize,
    pub kv_pages: usize,
    pub pages_peak: usize,
    pub page_bytes: usize,
    pub concurrency: usize,
    pub completed: usize,
    pub aborted: usize,
    pub faults_injected: usize,
    pub faults_detected: u64,
    /// Injected faults all of whose requests were aborted: by the page verification or, with `--no-verify`, by a
    /// bounds check. `faults_injected = faults_stopped + undetected`.
    pub faults_stopped: usize,
    pub false_positives: usize,
    /// Injected faults some of whose requests finished without being aborted.
    pub undetected: usize,
    pub mappings_verified: u64,
    pub requests_aborted: u64,
    pub decode_steps: u64,
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub verify_seconds: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    /// `verify_seconds / decode_seconds` (decode time includes verification).
    pub verify_share: f64,
    pub kv_scales_missing: bool,
    pub injected: Vec<InjectedFault>,
    pub requests: Vec<RequestReport>,
}

impl ServeReport {
    /// Exit gate: every abort caused by a detected injected fault, and every injected fault detected.
    pub fn passed(&self) -> bool {
        self.false_positives == 0 && self.undetected == 0
    }
}

struct Active {
    id: RequestId,
    generated: Vec<u32>,
    position: usize,
    rng: Rng,
}

enum Finish {
    Completed,
    Aborted(String),
}

fn eos_ids(config: Option<&serde_json::Value>) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    match config.and_then(|c| c.get("eos_token_id")) {
        Some(serde_json::Value::Number(n)) => ids.extend(n.as_u64().map(|v| v as u32)),
        Some(serde_json::Value::Array(list)) => ids.extend(list.iter().filter_map(|v| v.as_u64()).map(|v| v as u32)),
        _ => {}
    }
    ids
}

fn decode_text(tokenizer: &Tokenizer, ids: &[u32]) -> String {
    match tokenizer {
        Tokenizer::HuggingFace(t) => t.decode(ids, false).unwrap_or_default(),
        Tokenizer::TikToken(bpe) => {
            bpe.decode_bytes(ids).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default()
        }
    }
}

fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// Runs the prompts to completion (or abort) and reports.
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
    let longest = encoded.iter().map(Vec::len).max().unwrap_or(0);
    let decoder = DecodeModel::open(&options.model, longest + options.max_new_tokens)?;
    let prefiller = match &options.prefill_model {
        Some(dir) => {
            let model = DecodeModel::open(dir, longest + options.max_new_tokens)?;
            if model.row_width() != decoder.row_width()
                || model.aux_width() != decoder.aux_width()
                || model.config().num_hidden_layers != decoder.config().num_hidden_layers
            {
                return Err(input(format!(
                    "{}: its KV layout ({} layers × {} wide) differs from {} ({} layers × {} wide); prefill and decode must be the same architecture",
                    dir.display(),
                    model.config().num_hidden_layers,
                    model.row_width(),
                    options.model.display(),
                    decoder.config().num_hidden_layers,
                    decoder.row_width()
                )));
            }
            Some(model)
        }
        None => None,
    };
    let config = decoder.config();
    let layout = KvLayout::of(config);
    let scales = if options.kv_dtype == KvDtype::Fp8 {
        let scales = KvScales::read(decoder.checkpoint(), config)?;
        if let Some(warning) = scales.warning(&options.model) {
            reporter.warn(warning.strip_prefix("warning: ").unwrap_or(&warning));
        }
        scales
    } else {
        KvScales::unit(layout, config.num_hidden_layers)
    };
    let mut shape = PoolShape {
        layers: config.num_hidden_layers,
        row_width: decoder.row_width(),
        aux_width: decoder.aux_width(),
        page_size: options.page_size,
        pages: 0,
    };
    let page_bytes = shape.page_bytes(options.kv_dtype);
    let available = available_memory().unwrap_or(1 << 30);
    shape.pages = match options.kv_pages {
        Some(pages) => pages,
        None => {
            let memory = available as f64 * DEFAULT_MEMORY_SHARE;
            ((memory / page_bytes as f64) as usize).clamp(1, MAX_DEFAULT_PAGES)
        }
    };
    // The pool is allocated up front: refuse one that does not fit rather than abort on allocation.
    let pool_bytes = (shape.pages as u64).checked_mul(page_bytes as u64);
    if pool_bytes.is_none_or(|bytes| bytes > available) {
        return Err(ServeError::Input(format!(
            "the KV pool of {} pages × {} bytes (--page-size {} tokens, {} layers) needs {} but {} of memory is \
             available; lower --page-size or --kv-pages",
            shape.pages,
            page_bytes,
            shape.page_size,
            shape.layers,
            pool_bytes.map_or("more than 2^64 bytes".into(), crate::units::both_units),
            crate::units::both_units(available)
        )));
    }
    let need: Vec<usize> = encoded.iter().map(|p| shape.pages_for(p.len() + options.max_new_tokens)).collect();
    for (index, prompt) in encoded.iter().enumerate() {
        if shape.pages_for(prompt.len()) > shape.pages {
            return Err(input(format!(
                "prompt {index} has {} tokens, longer than the KV pool ({} pages × {} tokens = {}); raise --kv-pages or --page-size",
                prompt.len(),
                shape.pages,
                shape.page_size,
                shape.pages * shape.page_size
            )));
        }
        if need[index] > shape.pages {
            return Err(input(format!(
                "--kv-pages {} is too small for one request: prompt {index} ({} tokens) + --max-new-tokens {} needs {} pages of {} tokens; raise --kv-pages",
                shape.pages, prompt.len(), options.max_new_tokens, need[index], shape.page_size
            )));
        }
    }

    if let Some((kind, at)) = options.fault {
        // Each decode step advances at least one request by one token, and a request takes at most
        // max_new_tokens − 1 decode steps after its prefill.
        let most_steps = (encoded.len() * options.max_new_tokens.saturating_sub(1)) as u64;
        if at >= most_steps {
            return Err(input(format!(
                "--inject-fault {}@{at}: decoding takes at most {most_steps} steps ({} prompts × (--max-new-tokens {} − 1)), \
                 so the fault would never be injected; choose a STEP below {most_steps}",
                kind.name(),
                encoded.len(),
                options.max_new_tokens
            )));
        }
        if kind == FaultKind::Swap && encoded.len().min(options.concurrency) < 2 {
            return Err(input(
                "--inject-fault swap exchanges pages of two requests decoded together: give at least two prompts and \
                 --concurrency ≥ 2"
                    .into(),
            ));
        }
    }
    let eos = eos_ids(config_json(&decoder));
    let mut pool = KvPool::new(shape, options.kv_dtype, decoder.element_scales(&scales));
    let mut pending: VecDeque<usize> = (0..encoded.len()).collect();
    let mut active: Vec<Active> = Vec::new();
    let mut finished: Vec<Option<(Vec<u32>, Finish)>> = (0..encoded.len()).map(|_| None).collect();
    let mut injected: Vec<InjectedFault> = Vec::new();
    let mut fault_rng = Rng::new(options.seed ^ 0xFA17);
    let (mut prefill_seconds, mut decode_seconds, mut verify_seconds) = (0.0, 0.0, 0.0);
    let (mut prefill_tokens, mut decode_tokens) = (0, 0);
    let mut step: u64 = 0;
    let mut committed = 0usize;

    while !pending.is_empty() || !active.is_empty() {
        // Admission: while the batch has room and the pool can hold the request's whole budget.
        while active.len() < options.concurrency {
            let Some(&index) = pending.front() else { break };
            if committed + need[index] > shape.pages {
                break;
            }
            pending.pop_front();
            let id = index as RequestId;
            let started = Instant::now();
            let prefilled = prefiller.as_ref().unwrap_or(&decoder).prefill(backend, &encoded[index])?;
            pool.open(id);
            DecodeModel::hand_over(backend, &mut pool, id, &prefilled)
                .map_err(|e| input(format!("kv cache handoff of request {id}: {e}")))?;
            prefill_seconds += started.elapsed().as_secs_f64();
            prefill_tokens += encoded[index].len();
            committed += need[index];
            let mut rng = Rng::new(options.seed ^ (id.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let first = options.sampling.choose(&prefilled.logits, &mut rng);
            let request = Active { id, generated: vec![first], position: encoded[index].len(), rng };
            if eos.contains(&first) || options.max_new_tokens == 1 {
                pool.release(id, false);
                committed -= need[index];
                finished[index] = Some((request.generated, Finish::Completed));
            } else {
                active.push(request);
            }
        }
        if active.is_empty() {
            continue;
        }

        let step_started = Instant::now();
        if let Some((kind, at)) = options.fault {
            if at == step {
                let ids: Vec<RequestId> = active.iter().map(|a| a.id).collect();
                let victim = ids[fault_rng.below(ids.len())];
                let Some(fault) = inject(&mut pool, kind, victim, &ids) else {
                    return Err(input(format!(
                        "--inject-fault {}@{step}: the fault cannot apply at this step ({} request(s) decoding); \
                         choose another STEP or more prompts",
                        kind.name(),
                        ids.len()
                    )));
                };
                reporter.warn(&format!("injected {} at decode step {step}: {}", kind.name(), fault.description));
                injected.push(fault);
            }
        }
        let items: Vec<DecodeItem> = active
            .iter()
            .map(|a| DecodeItem { request: a.id, token: *a.generated.last().expect("one token"), position: a.position })
            .collect();
        // The step verifies every mapping before writing or attending through it (on a device, inside the attention
        // kernel); a request that fails is aborted and the others go on.
        let decoded = decoder.decode(backend, &mut pool, &items, options.verify)?;
        verify_seconds += decoded.verify_seconds;
        decode_tokens += items.len();
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for (request, logits) in active.iter_mut().zip(decoded.logits) {
            let logits = match logits {
                Ok(logits) => logits,
                Err(error) => {
                    failed.push((request.id, error.to_string()));
                    continue;
                }
            };
            let next = options.sampling.choose(&logits, &mut request.rng);
            request.generated.push(next);
            request.position += 1;
            if eos.contains(&next) || request.generated.len() >= options.max_new_tokens {
                done.push(request.id);
            }
        }
        for (id, error) in failed {
            reporter.warn(&format!("aborted request {id} at decode step {step}: kv integrity: {error}"));
            pool.release(id, true);
            let position = active.iter().position(|a| a.id == id).expect("failed request is active");
            let request = active.remove(position);
            committed -= need[id as usize];
            finished[id as usize] = Some((request.generated, Finish::Aborted(format!("kv integrity: {error}"))));
        }
        for id in done {
            pool.release(id, false);
            let position = active.iter().position(|a| a.id == id).expect("done request is active");
            let request = active.remove(position);
            committed -= need[id as usize];
            finished[id as usize] = Some((request.generated, Finish::Completed));
        }
        decode_seconds += step_started.elapsed().as_secs_f64();
        step += 1;
    }

    if let (Some((kind, at)), true) = (options.fault, injected.is_empty()) {
        return Err(input(format!(
            "--inject-fault {}@{at}: decoding ended after {step} steps (requests stopped at EOS), so nothing was \
             injected; choose a STEP below {step}",
            kind.name()
        )));
    }
    let affected: BTreeSet<RequestId> = injected.iter().flat_map(|f| f.affected.iter().copied()).collect();
    let mut requests = Vec::with_capacity(encoded.len());
    let (mut completed, mut aborted, mut false_positives) = (0, 0, 0);
    for (index, slot) in finished.into_iter().enumerate() {
        let (generated, finish) = slot.expect("every request finishes");
        let shown: Vec<u32> = generated.iter().copied().filter(|t| !eos.contains(t)).collect();
        let (status, error) = match finish {
            Finish::Completed => {
                completed += 1;
                ("completed", None)
            }
            Finish::Aborted(error) => {
                aborted += 1;
                if !affected.contains(&(index as RequestId)) {
                    false_positives += 1;
                }
                ("aborted", Some(error))
            }
        };
        requests.push(RequestReport {
            id: index as RequestId,
            prompt: options.prompts[index].clone(),
            prompt_token_ids: encoded[index].clone(),
            status,
            tokens: generated.len(),
            text: decode_text(&tokenizer, &shown),
            token_ids: generated,
            error,
        });
    }
    let undetected = injected
        .iter()
        .filter(|fault| fault.affected.iter().any(|&id| requests[id as usize].status != "aborted"))
        .count();
    let rate = |tokens: usize, seconds: f64| if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 };
    Ok(ServeReport {
        model: options.model.clone(),
        prefill_model: options.prefill_model.clone(),
        kv_dtype: options.kv_dtype,
        page_size: shape.page_size,
        kv_pages: shape.pages,
        pages_peak: pool.peak_used_pages(),
        page_bytes,
        concurrency: options.concurrency,
        completed,
        aborted,
        faults_injected: injected.len(),
        faults_stopped: injected.len() - undetected,
        faults_detected: pool.counters.faults_detected,
        false_positives,
        undetected,
        mappings_verified: pool.counters.mappings_verified,
        requests_aborted: pool.counters.requests_aborted,
        decode_steps: step,
        prefill_tokens,
        decode_tokens,
        prefill_seconds,
        decode_seconds,
        verify_seconds,
        prefill_tokens_per_second: rate(prefill_tokens, prefill_seconds),
        decode_tokens_per_second: rate(decode_tokens, decode_seconds),
        verify_share: if decode_seconds > 0.0 { verify_seconds / decode_seconds } else { 0.0 },
        kv_scales_missing: options.kv_dtype == KvDtype::Fp8 && scales.any_missing(),
        injected,
        requests,
    })
}

fn config_json(decoder: &DecodeModel) -> Option<&serde_json::Value> {
    decoder.checkpoint().config()
}
