//! One chunk of KDA's delta rule in matrix form (prefill), for one head: the products of FLA's `chunk_kda` and
//! transformers' `chunk_kimi_delta_attention`, each through the runtime's GEMM kernel ([`gemm`]).
//!
//! Within a chunk of `c ≤ 64` tokens with cumulative log decay `G` (per channel, non-increasing), the products
//! need `exp(G_i − G_j)` for `j ≤ i`. For `j` in an earlier sub-chunk of [`SUB`] tokens than `i` it is split as
//! `exp(G_i − G_a) · exp(G_a − G_j)`, `G_a` the first row of `i`'s sub-chunk: both factors ≤ 1, so nothing
//! overflows however fast the gate decays (the single split around one point of the chunk that a plain GEMM would
//! need can reach `e^88`), and the products become GEMMs. Within a sub-chunk the same split makes the second factor
//! ≥ 1, bounded by the sub-chunk's decay: factored where that stays finite, per element otherwise.
//! The result equals the per-element form up to rounding (`super::tests`).

use crate::runtime::host::exp::exp;
use crate::runtime::host::gemm::gemm;

/// Tokens of a sub-chunk.
const SUB: usize = 16;
/// The largest decay across a sub-chunk (`G_a − G_last`, any channel) for which its products with itself are
/// factored too (`exp(80)` ≈ 5.5e34, finite times a sum of `head_dim` unit products): always so for GLM-5.3-Flash's
/// safe gate (at most 15 · 5), past it for a fast-decaying softplus gate, whose sub-chunk is then taken per element.
const FACTORED_RANGE: f32 = 80.0;

/// One head's rows of a chunk, each `[c, d]` row-major (`beta` `[c]`): `q` normalized and scaled, `k`
/// normalized, `g` the cumulative log decay from the chunk's start (inclusive).
pub(super) struct Chunk {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
    pub d: usize,
}

impl Chunk {
    /// The chunk's output `[c, d]`, advancing `state` (`[d, d]`, keys by values) past it.
    pub(super) fn run(&self, state: &mut [f32]) -> Vec<f32> {
        let (c, d) = (self.beta.len(), self.d);
        let (kk, qk) = self.decayed_products();
        let t = self.inverse(&kk);
        let decay: Vec<f32> = self.g.iter().map(|&g| exp(g)).collect();
        // [U | W] = T · [β v | β k ⊙ exp(G)].
        let mut scaled = vec![0f32; c * 2 * d];
        for (i, row) in scaled.chunks_exact_mut(2 * d).enumerate() {
            let (v, k, decay) = (&self.v[i * d..][..d], &self.k[i * d..][..d], &decay[i * d..][..d]);
            for x in 0..d {
                row[x] = self.beta[i] * v[x];
                row[d + x] = self.beta[i] * k[x] * decay[x];
            }
        }
        let mut uw = vec![0f32; c * 2 * d];
        gemm((&t, c), (&scaled, 2 * d), (&mut uw, 2 * d), [c, c, 2 * d]);
        // v_new = U − W·S, stacked under S for the output's one product.
        let mut ws = vec![0f32; c * d];
        gemm((&uw[d..], 2 * d), (state, d), (&mut ws, d), [c, d, d]);
        let mut stacked = vec![0f32; (d + c) * d];
        stacked[..d * d].copy_from_slice(state);
        for (i, row) in stacked[d * d..].chunks_exact_mut(d).enumerate() {
            for x in 0..d {
                row[x] = uw[i * 2 * d + x] - ws[i * d + x];
            }
        }
        // out = [q ⊙ exp(G) | qk] · [S; v_new].
        let mut left = vec![0f32; c * (d + c)];
        for (i, row) in left.chunks_exact_mut(d + c).enumerate() {
            for x in 0..d {
                row[x] = self.q[i * d + x] * decay[i * d + x];
            }
            row[d..].copy_from_slice(&qk[i * c..][..c]);
        }
        let mut out = vec![0f32; c * d];
        gemm((&left, d + c), (&stacked, d), (&mut out, d), [c, d + c, d]);
        // S ← diag(exp(G_last))·S + (k ⊙ exp(G_last − G))ᵀ · v_new.
        let last = &self.g[(c - 1) * d..][..d];
        let keys_t = transposed(&self.k, &self.g, last, d);
        let mut update = vec![0f32; d * d];
        gemm((&keys_t, c), (&stacked[d * d..], d), (&mut update, d), [d, c, d]);
        for (x, (row, update)) in state.chunks_exact_mut(d).zip(update.chunks_exact(d)).enumerate() {
            let decay = exp(last[x]);
            for (s, &u) in row.iter_mut().zip(update) {
                *s = *s * decay + u;
            }
        }
        out
    }

    /// `kk(i, j) = Σ_x k[i,x]·k[j,x]·exp(G[i,x] − G[j,x])` and `qk(i, j)` the same with `q[i,x]`, for `j ≤ i`
    /// (zero above the diagonal), each `[c, c]`: per sub-chunk one GEMM of its rows against the tokens before it
    /// (and against its own, where its decay allows: [`FACTORED_RANGE`]), split at its first row `a`.
    fn decayed_products(&self) -> (Vec<f32>, Vec<f32>) {
        let (c, d) = (self.beta.len(), self.d);
        let (q, k, g) = (&self.q, &self.k, &self.g);
        let (mut kk, mut qk) = (vec![0f32; c * c], vec![0f32; c * c]);
        for first in (0..c).step_by(SUB) {
            let end = (first + SUB).min(c);
            let (rows, anchor) = (end - first, &g[first * d..][..d]);
            // exp(G_a − G_j) for j in the sub-chunk reaches exp(G_a − G_last): factored only while that is finite.
            let factored = (0..d).all(|x| anchor[x] - g[(end - 1) * d + x] <= FACTORED_RANGE);
            let columns = if factored { end } else { first };
            if columns > 0 {
                let (mut keys, mut queries) = (vec![0f32; rows * d], vec![0f32; rows * d]);
                for r in 0..rows {
                    for x in 0..d {
                        let i = (first + r) * d + x;
                        let decay = exp(g[i] - anchor[x]);
                        keys[r * d + x] = k[i] * decay;
                        queries[r * d + x] = q[i] * decay;
                    }
                }
                let earlier_t = transposed(&k[..columns * d], &g[..columns * d], anchor, d);
                gemm((&keys, d), (&earlier_t, columns), (&mut kk[first * c..], c), [rows, d, columns]);
                gemm((&queries, d), (&earlier_t, columns), (&mut qk[first * c..], c), [rows, d, columns]);
            }
            for i in first..end {
                if factored {
                    kk[i * c + i + 1..i * c + end].fill(0.0);
                    qk[i * c + i + 1..i * c + end].fill(0.0);
                    continue;
                }
                // Within the sub-chunk, per element.
                for j in first..=i {
                    let (mut with_k, mut with_q) = (0f32, 0f32);
                    for x in 0..d {
                        let decay = exp(g[i * d + x] - g[j * d + x]);
                        with_k += k[i * d + x] * k[j * d + x] * decay;
                        with_q += q[i * d + x] * k[j * d + x] * decay;
                    }
                    kk[i * c + j] = with_k;
                    qk[i * c + j] = with_q;
                }
            }
        }
        (kk, qk)
    }

    /// `T = (I + L)⁻¹` `[c, c]` with `L[i][j] = β_i·kk(i, j)` strictly below the diagonal, by forward substitution
    /// one row at a time as the torch form does: `T[i, :i] = −L[i, :i] · T[:i, :i]`, `T[i][i] = 1`.
    fn inverse(&self, kk: &[f32]) -> Vec<f32> {
        let c = self.beta.len();
        let mut t = vec![0f32; c * c];
        let mut row = vec![0f32; c];
        for i in 0..c {
            for j in 0..i {
                row[j] = -self.beta[i] * kk[i * c + j];
            }
            let (done, rest) = t.split_at_mut(i * c);
            gemm((&row, c), (done, c), (&mut *rest, c), [1, i, i]);
            rest[i] = 1.0;
        }
        t
    }
}

/// `[d, rows]`: the transpose of `k ⊙ exp(anchor − g)` (`k`, `g` `[rows, d]`, `anchor` `[d]`), the products taken
/// row by row first so that they vectorize.
fn transposed(k: &[f32], g: &[f32], anchor: &[f32], d: usize) -> Vec<f32> {
    let rows = k.len() / d;
    let mut scaled = vec![0f32; rows * d];
    for ((out, k), g) in scaled.chunks_exact_mut(d).zip(k.chunks_exact(d)).zip(g.chunks_exact(d)) {
        for x in 0..d {
            out[x] = k[x] * exp(anchor[x] - g[x]);
        }
    }
    let mut t = vec![0f32; d * rows];
    for (j, row) in scaled.chunks_exact(d).enumerate() {
        for (x, &value) in row.iter().enumerate() {
            t[x * rows + j] = value;
        }
    }
    t
}
