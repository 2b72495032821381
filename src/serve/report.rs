//! serve-test's report: per request its tokens, text and status; per run the pool, faults (injected, detected,
//! stopped, undetected, false positives), mapping counters and throughput; with `--speculative` the drafts' acceptance,
//! the speed-up over plain greedy decoding and whether both decoded the same tokens.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;

use crate::format::kv_scales::KvDtype;
use crate::model::tokenizer::Tokenizer;
use crate::runtime::device::DeviceCounters;
use crate::runtime::kv_cache::{InjectedFault, KindUse, KvPool, PoolShape, RequestId};

use super::batch::{Finish, Finished};
use super::speculation::SpeculationStats;
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
    /// Most bytes the per-request state slots held at once (KDA states; DeepSeek-V4's compressor projections, in f32
    /// as the runtime keeps them): memory beside the pages; 0 for models without.
    pub state_bytes_peak: usize,
    /// DeepSeek-V4: per cache kind (window, entries, index-keys) its pages' row width, bytes, peak use and the
    /// window pages freed as rows left the window.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cache_pages: Vec<KindUse>,
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
    /// With `--speculative`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeReport>,
    pub requests: Vec<RequestReport>,
    /// What the run should be read with (requests beyond the context window under `--allow-long-context`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `--speculative mtp=K`: how the MTP drafts fared and what they bought.
#[derive(Debug, Clone, Serialize)]
pub struct SpeculativeReport {
    pub method: &'static str,
    #[serde(flatten)]
    pub stats: SpeculationStats,
    /// `accepted / drafted`.
    pub acceptance_rate: f64,
    /// Per depth 1 … K: `accepted_by_depth / drafted_by_depth`.
    pub acceptance_by_depth: Vec<f64>,
    /// Tokens per pass of the main model over a request (`emitted / verifications`; 1 without drafts).
    pub mean_accepted_length: f64,
    /// Pages the rollbacks of rejected drafts returned to the free list.
    pub pages_rolled_back: u64,
    /// Plain greedy decoding of the same prompts on the same model, for the check and the speed-up.
    pub greedy_decode_steps: u64,
    pub greedy_decode_seconds: f64,
    pub greedy_decode_tokens_per_second: f64,
    /// `decode_tokens_per_second / greedy_decode_tokens_per_second`.
    pub speedup: f64,
    /// Every request that completed decoded the tokens plain greedy decoding did.
    pub identical_to_greedy: bool,
    /// Requests whose tokens differ from plain greedy decoding's.
    pub mismatched_requests: Vec<RequestId>,
}

impl ServeReport {
    /// Exit gate: every abort caused by a detected injected fault, every injected fault detected, and speculative
    /// decoding's tokens those of plain greedy decoding.
    pub fn passed(&self) -> bool {
        self.false_positives == 0
            && self.undetected == 0
            && self.speculative.as_ref().is_none_or(|speculative| speculative.identical_to_greedy)
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
pub fn assemble(facts: &RunFacts, pool: &KvPool, finished: Finished, greedy: Option<Finished>) -> ServeReport {
    let Finished { requests: outcomes, injected, decode_steps, timings, speculation } = finished;
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
            text: facts.tokenizer.decode(&shown),
            token_ids: generated,
            error,
        });
    }
    let undetected = injected
        .iter()
        .filter(|fault| fault.affected.iter().any(|&id| requests[id as usize].status != "aborted"))
        .count();
    let rate = |tokens: usize, seconds: f64| if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 };
    let decode_rate = rate(timings.decode_tokens, timings.decode_seconds);
    let speculative = speculation.zip(greedy).map(|(stats, greedy)| {
        let mismatched_requests: Vec<RequestId> = requests
            .iter()
            .zip(&greedy.requests)
            .filter(|(request, (tokens, finish))| {
                request.status == "completed" && matches!(finish, Finish::Completed) && &request.token_ids != tokens
            })
            .map(|(request, _)| request.id)
            .collect();
        let share = |part: u64, whole: u64| if whole > 0 { part as f64 / whole as f64 } else { 0.0 };
        let greedy_rate = rate(greedy.timings.decode_tokens, greedy.timings.decode_seconds);
        SpeculativeReport {
            method: "mtp",
            acceptance_rate: share(stats.accepted, stats.drafted),
            acceptance_by_depth: stats
                .accepted_by_depth
                .iter()
                .zip(&stats.drafted_by_depth)
                .map(|(&accepted, &drafted)| share(accepted, drafted))
                .collect(),
            mean_accepted_length: share(stats.emitted, stats.verifications),
            pages_rolled_back: pool.counters.pages_rolled_back,
            greedy_decode_steps: greedy.decode_steps,
            greedy_decode_seconds: greedy.timings.decode_seconds,
            greedy_decode_tokens_per_second: greedy_rate,
            speedup: if greedy_rate > 0.0 { decode_rate / greedy_rate } else { 0.0 },
            identical_to_greedy: mismatched_requests.is_empty(),
            mismatched_requests,
            stats,
        }
    });
    ServeReport {
        model: options.model.clone(),
        prefill_model: options.prefill_model.clone(),
        kv_dtype: options.kv_dtype,
        page_size: facts.shape.page_size,
        kv_pages: facts.shape.pages,
        pages_peak: pool.peak_used_pages(),
        page_bytes: facts.page_bytes,
        state_bytes_peak: pool.peak_state_bytes(),
        cache_pages: pool.cache_pages().map_or(Vec::new(), |pages| pages.usage()),
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
        decode_tokens_per_second: decode_rate,
        verify_share: if timings.decode_seconds > 0.0 { timings.verify_seconds / timings.decode_seconds } else { 0.0 },
        kv_scales_missing: facts.kv_scales_missing,
        device: facts.device,
        decode_device: timings.decode_device,
        injected,
        speculative,
        requests,
        warnings: Vec::new(),
    }
}
