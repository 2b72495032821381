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

use super::layer::LayerContext;
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
    let stepping = Stepping { config, table, mla_scale };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layer::LayerState;
    use crate::arch::moe::ExpertTimes;
    use crate::arch::paged::PagedModel;
    use crate::arch::rope::rope_setup;
    use crate::arch::tap::KvSource;
    use crate::load::open::open_checkpoint;
    use crate::load::weights::WeightReader;
    use crate::runtime::{Backend, Cpu};
    use crate::synth::{synth, SynthArch, SynthOptions, SynthSize};

    /// The pool's chains equal chains recomputed from scratch by the full-sequence layer: for a start `t`, rows
    /// `0..=t` from the main model's hidden states and the text, then one more row per draft from the previous
    /// row's output and greedy token, the whole sequence run again for each draft.
    fn check(arch: SynthArch) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("model");
        synth(&SynthOptions { arch, size: SynthSize::default(), shards: 1, seed: 11, out: out.clone(), force: true })
            .unwrap();
        let tokens: Vec<u32> = (0..13u32).map(|i| (i * 41 + 3) % 250).collect();
        let depth = 3;
        let decoder = PagedModel::open(&out, 32).unwrap().with_mtp().unwrap().expect("an MTP layer");
        let normed = decoder.prefill(&Cpu, &tokens).unwrap().normed;
        let (checkpoint, config) = open_checkpoint(&out).unwrap();
        let reader = WeightReader::new(&checkpoint);
        let mtp = MtpLayer::load(&reader, &config).unwrap().unwrap();
        let (table, mla_scale) = rope_setup(&config, tokens.len());
        let context = LayerContext { backend: &Cpu, reader: &reader, config: &config, table: &table, mla_scale };
        let width = config.hidden_size;
        let spans = Spans::new(&[tokens.len()]);
        let host = Cpu.upload(&normed, width).unwrap();
        let chains = chained_drafts(&context, &mtp, &host, std::slice::from_ref(&tokens), &spans, depth).unwrap();
        let chain = &chains[0];
        assert_eq!(chain.len(), chain_starts(tokens.len(), depth) * depth);

        for t in [0, 4, chain_starts(tokens.len(), depth) - 1] {
            let mut next: Vec<u32> = tokens[1..=t + 1].to_vec();
            let mut previous: Vec<f32> = normed[..(t + 1) * width].to_vec();
            let mut drafted = Vec::new();
            for _ in 0..depth {
                let rows = next.len();
                let first: Vec<bool> = (0..rows).map(|row| row == 0).collect();
                let input = mtp.input(&Cpu, &reader, &config, &next, &first, &Cpu.upload(&previous, width).unwrap());
                let mut hidden = input.unwrap();
                let mut state = LayerState::default();
                let (spans, times) = (Spans::new(&[rows]), ExpertTimes::default());
                mtp.layer().forward(&context, &mut hidden, &spans, KvSource::Own, &mut state, &times, None).unwrap();
                let last = (&Cpu as &dyn Backend).row_range(&hidden, rows - 1..rows).unwrap();
                let token = argmax(&mtp.head_logits(&Cpu, &config, &last).unwrap());
                drafted.push(token);
                next.push(token);
                previous.extend_from_slice(&Cpu.download(&last).unwrap());
            }
            assert_eq!(&chain[t * depth..][..depth], &drafted[..], "{arch:?}: the chain from position {t}");
        }
    }

    #[test]
    fn pooled_chains_equal_chains_recomputed_by_the_full_sequence_layer() {
        for arch in [SynthArch::Glm45, SynthArch::Glm5, SynthArch::Glm52] {
            check(arch);
        }
    }
}
