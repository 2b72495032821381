//! One layer of a paged decode step as the backends take it ([`crate::runtime::Backend::paged_decode`],
//! [`crate::runtime::Backend::kv_write`]): where each request's cached row goes, how a query head reads a cached row
//! ([`PagedLayout`]), how a DSA layer picks its keys ([`KeyChoice`]), and the step's result ([`PagedDecode`]).

use super::{PoolError, RequestId};
use crate::runtime::tensor::Tensor;

/// Where each query head of a paged decode finds its key and value in a cached row: key head `g` at `g · k_stride`
/// (`qk_dim` wide), its value at `v_base + g · v_stride` (`v_dim` wide); query head `h` reads key head
/// `h / (heads / kv_heads)`; `score = scale · q · key`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PagedLayout {
    pub heads: usize,
    pub kv_heads: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
    pub k_stride: usize,
    pub v_base: usize,
    pub v_stride: usize,
    pub scale: f32,
}

impl PagedLayout {
    /// GQA rows `[K kv_heads·head_dim | V kv_heads·head_dim]`.
    pub fn gqa(heads: usize, kv_heads: usize, head_dim: usize, scale: f32) -> Self {
        Self {
            heads,
            kv_heads,
            qk_dim: head_dim,
            v_dim: head_dim,
            k_stride: head_dim,
            v_base: kv_heads * head_dim,
            v_stride: head_dim,
            scale,
        }
    }

    /// MLA in the absorbed form: rows `[latent kv_lora | k_pe rope]`; each query head is `kv_lora + rope` wide
    /// (q_nope through kv_b's K part, then q_pe) and its output `kv_lora` wide (kv_b's V part and o_proj follow).
    pub fn mla_absorbed(heads: usize, kv_lora: usize, rope: usize, scale: f32) -> Self {
        Self { heads, kv_heads: 1, qk_dim: kv_lora + rope, v_dim: kv_lora, k_stride: 0, v_base: 0, v_stride: 0, scale }
    }
}

/// Where a cached row belongs: `request`'s `position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvAt {
    pub request: RequestId,
    pub position: usize,
}

/// Rows to cache in one layer: row `r` of `rows` `[n, row_width]` and of `aux` `[n, aux_width]` at `at[r]`.
#[derive(Debug, Clone, Copy)]
pub struct KvRows<'a> {
    pub rows: &'a Tensor,
    pub aux: &'a Tensor,
    pub at: &'a [KvAt],
}

/// One layer of a decode step: per request (in order) where its new row goes (written there, then attended with
/// the positions before it), its query row of `q` `[requests, heads · qk_dim]` laid out as `layout`, and its new
/// cache row of `rows` `[requests, row_width]` and `aux` `[requests, aux_width]`.
#[derive(Debug, Clone, Copy)]
pub struct PagedStep<'a> {
    pub layer: usize,
    pub layout: PagedLayout,
    /// Verify every mapping of each request (the step's first layer); counted in the pool's counters.
    pub verify: bool,
    pub q: &'a Tensor,
    pub rows: &'a Tensor,
    pub aux: &'a Tensor,
    pub requests: &'a [KvAt],
    /// DSA (GLM-5): the keys each request attends to, chosen in this step by this layer's indexer over the cached
    /// indexer keys (the aux values, the new ones included), or an earlier layer's choice reused.
    pub keys: Option<KeyChoice<'a>>,
}

impl PagedStep<'_> {
    /// Columns of the step's DSA key mask ([`PagedDecode::keys`]): the longest context.
    pub fn key_columns(&self) -> usize {
        self.requests.iter().map(|at| at.position + 1).max().unwrap_or(0)
    }
}

/// How a DSA layer of a decode step picks the keys its requests attend to.
#[derive(Debug, Clone, Copy)]
pub enum KeyChoice<'a> {
    /// This layer's indexer: request `r`'s query row of `q` `[requests, heads · dim]` and head weights `[requests,
    /// heads]` score each cached key `s ≤ position` as [`crate::runtime::Backend::indexer_top_k`] does; the `top_k` best are kept
    /// (every key while `position < top_k`).
    Select { q: &'a Tensor, head_weights: &'a Tensor, heads: usize, dim: usize, top_k: usize },
    /// GLM-5.3-Flash's k-pool indexer: as `Select`, but the aux rows hold `[key | gate]` (`2 · dim`), the complete
    /// pools of `size` cached keys are scored as one (`ape` `[size, dim]`, the pool position embedding) and
    /// `top_k / size` kept, with the request's incomplete pool when `select_tail`.
    SelectPools {
        q: &'a Tensor,
        head_weights: &'a Tensor,
        heads: usize,
        dim: usize,
        top_k: usize,
        size: usize,
        select_tail: bool,
        ape: &'a [f32],
    },
    /// The keys an earlier layer chose in this step ([`PagedDecode::keys`], rows in request order).
    Reuse(&'a Tensor),
}

/// A paged decode's result.
#[derive(Debug)]
pub struct PagedDecode {
    /// `[requests, heads · v_dim]`; NaN rows for faulted requests.
    pub out: Tensor,
    /// Per request, why its mappings cannot be trusted.
    pub faults: Vec<Option<PoolError>>,
    /// The keys each request attended to when this layer chose them ([`KeyChoice::Select`]): `[requests, stride]`,
    /// 1.0 for a kept key, for the next layers that reuse it ([`KeyChoice::Reuse`]).
    pub keys: Option<Tensor>,
    /// Host time spent verifying (0 where the check runs inside the attention kernel).
    pub verify_seconds: f64,
}
