//! KDA (Kimi Delta Attention), the linear-attention token mixer of Kimi-Linear, Kimi K3 and GLM-5.3-Flash, on host
//! slices: the short causal convolution over the projected queries, keys and values (with its state: the last
//! `kernel − 1` inputs), the per-channel forget gate, and the gated delta rule over a fixed-size state per head —
//! chunked for a prompt (64 tokens a chunk, as FLA's `chunk_kda` and transformers' torch fallback
//! `chunk_kimi_delta_attention` compute it) or token by token for decode (`recurrent_kimi_delta_attention`), the two
//! equal up to rounding — then the output RMSNorm gated by `sigmoid(gate)`. Everything in f32, as FLA keeps the state.
//!
//! Per token, with `q`, `k` L2-normalized per head (`x / sqrt(Σx² + 1e-6)`) and `q` scaled by `head_dim^-½`, the
//! forget gate `g = −exp(A_log[h]) · softplus(f + dt_bias)` (per channel, ≤ 0) and `β = sigmoid(b)` (per head):
//!
//! ```text
//! S ← diag(exp(g)) · S                 S: [head_dim (keys), head_dim (values)] per head
//! S ← S + k ⊗ β·(v − kᵀS)             the delta rule
//! o = qᵀ S
//! ```

use rayon::prelude::*;

/// Tokens per chunk of the chunked form (FLA's and transformers' `chunk_size`).
pub const CHUNK: usize = 64;
/// FLA's `l2norm` epsilon (added under the square root).
const L2_EPS: f32 = 1e-6;
/// transformers' softplus: `x` itself above this.
const SOFTPLUS_LINEAR: f32 = 20.0;

/// The sizes of a KDA layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdaShape {
    pub heads: usize,
    pub head_dim: usize,
    /// The short convolution's kernel (`short_conv_kernel_size`).
    pub conv_kernel: usize,
}

impl KdaShape {
    /// Channels of each of the queries, keys and values: `heads · head_dim`.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Values of the convolution state: the last `kernel − 1` inputs of the `3 · width` channels.
    pub fn conv_state_len(&self) -> usize {
        self.conv_kernel.saturating_sub(1) * 3 * self.width()
    }

    /// Values of the recurrent state: one `[head_dim, head_dim]` matrix per head.
    pub fn recurrent_state_len(&self) -> usize {
        self.heads * self.head_dim * self.head_dim
    }
}

/// What a request carries through a KDA layer from one token to the next, whatever its length: the convolution's
/// last inputs `[kernel − 1, 3 · width]` (oldest first) and the delta rule's state `[heads, head_dim, head_dim]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KdaState {
    pub conv: Vec<f32>,
    pub recurrent: Vec<f32>,
}

impl KdaState {
    /// The state before the first token: zeros.
    pub fn new(shape: &KdaShape) -> Self {
        Self { conv: vec![0.0; shape.conv_state_len()], recurrent: vec![0.0; shape.recurrent_state_len()] }
    }

    /// The state as an engine stores and hands it over (vLLM `mamba_utils.py` `kda_state_dtype`): the convolution
    /// inputs in the model's dtype (BF16), the recurrent state in F32.
    pub fn as_stored(&mut self) {
        for value in &mut self.conv {
            *value = half::bf16::from_f32(*value).to_f32();
        }
    }
}

/// How the delta rule runs over a span of tokens (the same result up to rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdaMode {
    /// In chunks of [`CHUNK`] tokens: matrix products within a chunk, the state carried between chunks (prefill).
    Chunked,
    /// One token at a time (decode).
    Recurrent,
}

/// A KDA layer's own parameters besides its projections.
pub struct KdaParams<'a> {
    /// Depthwise convolution weights `[3 · width, kernel]` over the queries, keys and values side by side.
    pub conv: &'a [f32],
    /// `dt_bias` `[width]`.
    pub dt_bias: &'a [f32],
    /// `A_log`, one per head.
    pub a_log: &'a [f32],
    /// The output norm's weight `[head_dim]`.
    pub o_norm: &'a [f32],
    pub eps: f32,
    /// GLM-5.3-Flash's safe gate's lower bound ([`forget_gate`]); `None` for Kimi-Linear's softplus gate.
    pub gate_lower_bound: Option<f32>,
}

/// One sequence's projections, row-major over its tokens: `qkv` `[tokens, 3 · width]` (before the convolution),
/// `forget` `[tokens, width]` (`f_b_proj`'s output), `beta` `[tokens, heads]` (`b_proj`'s, before the sigmoid),
/// `gate` `[tokens, width]` (the output gate before the sigmoid).
pub struct KdaInputs<'a> {
    pub qkv: &'a [f32],
    pub forget: &'a [f32],
    pub beta: &'a [f32],
    pub gate: &'a [f32],
}

/// The KDA mixer's output `[tokens, width]` (what `o_proj` takes) for one sequence continuing from `state`, which
/// it advances past the sequence's tokens.
pub fn kda(shape: &KdaShape, params: &KdaParams, inputs: &KdaInputs, state: &mut KdaState, mode: KdaMode) -> Vec<f32> {
    let width = shape.width();
    let tokens = inputs.forget.len() / width.max(1);
    let mut qkv = inputs.qkv.to_vec();
    short_conv_silu(&mut qkv, 3 * width, shape.conv_kernel, params.conv, &mut state.conv);
    let (mut q, mut k, mut v) = (vec![0f32; tokens * width], vec![0f32; tokens * width], vec![0f32; tokens * width]);
    for (t, row) in qkv.chunks_exact(3 * width).enumerate() {
        q[t * width..][..width].copy_from_slice(&row[..width]);
        k[t * width..][..width].copy_from_slice(&row[width..2 * width]);
        v[t * width..][..width].copy_from_slice(&row[2 * width..]);
    }
    let scale = (shape.head_dim as f32).powf(-0.5);
    for head in q.chunks_exact_mut(shape.head_dim) {
        l2_normalize(head);
        head.iter_mut().for_each(|x| *x *= scale);
    }
    k.chunks_exact_mut(shape.head_dim).for_each(l2_normalize);
    let g = forget_gate(inputs.forget, params, shape);
    let beta: Vec<f32> = inputs.beta.iter().map(|&b| sigmoid(b)).collect();
    let sequence = Sequence { q: &q, k: &k, v: &v, g: &g, beta: &beta, tokens };
    let mut out = delta_rule(shape, &sequence, &mut state.recurrent, mode);
    gated_norm(&mut out, inputs.gate, params, shape.head_dim);
    out
}

/// The depthwise causal convolution of `x` `[tokens, channels]` in place, continuing from `state` (the previous
/// `kernel − 1` inputs, oldest first; zeros before a sequence's first token), then SiLU; `state` becomes the last
/// `kernel − 1` inputs. `weight` is `[channels, kernel]`, its last tap on the current token.
pub fn short_conv_silu(x: &mut [f32], channels: usize, kernel: usize, weight: &[f32], state: &mut [f32]) {
    let history = kernel.saturating_sub(1);
    let tokens = x.len() / channels.max(1);
    let mut padded = Vec::with_capacity((history + tokens) * channels);
    padded.extend_from_slice(state);
    padded.extend_from_slice(x);
    for t in 0..tokens {
        for c in 0..channels {
            let mut sum = 0f32;
            for tap in 0..kernel {
                sum += weight[c * kernel + tap] * padded[(t + tap) * channels + c];
            }
            x[t * channels + c] = sum / (1.0 + (-sum).exp());
        }
    }
    state.copy_from_slice(&padded[tokens * channels..]);
}

/// `x / sqrt(Σx² + ε)` (FLA's `l2norm`: ε under the root, not a floor).
fn l2_normalize(x: &mut [f32]) {
    let norm = (x.iter().map(|v| v * v).sum::<f32>() + L2_EPS).sqrt();
    x.iter_mut().for_each(|v| *v /= norm);
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The per-channel log decay `[tokens, width]`: Kimi-Linear's `g = −exp(A_log[h]) · softplus(forget + dt_bias)`,
/// or GLM-5.3-Flash's safe gate `g = lower_bound · sigmoid(exp(A_log[h]) · (forget + dt_bias))` (both ≤ 0; the
/// safe one bounded below).
fn forget_gate(forget: &[f32], params: &KdaParams, shape: &KdaShape) -> Vec<f32> {
    let width = shape.width();
    forget
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            let channel = i % width;
            let x = f + params.dt_bias[channel];
            let rate = params.a_log[channel / shape.head_dim].exp();
            match params.gate_lower_bound {
                Some(bound) => bound * sigmoid(rate * x),
                None => -rate * if x > SOFTPLUS_LINEAR { x } else { (1.0 + x.exp()).ln() },
            }
        })
        .collect()
}

/// RMSNorm over each head's `head_dim` values with `o_norm`, times `sigmoid(gate)`, in place.
fn gated_norm(out: &mut [f32], gate: &[f32], params: &KdaParams, head_dim: usize) {
    for (head, gate) in out.chunks_exact_mut(head_dim).zip(gate.chunks_exact(head_dim)) {
        let mean = head.iter().map(|v| v * v).sum::<f32>() / head_dim as f32;
        let inverse = 1.0 / (mean + params.eps).sqrt();
        for ((value, &weight), &gate) in head.iter_mut().zip(params.o_norm).zip(gate) {
            *value = weight * (*value * inverse) * sigmoid(gate);
        }
    }
}

/// A sequence's normalized inputs to the delta rule, row-major over tokens (`beta` `[tokens, heads]`, the rest
/// `[tokens, width]`).
struct Sequence<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    tokens: usize,
}

/// The delta rule's output `[tokens, width]` over every head (in parallel), advancing `recurrent`.
fn delta_rule(shape: &KdaShape, sequence: &Sequence, recurrent: &mut [f32], mode: KdaMode) -> Vec<f32> {
    let (heads, d) = (shape.heads, shape.head_dim);
    let per_head: Vec<Vec<f32>> = recurrent
        .par_chunks_mut(d * d)
        .enumerate()
        .map(|(h, state)| {
            let head = HeadView { sequence, head: h, heads, d };
            match mode {
                KdaMode::Chunked => head.chunked(state),
                KdaMode::Recurrent => head.recurrent(state),
            }
        })
        .collect();
    let width = heads * d;
    let mut out = vec![0f32; sequence.tokens * width];
    for (h, values) in per_head.iter().enumerate() {
        for t in 0..sequence.tokens {
            out[t * width + h * d..][..d].copy_from_slice(&values[t * d..][..d]);
        }
    }
    out
}

/// One head of a sequence: row `t`'s `head_dim` values of q, k, v, g and its β.
struct HeadView<'a> {
    sequence: &'a Sequence<'a>,
    head: usize,
    heads: usize,
    d: usize,
}

impl HeadView<'_> {
    fn row<'s>(&self, of: &'s [f32], t: usize) -> &'s [f32] {
        &of[(t * self.heads + self.head) * self.d..][..self.d]
    }

    fn beta(&self, t: usize) -> f32 {
        self.sequence.beta[t * self.heads + self.head]
    }

    /// Token by token: `[tokens, d]`.
    fn recurrent(&self, state: &mut [f32]) -> Vec<f32> {
        let d = self.d;
        let s = self.sequence;
        let mut out = vec![0f32; s.tokens * d];
        let mut remembered = vec![0f32; d];
        for t in 0..s.tokens {
            let (q, k, v, g) = (self.row(s.q, t), self.row(s.k, t), self.row(s.v, t), self.row(s.g, t));
            for (row, &g) in state.chunks_exact_mut(d).zip(g) {
                let decay = g.exp();
                row.iter_mut().for_each(|x| *x *= decay);
            }
            remembered.iter_mut().for_each(|x| *x = 0.0);
            for (row, &k) in state.chunks_exact(d).zip(k) {
                for (m, &s) in remembered.iter_mut().zip(row) {
                    *m += s * k;
                }
            }
            let beta = self.beta(t);
            let delta: Vec<f32> = v.iter().zip(&remembered).map(|(v, m)| (v - m) * beta).collect();
            for (row, &k) in state.chunks_exact_mut(d).zip(k) {
                for (s, &delta) in row.iter_mut().zip(&delta) {
                    *s += k * delta;
                }
            }
            let o = &mut out[t * d..][..d];
            for (row, &q) in state.chunks_exact(d).zip(q) {
                for (o, &s) in o.iter_mut().zip(row) {
                    *o += q * s;
                }
            }
        }
        out
    }

    /// In chunks of [`CHUNK`] tokens (the last one shorter: the zero padding the torch form adds changes nothing).
    fn chunked(&self, state: &mut [f32]) -> Vec<f32> {
        let d = self.d;
        let s = self.sequence;
        let mut out = vec![0f32; s.tokens * d];
        for start in (0..s.tokens).step_by(CHUNK) {
            let c = CHUNK.min(s.tokens - start);
            let rows = |of: &[f32]| -> Vec<f32> { (start..start + c).flat_map(|t| self.row(of, t).to_vec()).collect() };
            let (q, k, v) = (rows(s.q), rows(s.k), rows(s.v));
            // Cumulative log decay within the chunk.
            let mut cumulative = rows(s.g);
            for i in 1..c {
                for x in 0..d {
                    cumulative[i * d + x] += cumulative[(i - 1) * d + x];
                }
            }
            let beta: Vec<f32> = (start..start + c).map(|t| self.beta(t)).collect();
            // The decay-weighted products for j ≤ i, each exp(G[i,x] − G[j,x]) computed once for both:
            // kk(i, j) = Σ_x k[i,x]·k[j,x]·exp(G[i,x] − G[j,x]) and qk(i, j) the same with q[i,x].
            let (mut kk, mut qk) = (vec![0f32; c * c], vec![0f32; c * c]);
            for i in 0..c {
                for j in 0..=i {
                    let (mut with_k, mut with_q) = (0f32, 0f32);
                    for x in 0..d {
                        let decay = (cumulative[i * d + x] - cumulative[j * d + x]).exp();
                        with_k += k[i * d + x] * k[j * d + x] * decay;
                        with_q += q[i * d + x] * k[j * d + x] * decay;
                    }
                    kk[i * c + j] = with_k;
                    qk[i * c + j] = with_q;
                }
            }
            // exp(G[i,x]), for W and the state's contribution.
            let decay_from_start: Vec<f32> = cumulative.iter().map(|g| g.exp()).collect();
            // T = (I + strictly-lower(β_i k_i · k_j decayed))⁻¹, by forward substitution as the torch form does.
            let mut t_matrix = vec![0f32; c * c];
            for i in 0..c {
                for j in 0..i {
                    t_matrix[i * c + j] = -beta[i] * kk[i * c + j];
                }
            }
            for i in 1..c {
                let row: Vec<f32> = t_matrix[i * c..i * c + i].to_vec();
                for j in 0..i {
                    let mut sum = row[j];
                    for (m, &r) in row.iter().enumerate().skip(j + 1) {
                        sum += r * t_matrix[m * c + j];
                    }
                    t_matrix[i * c + j] = sum;
                }
            }
            for i in 0..c {
                t_matrix[i * c + i] = 1.0;
            }
            // U = T · (β v), W = T · (β k ⊙ exp(G)).
            let (mut u, mut w) = (vec![0f32; c * d], vec![0f32; c * d]);
            for i in 0..c {
                for j in 0..=i {
                    let factor = t_matrix[i * c + j] * beta[j];
                    for x in 0..d {
                        u[i * d + x] += factor * v[j * d + x];
                        w[i * d + x] += factor * k[j * d + x] * decay_from_start[j * d + x];
                    }
                }
            }
            // v_new = U − W·S; out = (q ⊙ exp(G))·S + Σ_{j≤i} qk(i, j) v_new_j.
            let mut v_new = u;
            for i in 0..c {
                for (x, row) in state.chunks_exact(d).enumerate() {
                    let weight = w[i * d + x];
                    for (value, &s) in v_new[i * d..][..d].iter_mut().zip(row) {
                        *value -= weight * s;
                    }
                }
            }
            for i in 0..c {
                let o = &mut out[(start + i) * d..][..d];
                for (x, row) in state.chunks_exact(d).enumerate() {
                    let weight = q[i * d + x] * decay_from_start[i * d + x];
                    for (o, &s) in o.iter_mut().zip(row) {
                        *o += weight * s;
                    }
                }
                for j in 0..=i {
                    let weight = qk[i * c + j];
                    for (o, &value) in o.iter_mut().zip(&v_new[j * d..][..d]) {
                        *o += weight * value;
                    }
                }
            }
            // S ← diag(exp(G_last))·S + Σ_i (k_i ⊙ exp(G_last − G_i)) ⊗ v_new_i.
            let last = &cumulative[(c - 1) * d..][..d];
            for (x, row) in state.chunks_exact_mut(d).enumerate() {
                let decay = last[x].exp();
                row.iter_mut().for_each(|s| *s *= decay);
                for i in 0..c {
                    let weight = k[i * d + x] * (last[x] - cumulative[i * d + x]).exp();
                    for (s, &value) in row.iter_mut().zip(&v_new[i * d..][..d]) {
                        *s += weight * value;
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn random(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| rng.signed() * scale).collect()
    }

    struct Case {
        shape: KdaShape,
        conv: Vec<f32>,
        dt_bias: Vec<f32>,
        a_log: Vec<f32>,
        o_norm: Vec<f32>,
        qkv: Vec<f32>,
        forget: Vec<f32>,
        beta: Vec<f32>,
        gate: Vec<f32>,
    }

    impl Case {
        fn new(tokens: usize, seed: u64) -> Self {
            let shape = KdaShape { heads: 3, head_dim: 8, conv_kernel: 4 };
            let (w, mut rng) = (shape.width(), Rng::new(seed));
            Self {
                conv: random(&mut rng, 3 * w * 4, 0.6),
                dt_bias: random(&mut rng, w, 1.0),
                a_log: random(&mut rng, 3, 0.5),
                o_norm: random(&mut rng, 8, 1.0),
                qkv: random(&mut rng, tokens * 3 * w, 2.0),
                forget: random(&mut rng, tokens * w, 2.0),
                beta: random(&mut rng, tokens * 3, 2.0),
                gate: random(&mut rng, tokens * w, 2.0),
                shape,
            }
        }

        fn params(&self) -> KdaParams<'_> {
            KdaParams {
                conv: &self.conv,
                dt_bias: &self.dt_bias,
                a_log: &self.a_log,
                o_norm: &self.o_norm,
                eps: 1e-5,
                gate_lower_bound: None,
            }
        }

        /// Tokens `range` as inputs.
        fn inputs(&self, range: std::ops::Range<usize>) -> KdaInputs<'_> {
            let w = self.shape.width();
            KdaInputs {
                qkv: &self.qkv[range.start * 3 * w..range.end * 3 * w],
                forget: &self.forget[range.start * w..range.end * w],
                beta: &self.beta[range.start * 3..range.end * 3],
                gate: &self.gate[range.start * w..range.end * w],
            }
        }
    }

    fn relative(a: &[f32], b: &[f32]) -> f64 {
        let difference: f64 = a.iter().zip(b).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let norm: f64 = b.iter().map(|b| (*b as f64).powi(2)).sum();
        (difference / norm).sqrt()
    }

    #[test]
    fn chunked_equals_recurrent_across_chunk_edges() {
        let tokens = 2 * CHUNK + 7;
        let case = Case::new(tokens, 7);
        let (mut chunked, mut recurrent) = (KdaState::new(&case.shape), KdaState::new(&case.shape));
        let a = kda(&case.shape, &case.params(), &case.inputs(0..tokens), &mut chunked, KdaMode::Chunked);
        let b = kda(&case.shape, &case.params(), &case.inputs(0..tokens), &mut recurrent, KdaMode::Recurrent);
        assert!(relative(&a, &b) < 1e-5, "outputs differ: {:.3e}", relative(&a, &b));
        assert!(relative(&chunked.recurrent, &recurrent.recurrent) < 1e-5);
        assert_eq!(chunked.conv, recurrent.conv);
        assert!(a.iter().all(|x| x.is_finite()) && relative(&a, &vec![0.0; a.len()]) > 0.0);
    }

    #[test]
    fn a_prompt_ending_inside_a_chunk_then_decode_across_the_edge_equals_one_pass() {
        // Prefill 60 tokens chunked (ends inside the first chunk), then decode 10 one at a time across token 64.
        let (prompt, tokens) = (CHUNK - 4, CHUNK + 6);
        let case = Case::new(tokens, 11);
        let mut whole = KdaState::new(&case.shape);
        let reference = kda(&case.shape, &case.params(), &case.inputs(0..tokens), &mut whole, KdaMode::Chunked);
        let mut state = KdaState::new(&case.shape);
        let mut got = kda(&case.shape, &case.params(), &case.inputs(0..prompt), &mut state, KdaMode::Chunked);
        for t in prompt..tokens {
            got.extend(kda(&case.shape, &case.params(), &case.inputs(t..t + 1), &mut state, KdaMode::Recurrent));
        }
        assert!(relative(&got, &reference) < 1e-5, "{:.3e}", relative(&got, &reference));
        assert!(relative(&state.recurrent, &whole.recurrent) < 1e-5);
        assert_eq!(state.conv, whole.conv);
    }

    #[test]
    fn the_conv_state_and_the_gates_change_the_output() {
        // Each piece matters: dropping the carried conv state, the forget gate or β changes what decode returns.
        let case = Case::new(20, 3);
        let mut state = KdaState::new(&case.shape);
        kda(&case.shape, &case.params(), &case.inputs(0..19), &mut state, KdaMode::Chunked);
        let step = |state: &KdaState, params: &KdaParams| {
            kda(&case.shape, params, &case.inputs(19..20), &mut state.clone(), KdaMode::Recurrent)
        };
        let reference = step(&state, &case.params());
        let no_conv = KdaState { conv: vec![0.0; state.conv.len()], ..state.clone() };
        assert!(relative(&step(&no_conv, &case.params()), &reference) > 1e-2);
        let no_decay = vec![-30.0; 3];
        let params = KdaParams { a_log: &no_decay, ..case.params() };
        assert!(relative(&step(&state, &params), &reference) > 1e-2);
    }

    #[test]
    fn the_convolution_is_causal_with_its_last_tap_on_the_current_token() {
        // One channel, kernel 3: out[t] = silu(w0·x[t−2] + w1·x[t−1] + w2·x[t]).
        let mut x = vec![1.0, 2.0, 3.0];
        let mut state = vec![0.0, 0.0];
        short_conv_silu(&mut x, 1, 3, &[0.5, 0.25, 1.0], &mut state);
        let silu = |v: f32| v / (1.0 + (-v).exp());
        assert_eq!(x, [silu(1.0), silu(0.25 + 2.0), silu(0.5 + 0.5 + 3.0)]);
        assert_eq!(state, [2.0, 3.0]);
    }
}
