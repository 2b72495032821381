//! Continuations scored after shared contexts, layer-streamed: every decoder layer takes the distinct contexts of a
//! pass once, all together ([`Layer::prefill`], which keeps each context's cache of the layer), then every token of
//! the continuations that follow them at once, each continuation against a copy of its context's cache as decode
//! steps read it: one paged decode through a one-layer pool of the contexts' rows for softmax attention (a token
//! attends to its context and to its continuation up to it; DSA's key choice included), each continuation's run of
//! tokens from a copy of its context's KDA state, DeepSeek-V4's caches stepped one token of every continuation at a
//! time; then the layer's MLP once over all the tokens. With teacher forcing every token's input at a layer is known
//! from the layer before, so a layer needs no other layer.
//!
//! A multiple-choice item's choices share their context: it runs once per layer instead of once per choice.

use std::cmp::Reverse;
use std::ops::Range;

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

/// The continuations' tokens of a pass, one row each: every continuation's tokens in a run (for KDA's states), or
/// for DeepSeek-V4 (whose caches take one token a step) step by step — the continuations longest first, step `t`
/// (token `t` of each continuation that has one) in rows `Σ steps[..t] ..` of `steps[t]` rows.
struct Followers {
    /// `(group, continuation)`, longest first.
    order: Vec<(usize, usize)>,
    /// Each row's continuation (an index into `order`) and which of its tokens it is.
    rows: Vec<(usize, usize)>,
    /// Each row's token and its position (its context's length + the token's index).
    ids: Vec<u32>,
    positions: Vec<usize>,
    /// In runs: each continuation's rows (in `order`); step by step: each step's row count. The other is empty.
    runs: Vec<Range<usize>>,
    steps: Vec<usize>,
}

impl Followers {
    fn new(groups: &[Group], stepped: bool) -> Self {
        let mut order: Vec<(usize, usize)> = groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| {
                group.continuations.iter().enumerate().filter(|(_, c)| !c.is_empty()).map(move |(c, _)| (g, c))
            })
            .collect();
        let length = |&(g, c): &(usize, usize)| groups[g].continuations[c].len();
        order.sort_by_key(|follower| Reverse(length(follower)));
        let longest = order.first().map_or(0, length);
        let (mut runs, mut steps, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        if stepped {
            steps = (0..longest).map(|t| order.iter().take_while(|f| length(f) > t).count()).collect();
            rows = steps.iter().enumerate().flat_map(|(t, &count)| (0..count).map(move |i| (i, t))).collect();
        } else {
            for (i, follower) in order.iter().enumerate() {
                runs.push(rows.len()..rows.len() + length(follower));
                rows.extend((0..length(follower)).map(|t| (i, t)));
            }
        }
        let (ids, positions) = rows
            .iter()
            .map(|&(i, t)| {
                let (g, c) = order[i];
                (groups[g].continuations[c][t], groups[g].context.len() + t)
            })
            .unzip();
        Self { order, rows, ids, positions, runs, steps }
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
        let followers = Followers::new(groups, config.deepseek_v4().is_some());
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
                extend_states(&context, layer, &caches, &followers, &mut follow)
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
            let (i, t) = followers.rows[row];
            RowAt { group: followers.order[i].0, continuation: Some((followers.order[i].1, t)) }
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
    let requests: Vec<KvAt> = (followers.rows.iter().zip(&followers.positions))
        .map(|(&(i, _), &position)| KvAt { request: i as u64, position })
        .collect();
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

/// The continuations' tokens through a KDA or DeepSeek-V4 layer, each continuation from a copy of its context's
/// state: KDA's runs of tokens at once, DeepSeek-V4's caches step by step.
fn extend_states(
    context: &LayerContext,
    layer: &Layer,
    caches: &[PrefillCache],
    followers: &Followers,
    follow: &mut Tensor,
) -> Result<(), RuntimeError> {
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
        let mut runs: Vec<_> = followers.runs.iter().cloned().zip(&mut kda).collect();
        layer.extend_states(context, follow, &mut runs)
    } else {
        let mut compressed = states
            .into_iter()
            .map(|state| if let LayerState::Compressed(cache) = state { Ok(*cache) } else { Err(wrong()) })
            .collect::<Result<Vec<_>, _>>()?;
        let steps = (followers.ids.as_slice(), followers.steps.as_slice());
        layer.step_caches((context, V4Cache::Exact), follow, &mut compressed, steps)
    }
}
