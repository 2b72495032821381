//! serve-test's report: per request its tokens, text and status; per run the pool, faults (injected, detected,
//! stopped, undetected, false positives), mapping counters and throughput.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;

use crate::format::kv_scales::KvDtype;
use crate::model::tokenizer::Tokenizer;
use crate::runtime::device::DeviceCounters;
use crate::runtime::kv_cache::{InjectedFault, KvPool, PoolShape, RequestId};

use super::batch::{Finish, Finished};
use super::ServeOptions;

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
    /// Host↔device copies by kind and kernel launches of a device backend (absent on the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceCounters>,
    /// The part of `device` spent in the `decode_steps` decode steps (prefill and KV handoff excluded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_device: Option<DeviceCounters>,
    pub injected: Vec<InjectedFault>,
    pub requests: Vec<RequestReport>,
}

impl ServeReport {
    /// Exit gate: every abort caused by a detected injected fault, and every injected fault detected.
    pub fn passed(&self) -> bool {
        self.false_positives == 0 && self.undetected == 0
    }
}

/// What the report is made of besides the batch's outcome.
pub struct RunFacts<'a> {
    pub options: &'a ServeOptions,
    pub tokenizer: &'a Tokenizer,
    pub encoded: &'a [Vec<u32>],
    pub eos: &'a BTreeSet<u32>,
    pub shape: PoolShape,
    pub page_bytes: usize,
    pub kv_scales_missing: bool,
    pub device: Option<DeviceCounters>,
}

/// The report of a finished run: statuses, false positives (aborts no injected fault explains) and undetected
/// faults (some request they affected completed).
pub fn assemble(facts: &RunFacts, pool: &KvPool, finished: Finished) -> ServeReport {
    let Finished { requests: outcomes, injected, decode_steps, timings } = finished;
    let options = facts.options;
    let affected: BTreeSet<RequestId> = injected.iter().flat_map(|f| f.affected.iter().copied()).collect();
    let mut requests = Vec::with_capacity(facts.encoded.len());
    let (mut completed, mut aborted, mut false_positives) = (0, 0, 0);
    for (index, (generated, finish)) in outcomes.into_iter().enumerate() {
        let shown: Vec<u32> = generated.iter().copied().filter(|t| !facts.eos.contains(t)).collect();
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
            prompt_token_ids: facts.encoded[index].clone(),
            status,
            tokens: generated.len(),
            text: decode_text(facts.tokenizer, &shown),
            token_ids: generated,
            error,
        });
    }
    let undetected = injected
        .iter()
        .filter(|fault| fault.affected.iter().any(|&id| requests[id as usize].status != "aborted"))
        .count();
    let rate = |tokens: usize, seconds: f64| if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 };
    ServeReport {
        model: options.model.clone(),
        prefill_model: options.prefill_model.clone(),
        kv_dtype: options.kv_dtype,
        page_size: facts.shape.page_size,
        kv_pages: facts.shape.pages,
        pages_peak: pool.peak_used_pages(),
        page_bytes: facts.page_bytes,
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
        decode_steps,
        prefill_tokens: timings.prefill_tokens,
        decode_tokens: timings.decode_tokens,
        prefill_seconds: timings.prefill_seconds,
        decode_seconds: timings.decode_seconds,
        verify_seconds: timings.verify_seconds,
        prefill_tokens_per_second: rate(timings.prefill_tokens, timings.prefill_seconds),
        decode_tokens_per_second: rate(timings.decode_tokens, timings.decode_seconds),
        verify_share: if timings.decode_seconds > 0.0 { timings.verify_seconds / timings.decode_seconds } else { 0.0 },
        kv_scales_missing: facts.kv_scales_missing,
        device: facts.device,
        decode_device: timings.decode_device,
        injected,
        requests,
    }
}

fn decode_text(tokenizer: &Tokenizer, ids: &[u32]) -> String {
    match tokenizer {
        Tokenizer::HuggingFace(t) => t.decode(ids, false).unwrap_or_default(),
        Tokenizer::TikToken(bpe) => {
            bpe.decode_bytes(ids).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default()
        }
    }
}
