//! Multi-head latent attention (DeepSeek-V3 / Kimi K2 / GLM-5): low-rank queries and a compressed KV latent with a
//! shared interleaved-RoPE key part, expanded per head by `kv_b_proj` over whole sequences, or absorbed into the
//! queries and outputs for the decode step over cached latent rows; GLM-5 adds the DSA index selection.

use std::sync::OnceLock;

use super::context::{LayerContext, LayerState};
use super::indexer::{IndexQueries, IndexerWeights};
use super::tap::{KvSource, KvTap};
use crate::load::weights::WeightReader;
use crate::model::config::Attention;
use crate::model::ModelConfig;
use crate::runtime::backend::{AttentionShape, Backend, RopeCall, RopeStyle};
use crate::runtime::kv_cache::PagedLayout;
use crate::runtime::matrix::Matrix;
use crate::runtime::rope_table::{check_positions, RopeTable};
use crate::runtime::tensor::{Block, Tensor};
use crate::runtime::{RuntimeError, Spans};

pub struct MlaWeights {
    q_a: Option<(Matrix, Matrix)>,
    q_b: Matrix,
    kv_a: Matrix,
    kv_a_norm: Matrix,
    kv_b: Matrix,
    o: Matrix,
    indexer: Option<IndexerWeights>,
    /// The epsilon of `q_a_layernorm`/`kv_a_layernorm` ([`ModelConfig::latent_norm_eps`]).
    latent_eps: f32,
    /// `kv_b` split per head for the decode step's absorbed form, made on the first step.
    absorbed: OnceLock<Absorbed>,
}

/// `kv_b` split per head for the absorbed form: the query's no-RoPE part goes through `k[h]` (`W_UK_hᵀ`
/// `[kv_lora, nope]`) to a latent query, and the attended latent through `v[h]` (`W_UV_h` `[v, kv_lora]`) to the
/// head's value.
struct Absorbed {
    k: Vec<Matrix>,
    v: Vec<Matrix>,
}

#[derive(Clone, Copy)]
struct Dims {
    heads: usize,
    kv_lora: usize,
    nope: usize,
    rope: usize,
    v: usize,
}

fn dims(config: &ModelConfig) -> (Dims, Option<usize>) {
    match &config.attention {
        Attention::Mla { q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => (
            Dims {
                heads: config.num_attention_heads,
                kv_lora: *kv_lora_rank,
                nope: *qk_nope_head_dim,
                rope: *qk_rope_head_dim,
                v: *v_head_dim,
            },
            *q_lora_rank,
        ),
        Attention::Gqa { .. } => unreachable!("MLA weights requested for a GQA model"),
    }
}

impl MlaWeights {
    /// Every weight matrix (for device prefetch).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all: Vec<&Matrix> = self.q_a.iter().map(|(m, _)| m).collect();
        all.extend([&self.q_b, &self.kv_a, &self.kv_b, &self.o]);
        all.extend(self.indexer.iter().flat_map(IndexerWeights::matrices));
        all
    }

    /// The attention weights of decoder layer `layer` (with its DSA indexer where it runs one).
    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let (d, q_lora) = dims(config);
        let hidden = config.hidden_size;
        let qk = d.nope + d.rope;
        let name = |suffix: &str| format!("model.layers.{layer}.self_attn.{suffix}");
        let (q_a, q_b) = match q_lora {
            Some(rank) => (
                Some((
                    reader.matrix(&name("q_a_proj.weight"), [rank, hidden])?,
                    reader.parameter(&name("q_a_layernorm.weight"), rank)?,
                )),
                reader.matrix(&name("q_b_proj.weight"), [d.heads * qk, rank])?,
            ),
            None => (None, reader.matrix(&name("q_proj.weight"), [d.heads * qk, hidden])?),
        };
        let indexer = IndexerWeights::load_layer(reader, config, layer)?;
        Ok(Self {
            q_a,
            q_b,
            kv_a: reader.matrix(&name("kv_a_proj_with_mqa.weight"), [d.kv_lora + d.rope, hidden])?,
            kv_a_norm: reader.parameter(&name("kv_a_layernorm.weight"), d.kv_lora)?,
            kv_b: reader.matrix(&name("kv_b_proj.weight"), [d.heads * (d.nope + d.v), d.kv_lora])?,
            o: reader.matrix(&name("o_proj.weight"), [hidden, d.heads * d.v])?,
            indexer,
            latent_eps: config.latent_norm_eps(),
            absorbed: OnceLock::new(),
        })
    }

    /// Attention output `[tokens, hidden]` for normed input `x`, the cached rows taken from `kv` and passed through
    /// `tap` (observed, then fake-quantized to FP8 if asked). `selection` carries the DSA top-k between layers: a
    /// layer with an indexer replaces it, a shared layer reuses it.
    ///
    /// With [`KvSource::Split`] the cached rows of each sequence's first `prompt[i]` tokens come from `prefill`
    /// (weights) applied to `prefill_input`, the rest from `self` applied to `x`; all rows go through `tap` (the
    /// handoff and the decode cache), and every query, the latent expansion and the output projection use `self`.
    /// Rows of prompt positions in the result are not meaningful.
    pub fn forward(
        &self,
        context: &LayerContext,
        x: &Tensor,
        spans: &Spans,
        kv: KvSource<MlaWeights>,
        state: &mut LayerState,
        tap: &mut KvTap,
    ) -> Result<Tensor, RuntimeError> {
        let LayerContext { backend, config, table, .. } = *context;
        let (d, _) = dims(config);
        let width = d.kv_lora + d.rope;
        let KvSource::Split { prefill, prefill_input: x_prefill, prompt } = kv else {
            let (q, q_resid) = self.queries(backend, x)?;
            let mut rows = self.cache_rows(backend, config, x, spans, table)?;
            tap.apply_mla(backend, &mut rows, width)?;
            return self.attend(context, x, (q, &q_resid), &rows, spans, state);
        };
        let (q, mut q_resid) = self.queries(backend, x)?;
        let (_, q_resid_prefill) = prefill.queries(backend, x_prefill)?;
        let mut rows = self.cache_rows(backend, config, x, spans, table)?;
        let rows_prefill = prefill.cache_rows(backend, config, x_prefill, spans, table)?;
        let mut x_mixed = backend.row_range(x, 0..x.rows())?;
        for ((start, _), &length) in spans.iter().zip(prompt) {
            let range = start..start + length;
            backend.copy_rows(&mut rows, &rows_prefill, range.clone())?;
            backend.copy_rows(&mut x_mixed, x_prefill, range.clone())?;
            backend.copy_rows(&mut q_resid, &q_resid_prefill, range)?;
        }
        tap.apply_mla(backend, &mut rows, width)?;
        self.attend(context, &x_mixed, (q, &q_resid), &rows, spans, state)
    }

    /// Queries `[tokens, heads·qk]` (before RoPE) and the query input of the indexer (the normed q latent).
    fn queries(&self, backend: &dyn Backend, x: &Tensor) -> Result<(Tensor, Tensor), RuntimeError> {
        let q_resid = match &self.q_a {
            Some((q_a, norm)) => {
                let mut latent = backend.linear(x, q_a, None)?;
                backend.rms_norm(&mut latent, q_a.rows, norm, self.latent_eps)?;
                latent
            }
            None => backend.row_range(x, 0..x.rows())?,
        };
        Ok((backend.linear(&q_resid, &self.q_b, None)?, q_resid))
    }

    /// What the engines cache per token: `[tokens, kv_lora + rope]` rows of the normed latent `kv_c_normed` and
    /// the post-RoPE shared key `k_pe`.
    fn cache_rows(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &Tensor,
        spans: &Spans,
        table: &RopeTable,
    ) -> Result<Tensor, RuntimeError> {
        let (d, _) = dims(config);
        let (latent, mut k_rot) = self.latent(backend, config, x)?;
        let style = if config.rope.interleave { RopeStyle::Interleaved } else { RopeStyle::Half };
        for (start, length) in spans.iter() {
            check_positions(table, length)?;
            backend.rope(
                &mut k_rot,
                &RopeCall {
                    rows: start..start + length,
                    first_position: 0,
                    head_dim: d.rope,
                    offset: 0,
                    rotary_dim: d.rope,
                    table,
                    style,
                },
            )?;
        }
        backend.concat_columns(&[&latent, &k_rot])
    }

    /// The normed latent `kv_c_normed` `[tokens, kv_lora]` and the shared key `k_pe` `[tokens, rope]` before RoPE.
    fn latent(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &Tensor,
    ) -> Result<(Tensor, Tensor), RuntimeError> {
        let (d, _) = dims(config);
        let compressed = backend.linear(x, &self.kv_a, None)?;
        let mut latent = backend.columns(&compressed, 0, d.kv_lora)?;
        let k_rot = backend.columns(&compressed, d.kv_lora, d.rope)?;
        backend.rms_norm(&mut latent, d.kv_lora, &self.kv_a_norm, self.latent_eps)?;
        Ok((latent, k_rot))
    }

    /// Attention over cached rows: the latent expanded per head by `kv_b_proj`, the DSA selection, output projection.
    /// `q` the queries (before RoPE), `q_resid` the indexer's query input.
    fn attend(
        &self,
        context: &LayerContext,
        x: &Tensor,
        (mut q, q_resid): (Tensor, &Tensor),
        rows: &Tensor,
        spans: &Spans,
        state: &mut LayerState,
    ) -> Result<Tensor, RuntimeError> {
        let LayerContext { backend, config, table, mla_scale: scale, .. } = *context;
        let LayerState { selection, near_ties, .. } = state;
        let (d, _) = dims(config);
        let tokens = spans.total();
        let (qk, kv_width) = (d.nope + d.rope, d.nope + d.v);
        let width = d.kv_lora + d.rope;
        let latent = backend.columns(rows, 0, d.kv_lora)?;
        let kv = backend.linear(&latent, &self.kv_b, None)?;

        if let Some(indexer) = &self.indexer {
            let (chosen, ties) = indexer.select(backend, config, x, q_resid, spans, table)?;
            *near_ties += ties;
            *selection = Some(chosen);
        }
        // Expand the latent per head: k = [k_nope_h, k_rot], v = v_h.
        let per_head =
            |offset: usize, stride: usize| Block { offset, outer_stride: d.heads * stride, inner_stride: stride };
        let mut k = backend.empty(tokens, d.heads * qk)?;
        backend.copy(&mut k, per_head(0, qk), &kv, per_head(0, kv_width), [tokens, d.heads, d.nope])?;
        let shared_rope = Block { offset: d.kv_lora, outer_stride: width, inner_stride: 0 };
        backend.copy(&mut k, per_head(d.nope, qk), rows, shared_rope, [tokens, d.heads, d.rope])?;
        let mut v = backend.empty(tokens, d.heads * d.v)?;
        backend.copy(&mut v, per_head(0, d.v), &kv, per_head(d.nope, kv_width), [tokens, d.heads, d.v])?;

        let style = if config.rope.interleave { RopeStyle::Interleaved } else { RopeStyle::Half };
        let mut output = backend.empty(tokens, d.heads * d.v)?;
        for (index, (start, length)) in spans.iter().enumerate() {
            check_positions(table, length)?;
            let sequence = start..start + length;
            backend.rope(
                &mut q,
                &RopeCall {
                    rows: sequence.clone(),
                    first_position: 0,
                    head_dim: qk,
                    offset: d.nope,
                    rotary_dim: d.rope,
                    table,
                    style,
                },
            )?;
            let shape =
                AttentionShape { tokens: length, heads: d.heads, kv_heads: d.heads, qk_dim: qk, v_dim: d.v, scale };
            let allowed = match (&config.indexer, selection.as_ref()) {
                (Some(_), Some(chosen)) => Some(chosen.masks[index].as_slice()),
                (Some(_), None) => return Err(RuntimeError::Input("a shared DSA layer needs the top-k of an earlier full indexer layer, but no earlier layer has an indexer".into())),
                _ => None,
            };
            let attended = backend.attention(&q, &k, &v, sequence, &shape, allowed)?;
            backend.place_rows(&mut output, start, &attended)?;
        }
        backend.linear(&output, &self.o, None)
    }
}

/// The decode step over cached latent rows, in the absorbed form.
impl MlaWeights {
    /// The per-head split of `kv_b` (made on first use: the sequence forward never needs it).
    fn absorbed(&self, config: &ModelConfig) -> &Absorbed {
        self.absorbed.get_or_init(|| {
            let (d, _) = dims(config);
            let (kv_lora, nope, v) = (d.kv_lora, d.nope, d.v);
            // kv_b rows per head: nope rows of W_UK_h, then v rows of W_UV_h, each kv_lora wide.
            let head_rows = |h: usize| &self.kv_b.values()[h * (nope + v) * kv_lora..][..(nope + v) * kv_lora];
            let k = (0..d.heads)
                .map(|h| {
                    let w_uk = &head_rows(h)[..nope * kv_lora];
                    let transposed = (0..kv_lora * nope).map(|i| w_uk[(i % nope) * kv_lora + i / nope]).collect();
                    Matrix::new(kv_lora, nope, transposed)
                })
                .collect();
            let v = (0..d.heads).map(|h| Matrix::new(v, kv_lora, head_rows(h)[nope * kv_lora..].to_vec())).collect();
            Absorbed { k, v }
        })
    }

    /// Cache rows `[tokens, kv_lora + rope]` (normed latent, post-RoPE `k_pe`) and indexer keys
    /// `[tokens, aux_width]` of normed input `x` at `positions`, and the queries of the same tokens (`[tokens,
    /// heads, qk]` post-RoPE, and the DSA indexer's).
    pub fn project(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        table: &RopeTable,
        x: &Tensor,
        positions: &[usize],
        aux_width: usize,
    ) -> Result<(Tensor, Tensor, Tensor, Option<IndexQueries>), RuntimeError> {
        let (d, _) = dims(config);
        let (nope, rope) = (d.nope, d.rope);
        let qk = nope + rope;
        let style = if config.rope.interleave { RopeStyle::Interleaved } else { RopeStyle::Half };
        let (mut q, q_resid) = self.queries(backend, x)?;
        let (latent, mut k_pe) = self.latent(backend, config, x)?;
        for (t, &position) in positions.iter().enumerate() {
            backend.rope(
                &mut q,
                &RopeCall {
                    rows: t..t + 1,
                    first_position: position,
                    head_dim: qk,
                    offset: nope,
                    rotary_dim: rope,
                    table,
                    style,
                },
            )?;
            backend.rope(
                &mut k_pe,
                &RopeCall {
                    rows: t..t + 1,
                    first_position: position,
                    head_dim: rope,
                    offset: 0,
                    rotary_dim: rope,
                    table,
                    style,
                },
            )?;
        }
        let rows = backend.concat_columns(&[&latent, &k_pe])?;
        let (aux, index) = match (&self.indexer, &config.indexer) {
            (Some(weights), Some(settings)) => {
                let (keys, queries) = weights.project(backend, settings, table, x, &q_resid, positions)?;
                (keys, Some(queries))
            }
            _ => (backend.zeros(positions.len(), aux_width)?, None),
        };
        Ok((rows, aux, q, index))
    }

    /// How the paged attention reads the cached rows: in the absorbed form.
    pub fn layout(config: &ModelConfig, mla_scale: f32) -> PagedLayout {
        let (d, _) = dims(config);
        PagedLayout::mla_absorbed(d.heads, d.kv_lora, d.rope, mla_scale)
    }

    /// The queries the paged attention takes, `[tokens, heads, kv_lora + rope]`: each head's `q_nope · W_UK_h`
    /// (kv_lora wide) followed by its `q_pe`.
    pub fn attention_queries(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        queries: &Tensor,
    ) -> Result<Tensor, RuntimeError> {
        let (d, _) = dims(config);
        let (kv_lora, nope, rope, heads) = (d.kv_lora, d.nope, d.rope, d.heads);
        let (qk, width) = (nope + rope, kv_lora + rope);
        let tokens = queries.rows();
        let mut absorbed = backend.empty(tokens, heads * width)?;
        for (h, absorb_k) in self.absorbed(config).k.iter().enumerate() {
            let q_nope = backend.columns(queries, h * qk, nope)?;
            let latent = backend.linear(&q_nope, absorb_k, None)?;
            backend.copy(
                &mut absorbed,
                Block::columns(h * width, heads * width),
                &latent,
                Block::columns(0, kv_lora),
                [tokens, 1, kv_lora],
            )?;
        }
        let per_head =
            |offset: usize, stride: usize| Block { offset, outer_stride: heads * stride, inner_stride: stride };
        backend.copy(&mut absorbed, per_head(kv_lora, width), queries, per_head(nope, qk), [tokens, heads, rope])?;
        Ok(absorbed)
    }

    /// The attention outputs `[tokens, heads · v_dim]` that `o_proj` takes, from the paged attention's
    /// `[tokens, heads, kv_lora]`: each head's attended latent through `W_UV_h`.
    pub fn attention_values(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        attended: &Tensor,
    ) -> Result<Tensor, RuntimeError> {
        let (d, _) = dims(config);
        let (kv_lora, v, heads) = (d.kv_lora, d.v, d.heads);
        let tokens = attended.len() / (heads * kv_lora);
        let mut values = backend.empty(tokens, heads * v)?;
        for (h, absorb_v) in self.absorbed(config).v.iter().enumerate() {
            let latent = backend.columns(attended, h * kv_lora, kv_lora)?;
            let head = backend.linear(&latent, absorb_v, None)?;
            backend.copy(&mut values, Block::columns(h * v, heads * v), &head, Block::columns(0, v), [tokens, 1, v])?;
        }
        Ok(values)
    }

    /// `o_proj` of the attention outputs.
    pub fn output(&self, backend: &dyn Backend, attended: &Tensor) -> Result<Tensor, RuntimeError> {
        backend.linear(attended, &self.o, None)
    }
}
