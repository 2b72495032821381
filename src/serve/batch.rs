//! Continuous batching through the paged KV cache: admission while the pool can hold a request's whole budget,
//! prefill (on the prefill model when given) and hand-over into the pool, decode steps that verify every mapping
//! before using it (one token per request, or with `--speculative` the steps of [`super::speculate`]), aborts of
//! requests whose mappings disagree, and `--inject-fault` at its step.

use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

use crate::arch::paged::{DecodeItem, PagedModel};
use crate::progress::Reporter;
use crate::runtime::device::DeviceCounters;
use crate::runtime::kv_cache::{inject, InjectedFault, KvPool, RequestId};
use crate::runtime::Backend;

use super::sampling::Rng;
use super::speculation::{Pending, SpeculationStats};
use super::{ServeError, ServeOptions};

/// How a request ended.
pub enum Finish {
    Completed,
    Aborted(String),
}

/// Token counts and wall-clock times of the run.
#[derive(Default)]
pub struct Timings {
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub verify_seconds: f64,
    /// A device backend's copies and launches during the decode steps alone (prefill and handoff excluded).
    pub decode_device: Option<DeviceCounters>,
}

/// What the batch produced: per request (in prompt order) its generated ids and how it ended.
pub struct Finished {
    pub requests: Vec<(Vec<u32>, Finish)>,
    pub injected: Vec<InjectedFault>,
    pub decode_steps: u64,
    pub timings: Timings,
    /// With `--speculative`: drafts made and accepted.
    pub speculation: Option<SpeculationStats>,
}

/// Refuses an `--inject-fault` that can never apply to these prompts (`cache_pages`: the model keeps DeepSeek-V4's
/// cache pages).
pub fn check_fault(
    options: &ServeOptions,
    prompts: usize,
    has_states: bool,
    cache_pages: bool,
) -> Result<(), ServeError> {
    let Some((fault, at)) = options.fault else { return Ok(()) };
    let kind = fault.kind;
    if fault.cache.is_some() && !cache_pages {
        return Err(ServeError::Input(format!(
            "--inject-fault {}: the model keeps no DeepSeek-V4 cache pages (window, entries, index-keys); drop \
             :{} to hit its token pages",
            fault.name(),
            fault.cache.map_or("", |cache| cache.name())
        )));
    }
    if kind.on_state() && !has_states {
        return Err(ServeError::Input(format!(
            "--inject-fault {}: the model keeps no state per request (KDA layers, DeepSeek-V4's caches), so its \
             requests hold no state slot to damage; choose a \
             page fault (stale-page, swap, out-of-range, tag-corrupt, double-map, rollback-stale)",
            fault.name()
        )));
    }
    // Each decode step advances at least one request by one token, and a request takes at most
    // max_new_tokens − 1 decode steps after its prefill.
    let most_steps = (prompts * options.max_new_tokens.saturating_sub(1)) as u64;
    if at >= most_steps {
        return Err(ServeError::Input(format!(
            "--inject-fault {}@{at}: decoding takes at most {most_steps} steps ({} prompts × (--max-new-tokens {} − 1)), \
             so the fault would never be injected; choose a STEP below {most_steps}",
            fault.name(),
            prompts,
            options.max_new_tokens
        )));
    }
    if kind.needs_two() && prompts.min(options.concurrency) < 2 {
        return Err(ServeError::Input(format!(
            "--inject-fault {} exchanges the mappings of two requests decoded together: give at least two prompts \
             and --concurrency ≥ 2",
            fault.name()
        )));
    }
    Ok(())
}

pub(super) struct Active {
    pub id: RequestId,
    pub generated: Vec<u32>,
    /// Tokens cached (= the position of the last generated token, not yet fed to the model).
    pub position: usize,
    pub rng: Rng,
    /// With `--speculative`: the MTP layer's positions not yet cached.
    pub pending: Option<Pending>,
}

/// The requests of one run and where each stands.
pub struct Batch<'a> {
    pub backend: &'a dyn Backend,
    pub decoder: &'a PagedModel,
    /// The model that prefills (the decoder itself without `--prefill-model`).
    pub prefiller: &'a PagedModel,
    pub options: &'a ServeOptions,
    pub reporter: &'a dyn Reporter,
    pub encoded: &'a [Vec<u32>],
    /// Pages each request needs for its whole budget.
    pub need: &'a [usize],
    pub eos: &'a BTreeSet<u32>,
}

pub(super) struct State {
    pending: VecDeque<usize>,
    pub active: Vec<Active>,
    finished: Vec<Option<(Vec<u32>, Finish)>>,
    injected: Vec<InjectedFault>,
    fault_rng: Rng,
    pub timings: Timings,
    pub step: u64,
    /// Pages promised to admitted requests.
    committed: usize,
    pub speculation: SpeculationStats,
}

impl Batch<'_> {
    /// Runs every request to completion or abort.
    pub fn run(&self, pool: &mut KvPool) -> Result<Finished, ServeError> {
        let count = self.encoded.len();
        let mut state = State {
            pending: (0..count).collect(),
            active: Vec::new(),
            finished: (0..count).map(|_| None).collect(),
            injected: Vec::new(),
            fault_rng: Rng::new(self.options.seed ^ 0xFA17),
            timings: Timings::default(),
            step: 0,
            committed: 0,
            speculation: SpeculationStats::new(self.options.speculative.unwrap_or(0)),
        };
        while !state.pending.is_empty() || !state.active.is_empty() {
            self.admit(&mut state, pool)?;
            if state.active.is_empty() {
                continue;
            }
            match self.options.speculative {
                Some(depth) => self.speculative_step(&mut state, pool, depth)?,
                None => self.decode_step(&mut state, pool)?,
            }
        }
        if let (Some((fault, at)), true) = (self.options.fault, state.injected.is_empty()) {
            return Err(ServeError::Input(format!(
                "--inject-fault {}@{at}: decoding ended after {} steps (requests stopped at EOS), so nothing was \
                 injected; choose a STEP below {}",
                fault.name(),
                state.step,
                state.step
            )));
        }
        Ok(Finished {
            requests: state.finished.into_iter().map(|slot| slot.expect("every request finishes")).collect(),
            injected: state.injected,
            decode_steps: state.step,
            timings: state.timings,
            speculation: self.options.speculative.map(|_| state.speculation),
        })
    }

    /// Admission: while the batch has room and the pool can hold the request's whole budget.
    fn admit(&self, state: &mut State, pool: &mut KvPool) -> Result<(), ServeError> {
        let options = self.options;
        while state.active.len() < options.concurrency {
            let Some(&index) = state.pending.front() else { break };
            if state.committed + self.need[index] > pool.shape().pages {
                break;
            }
            state.pending.pop_front();
            let id = index as RequestId;
            let started = Instant::now();
            let prefilled = self.prefiller.prefill(self.backend, &self.encoded[index])?;
            pool.open(id);
            PagedModel::hand_over(self.backend, pool, id, &prefilled)
                .map_err(|e| ServeError::Input(format!("kv cache handoff of request {id}: {e}")))?;
            state.timings.prefill_seconds += started.elapsed().as_secs_f64();
            state.timings.prefill_tokens += self.encoded[index].len();
            state.committed += self.need[index];
            let mut rng = Rng::new(options.seed ^ (id.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let first = options.sampling.choose(&prefilled.logits, &mut rng);
            let width = self.decoder.config().hidden_size;
            let pending = options.speculative.map(|_| Pending::prompt(&prefilled.normed, width));
            let request = Active { id, generated: vec![first], position: self.encoded[index].len(), rng, pending };
            if self.eos.contains(&first) || options.max_new_tokens == 1 {
                pool.release(id, false);
                state.committed -= self.need[index];
                state.finished[index] = Some((request.generated, Finish::Completed));
            } else {
                state.active.push(request);
            }
        }
        Ok(())
    }

    /// One decode step of every active request (after the fault of this step, if any, is injected).
    fn decode_step(&self, state: &mut State, pool: &mut KvPool) -> Result<(), ServeError> {
        let options = self.options;
        let step_started = Instant::now();
        self.inject_scheduled_fault(state, pool)?;
        let items: Vec<DecodeItem> = state
            .active
            .iter()
            .map(|a| DecodeItem { request: a.id, token: *a.generated.last().expect("one token"), position: a.position })
            .collect();
        // The step verifies every mapping before writing or attending through it (on a device, inside the attention
        // kernel); a request that fails is aborted and the others go on.
        let before = self.backend.device_counters();
        let decoded = self.decoder.decode(self.backend, pool, &items, options.verify)?;
        if let (Some(before), Some(after)) = (before, self.backend.device_counters()) {
            state.timings.decode_device.get_or_insert_with(DeviceCounters::default).add_span(&before, &after);
        }
        state.timings.verify_seconds += decoded.verify_seconds;
        state.timings.decode_tokens += items.len();
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for (request, logits) in state.active.iter_mut().zip(decoded.logits) {
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
            if self.eos.contains(&next) || request.generated.len() >= options.max_new_tokens {
                done.push(request.id);
            }
        }
        self.settle(state, pool, failed, done);
        state.timings.decode_seconds += step_started.elapsed().as_secs_f64();
        state.step += 1;
        Ok(())
    }

    /// Ends this step's requests: `failed` (their mappings could not be trusted) aborted with every page that names
    /// them freed, `done` completed.
    pub(super) fn settle(
        &self,
        state: &mut State,
        pool: &mut KvPool,
        failed: Vec<(RequestId, String)>,
        done: Vec<RequestId>,
    ) {
        let step = state.step;
        for (id, error) in failed {
            self.reporter.warn(&format!("aborted request {id} at decode step {step}: kv integrity: {error}"));
            pool.release(id, true);
            self.retire(state, id, Finish::Aborted(format!("kv integrity: {error}")));
        }
        for id in done {
            pool.release(id, false);
            self.retire(state, id, Finish::Completed);
        }
    }

    /// Injects `--inject-fault` when this is its step.
    pub(super) fn inject_scheduled_fault(&self, state: &mut State, pool: &mut KvPool) -> Result<(), ServeError> {
        let step = state.step;
        if let Some((fault, at)) = self.options.fault {
            if at == step {
                let ids: Vec<RequestId> = state.active.iter().map(|a| a.id).collect();
                let victim = ids[state.fault_rng.below(ids.len())];
                let Some(injected) = inject(pool, fault, victim, &ids) else {
                    return Err(ServeError::Input(format!(
                        "--inject-fault {}@{step}: the fault cannot apply at this step ({} request(s) decoding{}); \
                         choose another STEP or more prompts",
                        fault.name(),
                        ids.len(),
                        fault.cache.map_or(String::new(), |cache| format!(
                            ", request {victim} maps no {} page yet",
                            cache.name()
                        ))
                    )));
                };
                self.reporter.warn(&format!(
                    "injected {} at decode step {step}: {}",
                    fault.name(),
                    injected.description
                ));
                state.injected.push(injected);
            }
        }
        Ok(())
    }

    /// Moves an active request (its pages already released) to the finished ones.
    pub(super) fn retire(&self, state: &mut State, id: RequestId, finish: Finish) {
        let position = state.active.iter().position(|a| a.id == id).expect("retired request is active");
        let request = state.active.remove(position);
        state.committed -= self.need[id as usize];
        state.finished[id as usize] = Some((request.generated, finish));
    }
}

/// End-of-sequence ids from config.json's `eos_token_id` (a number or a list).
pub fn eos_ids(config: Option<&serde_json::Value>) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    match config.and_then(|c| c.get("eos_token_id")) {
        Some(serde_json::Value::Number(n)) => ids.extend(n.as_u64().map(|v| v as u32)),
        Some(serde_json::Value::Array(list)) => ids.extend(list.iter().filter_map(|v| v.as_u64()).map(|v| v as u32)),
        _ => {}
    }
    ids
}
