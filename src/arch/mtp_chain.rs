//! `eval --mtp-depth K`: chained MTP drafts from every position of whole sequences, made as speculative decoding
//! makes them. vLLM and SGLang chain their one MTP layer: draft `j` of a step reads draft `j − 1`'s greedy token
//! and the layer's own output for it (instead of the main model's hidden state), one position further, attending
//! over the layer's cached rows of the verified positions and the chain's own rows. The layer-streamed forward
//! drafts depth 1 for every position at once ([`super::mtp`]); a chain's later drafts attend over rows no other
//! position sees, so here they run as paged steps of the MTP layer alone, over a pool of that one layer:
//!
//! ```text
//! for t in 0.. (every sequence in one batch):
//!     row t       ← the main model's hidden state at t, token t + 1      (the catch-up; its draft is depth 1)
//!     rows t + 1 … t + K − 1 ← the previous draft's output and greedy token (depths 2 … K)
//!     roll the request back to t + 1 rows
//! ```
//!
//! Draft `j` from position `t` proposes token `t + j + 1`; the main model's greedy choice for it is its argmax at
//! row `t + j`. Chains start at every `t` whose `K` drafts all have such a row (`t + K ≤ len − 1`).

use super::context::LayerContext;
use super::mtp::MtpLayer;
use super::paged::{DraftItem, Stepping};
use crate::metrics::argmax;
use crate::runtime::kv_cache::{KvDtype, KvPool, PoolShape, RequestId};
use crate::runtime::{RuntimeError, Spans, Tensor};

/// Most drafts chained per step, here and in `serve-test --speculative` (the drafts of one step are verified in one
/// pass; beyond a few, rejection dominates).
pub const MAX_DEPTH: usize = 16;

/// Rows of the chain's pool per page.
const PAGE_SIZE: usize = 16;

/// The starts of a sequence of `len` tokens whose `depth` chained drafts can all be checked.
pub fn chain_starts(len: usize, depth: usize) -> usize {
    len.saturating_sub(depth)
}

/// Per sequence, the greedy tokens of `depth` chained drafts from each start `t` in `0..chain_starts(len, depth)`,
/// `[starts, depth]` row-major. `normed` holds the main model's hidden states after its final norm, `[Σ len,
/// hidden]` in `spans`; `context.table` must cover every sequence's positions.
pub fn chained_drafts(
    context: &LayerContext,
    mtp: &MtpLayer,
    normed: &Tensor,
    sequences: &[Vec<u32>],
    spans: &Spans,
    depth: usize,
) -> Result<Vec<Vec<u32>>, RuntimeError> {
    let LayerContext { backend, reader, config, table, mla_scale } = *context;
    let stepping = Stepping { config, table, mla_scale, v4_cache: Default::default() };
    let width = config.hidden_size;
    let host = backend.download(normed)?;
    let starts: Vec<usize> = sequences.iter().map(|s| chain_starts(s.len(), depth)).collect();
    let shape = PoolShape {
        layers: 1,
        row_width: stepping.row_width(),
        aux_width: stepping.aux_width(),
        page_size: PAGE_SIZE,
        pages: sequences.iter().map(|s| s.len().div_ceil(PAGE_SIZE)).sum(),
    };
    // f32 rows with unit scales: the chain attends exactly what the layer-streamed forward attends.
    let mut pool = KvPool::new(shape, KvDtype::F32, vec![vec![1.0; shape.row_width]]);
    for request in 0..sequences.len() {
        pool.open(request as RequestId);
    }
    let mut chains: Vec<Vec<u32>> = starts.iter().map(|&n| Vec::with_capacity(n * depth)).collect();
    let spans: Vec<(usize, usize)> = spans.iter().collect();
    for t in 0..starts.iter().copied().max().unwrap_or(0) {
        let active: Vec<usize> = (0..sequences.len()).filter(|&s| t < starts[s]).collect();
        let mut items: Vec<DraftItem> = active
            .iter()
            .map(|&s| DraftItem {
                request: s as RequestId,
                next: sequences[s][t + 1],
                position: t,
                previous: host[(spans[s].0 + t) * width..][..width].to_vec(),
            })
            .collect();
        for j in 1..=depth {
            let drafts = stepping.draft(backend, &mut pool, reader, (0, mtp), &items, true)?;
            for (item, draft) in items.iter_mut().zip(drafts) {
                let draft = draft?;
                let token = argmax(&draft.logits);
                chains[item.request as usize].push(token);
                *item = DraftItem { next: token, position: t + j, previous: draft.hidden, ..*item };
            }
        }
        for &s in &active {
            pool.truncate(s as RequestId, t + 1)?;
        }
    }
    Ok(chains)
}
