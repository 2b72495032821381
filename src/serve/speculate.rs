//! `serve-test --speculative mtp[=K]`: greedy decoding whose steps each verify up to K drafts of the MTP layer, as
//! vLLM's `--speculative-config '{"method": "mtp", "num_speculative_tokens": K}'` chains its one MTP layer.
//!
//! ```text
//! a request with tokens x_0 … x_n (x_n generated, not yet fed), main cache rows 0 … n−1, MTP rows cached up to
//! `pending.from − 1`, and the main model's normed hidden states h_t of the MTP positions `pending.from … n−1`:
//!
//! draft      MTP at pending.from … n−1 from (h_t, x_{t+1}): the rows the MTP layer caches; the last drafts d_1 = x̂_{n+1}
//!            MTP at n + j − 2 from (its own output of the previous draft, d_{j−1}) drafts d_j, for j = 2 … K
//! verify     the main model on [x_n, d_1 … d_K] at positions n … n+K (one step, rows written through the page table):
//!            g_i = argmax of position n+i; d_i is accepted while d_i = g_{i−1}
//! emit       g_0 … g_a (a drafts accepted, stopping at EOS or the request's budget): the same tokens plain greedy
//!            decoding yields, a + 1 of them for one pass of the main model
//! roll back  the request's cache back to n + a + 1 positions through [`KvPool::truncate`]: the rejected drafts'
//!            pages leave the block table and their tags are cleared; the MTP's pending positions become n … n+a
//! ```
//!
//! Drafts never run past a request's `--max-new-tokens`, so a request needs no page beyond its plain budget.

use std::time::Instant;

use crate::arch::paged::{DecodeItem, Draft, DraftItem};
use crate::runtime::device::DeviceCounters;
use crate::runtime::kv_cache::{KvPool, RequestId};

use super::batch::{Active, Batch, State};
use super::sampling::argmax;
use super::speculation::Pending;
use super::ServeError;

/// The token of `request` at `position` (prompt, then generated).
fn token_at(prompt: &[u32], request: &Active, position: usize) -> u32 {
    match position.checked_sub(prompt.len()) {
        None => prompt[position],
        Some(generated) => request.generated[generated],
    }
}

impl Batch<'_> {
    /// One speculative step of every active request (after the fault of this step, if any, is injected).
    pub(super) fn speculative_step(
        &self,
        state: &mut State,
        pool: &mut KvPool,
        depth: usize,
    ) -> Result<(), ServeError> {
        let options = self.options;
        let step_started = Instant::now();
        self.inject_scheduled_fault(state, pool)?;
        let before = self.backend.device_counters();
        let count = state.active.len();
        let mut failed: Vec<Option<String>> = vec![None; count];
        // Drafts per request: K, fewer where the budget ends sooner (a request's last token needs no draft).
        let wanted: Vec<usize> = state
            .active
            .iter()
            .map(|a| options.max_new_tokens.saturating_sub(a.generated.len() + 1).min(depth))
            .collect();
        let drafting = Instant::now();
        let drafts = self.draft(state, pool, &wanted, &mut failed)?;
        state.speculation.draft_seconds += drafting.elapsed().as_secs_f64();

        // Verification: every request's last token and its drafts, at consecutive positions, in one main-model pass.
        let mut items = Vec::new();
        let mut counts = vec![0; count];
        for (r, request) in state.active.iter().enumerate() {
            if failed[r].is_none() {
                let Some(&last) = request.generated.last() else {
                    return Err(ServeError::Input(format!("request {}: no token to decode from", request.id)));
                };
                for (i, &token) in std::iter::once(&last).chain(&drafts[r]).enumerate() {
                    items.push(DecodeItem { request: request.id, token, position: request.position + i });
                }
                counts[r] = drafts[r].len() + 1;
            }
        }
        let decoded = self.decoder.decode(self.backend, pool, &items, options.verify)?;
        state.timings.verify_seconds += decoded.verify_seconds;
        let (mut logits, mut normed) = (decoded.logits.into_iter(), decoded.normed.into_iter());
        let mut done = Vec::new();
        let stats = &mut state.speculation;
        for (r, request) in state.active.iter_mut().enumerate() {
            let outputs: Vec<_> = logits.by_ref().take(counts[r]).collect();
            let states: Vec<_> = normed.by_ref().take(counts[r]).collect();
            if failed[r].is_some() {
                continue;
            }
            let mut chosen = Vec::with_capacity(outputs.len());
            for output in outputs {
                match output {
                    Ok(logits) => chosen.push(argmax(&logits)),
                    Err(error) => {
                        failed[r] = Some(error.to_string());
                        break;
                    }
                }
            }
            if failed[r].is_some() {
                continue;
            }
            let (start, generated) = (request.position, request.generated.len());
            let mut finished = false;
            for (i, &next) in chosen.iter().enumerate() {
                request.generated.push(next);
                finished = self.eos.contains(&next) || request.generated.len() >= options.max_new_tokens;
                if finished || i == drafts[r].len() {
                    break;
                }
                stats.drafted += 1;
                stats.drafted_by_depth[i] += 1;
                if drafts[r][i] != next {
                    break;
                }
                stats.accepted += 1;
                stats.accepted_by_depth[i] += 1;
            }
            let emitted = request.generated.len() - generated;
            stats.verifications += 1;
            stats.emitted += emitted as u64;
            state.timings.decode_tokens += emitted;
            request.position = start + emitted;
            if finished {
                done.push(request.id);
                continue;
            }
            pool.truncate(request.id, request.position).map_err(|e| ServeError::Input(format!("rollback: {e}")))?;
            request.pending = Some(Pending { from: start, hidden: states.into_iter().take(emitted).collect() });
        }
        if let (Some(before), Some(after)) = (before, self.backend.device_counters()) {
            state.timings.decode_device.get_or_insert_with(DeviceCounters::default).add_span(&before, &after);
        }
        let failed: Vec<(RequestId, String)> = state
            .active
            .iter()
            .zip(failed)
            .filter_map(|(request, error)| error.map(|error| (request.id, error)))
            .collect();
        self.settle(state, pool, failed, done);
        state.timings.decode_seconds += step_started.elapsed().as_secs_f64();
        state.step += 1;
        Ok(())
    }

    /// The MTP layer's drafts, `wanted[r]` for active request `r`: a catch-up over its pending positions (mappings
    /// verified), whose last row drafts the first, then chained drafts. A request whose mappings fail gets its fault
    /// in `failed` and no drafts.
    fn draft(
        &self,
        state: &mut State,
        pool: &mut KvPool,
        wanted: &[usize],
        failed: &mut [Option<String>],
    ) -> Result<Vec<Vec<u32>>, ServeError> {
        let count = state.active.len();
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); count];
        // Per request: the position of its next chained draft and the hidden state it drafts from.
        let mut chain: Vec<Option<(usize, Vec<f32>)>> = vec![None; count];
        for round in 0..wanted.iter().copied().max().unwrap_or(0) {
            let mut items = Vec::new();
            let mut owners = Vec::new();
            for (r, request) in state.active.iter_mut().enumerate() {
                if wanted[r] <= round || failed[r].is_some() {
                    continue;
                }
                if round == 0 {
                    let prompt = &self.encoded[request.id as usize];
                    let pending =
                        request.pending.take().unwrap_or(Pending { from: request.position, hidden: Vec::new() });
                    for (k, hidden) in pending.hidden.into_iter().enumerate() {
                        let position = pending.from + k;
                        let next = token_at(prompt, request, position + 1);
                        items.push(DraftItem { request: request.id, next, position, previous: hidden });
                        owners.push(r);
                    }
                } else if let Some((position, hidden)) = chain[r].take() {
                    let next = drafts[r][round - 1];
                    items.push(DraftItem { request: request.id, next, position, previous: hidden });
                    owners.push(r);
                }
            }
            let results = self.decoder.draft(self.backend, pool, &items, round == 0 && self.options.verify)?;
            // The last item of a request in this round drafts its next token.
            let mut last: Vec<Option<(usize, Draft)>> = (0..count).map(|_| None).collect();
            for ((item, &owner), result) in items.iter().zip(&owners).zip(results) {
                match result {
                    Err(error) => {
                        failed[owner].get_or_insert(error.to_string());
                    }
                    Ok(draft) => last[owner] = Some((item.position, draft)),
                }
            }
            for (r, latest) in last.into_iter().enumerate() {
                if let (Some((position, draft)), None) = (latest, &failed[r]) {
                    drafts[r].push(argmax(&draft.logits));
                    chain[r] = Some((position + 1, draft.hidden));
                }
            }
        }
        Ok(drafts)
    }
}
