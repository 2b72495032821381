//! Continuations scored after shared contexts, layer-streamed: every decoder layer takes the distinct contexts of a
//! pass once, all together ([`Layer::prefill`], which keeps each context's cache of the layer), then every token of
//! the continuations that follow them against a copy of their context's cache, as decode steps read it: one paged
//! decode of all the continuations' tokens through a one-layer pool of the contexts' rows for softmax attention (a
//! token attends to its context and to the tokens of its continuation before it; DSA's key choice included), and
//! step by step — token `t` of every continuation that has one — from a copy of the context's KDA state or
//! DeepSeek-V4's caches. With teacher forcing every token's input at a layer is known from the layer before, so a
//! layer needs no other layer.
//!
//! A multiple-choice item's choices share their context: it runs once per layer instead of once per choice.

use std::cmp::Reverse;

use super::causal_lm::{run_layers, Model};
use super::context::LayerContext;
use super::embedding::{embed, head_name};
use super::hyper::{narrow, widen};
use super::layer::{Layer, PagedInputs, PrefillCache};
use super::paged::Stepping;
use super::rope::rope_setup;
use super::v4_kv_fp8::V4Cache;
use crate::load::weights::WeightReader;
use crate::progress::Reporter;
use crate::runtime::backend::Backend;
use crate::runtime::kv_cache::{KvAt, KvDtype, KvPool, KvRows, LayerState, PagedStep, PoolShape};
use crate::runtime::matrix::Matrix;
use crate::runtime::{RuntimeError, Spans, Tensor};

/// Tokens per page of the one-layer pools the continuations attend through.
const PAGE_SIZE: usize = 16;
/// Rows through the head at a time (bounds the logits held: rows × vocab).
const HEAD_ROWS: usize = 256;

/// A context and the tokens of the continuations that follow it (each may be empty: only the context's last row is
/// then scored for it).
#[derive(Debug, Clone)]
pub struct Group {
    pub context: Vec<u32>,
    pub continuations: Vec<Vec<u32>>,
}

/// Which token a row of logits follows: the last of group `group`'s context (`continuation` `None`), or token `t` of
/// its continuation `c` (`Some((c, t))`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowAt {
    pub group: usize,
    pub continuation: Option<(usize, usize)>,
}

/// Receives each scored row's logits `[vocab]`.
pub type RowSink<'a> = dyn FnMut(RowAt, &[f32]) -> Result<(), RuntimeError> + 'a;

/// The continuations' tokens of a pass, step by step: the continuations longest first, step `t` (token `t` of each
/// continuation that has one) in rows `starts[t] .. starts[t] + counts[t]`, in that order.
struct Followers {
    /// `(group, continuation)`, longest first.
    order: Vec<(usize, usize)>,
    counts: Vec<usize>,
    starts: Vec<usize>,
    /// Each row's token and its position (its context's length + `t`).
    ids: Vec<u32>,
    positions: Vec<usize>,
}

impl Followers {
    fn new(groups: &[Group]) -> Self {
        let mut order: Vec<(usize, usize)> = groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| {
                group.continuations.iter().enumerate().filter(|(_, c)| !c.is_empty()).map(move |(c, _)| (g, c))
            })
            .collect();
        let length = |&(g, c): &(usize, usize)| groups[g].continuations[c].len();
        order.sort_by_key(|follower| Reverse(length(follower)));
        let steps = order.first().map_or(0, length);
        let counts: Vec<usize> = (0..steps).map(|t| order.iter().take_while(|f| length(f) > t).count()).collect();
        let starts = counts.iter().scan(0, |next, &count| Some(std::mem::replace(next, *next + count))).collect();
        let (mut ids, mut positions) = (Vec::new(), Vec::new());
        for (t, &count) in counts.iter().enumerate() {
            for &(g, c) in &order[..count] {
                ids.push(groups[g].continuations[c][t]);
                positions.push(groups[g].context.len() + t);
            }
        }
        Self { order, counts, starts, ids, positions }
    }

    /// The rows of step `t`.
    fn step(&self, t: usize) -> std::ops::Range<usize> {
        self.starts[t]..self.starts[t] + self.counts[t]
    }
}

impl Model {
    /// Runs each group's context once and its continuations after it (see the module); `sink` receives the logits
    /// of every context's last token and of every continuation token. The reporter sees one unit per decoder layer
    /// (plus one for the head).
    pub fn forward_continuations(
        &self,
        backend: &dyn Backend,
        groups: &[Group],
        reporter: &dyn Reporter,
        sink: &mut RowSink,
    ) -> Result<(), RuntimeError> {
        if groups.iter().any(|group| group.context.is_empty()) {
            return Err(RuntimeError::Input("a continuation needs a context of at least one token".into()));
        }
        let config = self.config();
        let reader = WeightReader::new(self.checkpoint());
        let width = config.hidden_size;
        let lengths: Vec<usize> = groups.iter().map(|group| group.context.len()).collect();
        let spans = Spans::new(&lengths);
        let followers = Followers::new(groups);
        let longest = groups
            .iter()
            .flat_map(|group| group.continuations.iter().map(|c| group.context.len() + c.len()))
            .chain(lengths.iter().copied())
            .max()
            .unwrap_or(0);
        let (table, mla_scale) = rope_setup(config, longest);
        let embedded = |ids: &[u32]| widen(backend, config, backend.upload(&embed(&reader, config, ids)?, width)?);
        let context_ids: Vec<u32> = groups.iter().flat_map(|group| group.context.iter().copied()).collect();
        let mut contexts = embedded(&context_ids)?;
        let mut follow = embedded(&followers.ids)?;
        // Per context its DSA selection, for the continuations' tokens their DSA key mask: the last indexer layer's
        // (shared layers reuse it).
        let mut selections = vec![None; groups.len()];
        let mut keys: Option<Tensor> = None;

        reporter.begin("layers", config.num_hidden_layers as u64 + 1);
        let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
        let stepping = Stepping { config, table: &table, mla_scale, v4_cache: V4Cache::Exact };
        run_layers(&[self], backend, reporter, &mut |step| {
            let layer = &step.layers[0];
            let store = (&context, V4Cache::Exact);
            let caches =
                layer.prefill(store, &mut contexts, (&spans, &context_ids), stepping.aux_width(), &mut selections)?;
            if followers.ids.is_empty() {
                return Ok(());
            }
            if layer.is_kda() || layer.is_compressed() {
                step_states(&context, layer, &caches, &followers, &mut follow)
            } else {
                attend_all((&context, &stepping), layer, (groups, &caches), &followers, (&mut follow, &mut keys))
            }
        })?;

        let norm = reader.parameter(config.final_norm_name(), width)?;
        let head: Matrix = reader.matrix(head_name(config, &reader), [config.vocab_size, width])?;
        let vocab = config.vocab_size;
        // The logits of `rows` of `hidden`, HEAD_ROWS at a time, each to the sink at `at(index)`.
        let mut heads = |hidden: &Tensor, rows: &[usize], at: &dyn Fn(usize) -> RowAt| -> Result<(), RuntimeError> {
            for (chunk, rows) in rows.chunks(HEAD_ROWS).enumerate() {
                let picked = narrow(backend, &reader, config, backend.gather_rows(hidden, rows)?)?;
                let normed = backend.rms_normed(&picked, &norm, config.rms_norm_eps as f32)?;
                let logits = backend.download(&backend.linear(&normed, &head, None)?)?;
                for (offset, row) in logits.chunks_exact(vocab).enumerate() {
                    sink(at(chunk * HEAD_ROWS + offset), row)?;
                }
            }
            Ok(())
        };
        let last: Vec<usize> = spans.iter().map(|(start, length)| start + length - 1).collect();
        heads(&contexts, &last, &|group| RowAt { group, continuation: None })?;
        let rows: Vec<usize> = (0..followers.ids.len()).collect();
        heads(&follow, &rows, &|row| {
            let t = followers.starts.partition_point(|&start| start <= row) - 1;
            let (group, c) = followers.order[row - followers.starts[t]];
            RowAt { group, continuation: Some((c, t)) }
        })?;
        reporter.advance(1);
        reporter.end();
        Ok(())
    }
}

/// The continuations' tokens through a softmax attention layer: a one-layer pool holding each continuation's copy
/// of its context's rows, then one paged decode of every token, which writes each token's row and attends over its
/// context and its continuation up to it (the DSA keys chosen by this layer's indexer, or `keys`, the mask of the
/// last indexer layer, reused).
fn attend_all(
    (context, stepping): (&LayerContext, &Stepping),
    layer: &Layer,
    (groups, caches): (&[Group], &[PrefillCache]),
    followers: &Followers,
    (follow, keys): (&mut Tensor, &mut Option<Tensor>),
) -> Result<(), RuntimeError> {
    let backend = context.backend;
    let (row_width, aux_width) = (stepping.row_width(), stepping.aux_width());
    let length = |&(g, c): &(usize, usize)| groups[g].context.len() + groups[g].continuations[c].len();
    let pages = followers.order.iter().map(|follower| length(follower).div_ceil(PAGE_SIZE)).sum();
    let shape = PoolShape { layers: 1, row_width, aux_width, page_size: PAGE_SIZE, pages };
    let mut pool = KvPool::new(shape, KvDtype::F32, vec![vec![1.0; row_width]]);
    for (request, follower) in followers.order.iter().enumerate() {
        let PrefillCache::Rows { rows, aux } = &caches[follower.0] else {
            return Err(RuntimeError::Input("a softmax attention layer prefilled no cache rows".into()));
        };
        let request = request as u64;
        pool.open(request);
        pool.reserve(request, length(follower))?;
        let at: Vec<KvAt> = (0..rows.rows()).map(|position| KvAt { request, position }).collect();
        backend.kv_write(&mut pool, 0, &KvRows { rows, aux, at: &at })?;
    }
    // Row `starts[t] + i` is token `t` of continuation `i`: its request (`i`) and position.
    let mut requests = Vec::with_capacity(followers.ids.len());
    for (t, &count) in followers.counts.iter().enumerate() {
        requests.extend(
            (0..count).map(|i| KvAt { request: i as u64, position: followers.positions[followers.starts[t] + i] }),
        );
    }
    let layout = Layer::layout(context.config, context.mla_scale);
    let mut selected = None;
    let attend = |_: &mut Tensor, inputs: PagedInputs| {
        let PagedInputs { q, rows, aux, keys } = inputs;
        let paged = PagedStep { layer: 0, layout, verify: false, q, rows, aux, requests: &requests, keys };
        let decoded = backend.paged_decode(&mut pool, &paged)?;
        if let Some(fault) = decoded.faults.into_iter().flatten().next() {
            return Err(RuntimeError::Input(format!("a continuation's cache failed its check: {fault}")));
        }
        selected = decoded.keys;
        Ok(Some((decoded.out, None)))
    };
    layer.decode(context, follow, (&followers.positions, aux_width), keys.as_ref(), attend)?;
    if selected.is_some() {
        *keys = selected;
    }
    Ok(())
}

/// The continuations' tokens through a KDA or DeepSeek-V4 layer, step by step: each continuation from a copy of its
/// context's state (caches), advanced one token a step.
fn step_states(
    context: &LayerContext,
    layer: &Layer,
    caches: &[PrefillCache],
    followers: &Followers,
    follow: &mut Tensor,
) -> Result<(), RuntimeError> {
    let backend = context.backend;
    let mut states = Vec::with_capacity(followers.order.len());
    for &(group, _) in &followers.order {
        match &caches[group] {
            PrefillCache::State(state) => states.push(state.clone()),
            PrefillCache::Rows { .. } => {
                return Err(RuntimeError::Input("a KDA or DeepSeek-V4 layer prefilled cache rows".into()))
            }
        }
    }
    let wrong = || RuntimeError::Input("a layer prefilled a state of another kind".into());
    if layer.is_kda() {
        let mut kda = states
            .into_iter()
            .map(|state| if let LayerState::Kda(state) = state { Ok(state) } else { Err(wrong()) })
            .collect::<Result<Vec<_>, _>>()?;
        for (t, &count) in followers.counts.iter().enumerate() {
            let mut hidden = backend.row_range(follow, followers.step(t))?;
            layer.decode_states(context, &mut hidden, &mut kda[..count])?;
            backend.place_rows(follow, followers.starts[t], &hidden)?;
        }
    } else {
        let mut compressed = states
            .into_iter()
            .map(|state| if let LayerState::Compressed(cache) = state { Ok(*cache) } else { Err(wrong()) })
            .collect::<Result<Vec<_>, _>>()?;
        for (t, &count) in followers.counts.iter().enumerate() {
            let mut hidden = backend.row_range(follow, followers.step(t))?;
            let ids = &followers.ids[followers.step(t)];
            layer.decode_caches((context, V4Cache::Exact), &mut hidden, &mut compressed[..count], ids)?;
            backend.place_rows(follow, followers.starts[t], &hidden)?;
        }
    }
    Ok(())
}
