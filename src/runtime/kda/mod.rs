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

mod chunked;

use rayon::prelude::*;

use chunked::Chunk;

use super::host::exp::exp;

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
    let mut qkv = short_conv_silu(inputs.qkv, 3 * width, shape.conv_kernel, params.conv, &mut state.conv);
    let scale = (shape.head_dim as f32).powf(-0.5);
    qkv.par_chunks_mut(3 * width).for_each(|row| {
        for head in row[..width].chunks_exact_mut(shape.head_dim) {
            l2_normalize(head);
            head.iter_mut().for_each(|x| *x *= scale);
        }
        row[width..2 * width].chunks_exact_mut(shape.head_dim).for_each(l2_normalize);
    });
    let g = forget_gate(inputs.forget, params, shape);
    let beta: Vec<f32> = inputs.beta.iter().map(|&b| sigmoid(b)).collect();
    let sequence = Sequence { qkv: &qkv, g: &g, beta: &beta, tokens };
    let mut out = delta_rule(shape, &sequence, &mut state.recurrent, mode);
    gated_norm(&mut out, inputs.gate, params, shape.head_dim);
    out
}

/// The depthwise causal convolution of `x` `[tokens, channels]` continuing from `state` (the previous `kernel − 1`
/// inputs, oldest first; zeros before a sequence's first token), then SiLU; `state` becomes the last `kernel − 1`
/// inputs. `weight` is `[channels, kernel]`, its last tap on the current token.
pub fn short_conv_silu(x: &[f32], channels: usize, kernel: usize, weight: &[f32], state: &mut [f32]) -> Vec<f32> {
    let history = kernel.saturating_sub(1);
    let tokens = x.len() / channels.max(1);
    // Input row `r` of the history followed by `x`.
    let input = |r: usize| {
        if r < history {
            &state[r * channels..][..channels]
        } else {
            &x[(r - history) * channels..][..channels]
        }
    };
    // The weights tap by tap, so that each tap is one pass over a row's channels.
    let taps: Vec<f32> = (0..kernel).flat_map(|tap| (0..channels).map(move |c| weight[c * kernel + tap])).collect();
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(channels.max(1)).enumerate().for_each(|(t, out)| {
        for (tap, weights) in taps.chunks_exact(channels.max(1)).enumerate() {
            for ((sum, &w), &value) in out.iter_mut().zip(weights).zip(input(t + tap)) {
                *sum += w * value;
            }
        }
        out.iter_mut().for_each(|sum| *sum /= 1.0 + exp(-*sum));
    });
    let last: Vec<f32> = (tokens..tokens + history).flat_map(|r| input(r).to_vec()).collect();
    state.copy_from_slice(&last);
    out
}

/// `x / sqrt(Σx² + ε)` (FLA's `l2norm`: ε under the root, not a floor).
fn l2_normalize(x: &mut [f32]) {
    let norm = (x.iter().map(|v| v * v).sum::<f32>() + L2_EPS).sqrt();
    x.iter_mut().for_each(|v| *v /= norm);
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// The per-channel log decay `[tokens, width]`: Kimi-Linear's `g = −exp(A_log[h]) · softplus(forget + dt_bias)`,
/// or GLM-5.3-Flash's safe gate `g = lower_bound · sigmoid(exp(A_log[h]) · (forget + dt_bias))` (both ≤ 0; the
/// safe one bounded below).
fn forget_gate(forget: &[f32], params: &KdaParams, shape: &KdaShape) -> Vec<f32> {
    let width = shape.width();
    let rates: Vec<f32> = params.a_log.iter().map(|&a| exp(a)).collect();
    let mut g = vec![0f32; forget.len()];
    g.par_chunks_mut(width.max(1)).zip(forget.par_chunks(width.max(1))).for_each(|(g, forget)| {
        for (channel, (g, &f)) in g.iter_mut().zip(forget).enumerate() {
            let x = f + params.dt_bias[channel];
            let rate = rates[channel / shape.head_dim];
            *g = match params.gate_lower_bound {
                Some(bound) => bound * sigmoid(rate * x),
                None => -rate * if x > SOFTPLUS_LINEAR { x } else { (1.0 + exp(x)).ln() },
            };
        }
    });
    g
}

/// RMSNorm over each head's `head_dim` values with `o_norm`, times `sigmoid(gate)`, in place.
fn gated_norm(out: &mut [f32], gate: &[f32], params: &KdaParams, head_dim: usize) {
    out.par_chunks_mut(head_dim).zip(gate.par_chunks(head_dim)).for_each(|(head, gate)| {
        let mean = head.iter().map(|v| v * v).sum::<f32>() / head_dim as f32;
        let inverse = 1.0 / (mean + params.eps).sqrt();
        for ((value, &weight), &gate) in head.iter_mut().zip(params.o_norm).zip(gate) {
            *value = weight * (*value * inverse) * sigmoid(gate);
        }
    });
}

/// A sequence's normalized inputs to the delta rule, row-major over tokens: `qkv` `[tokens, 3 · width]` (queries,
/// keys, values side by side), `g` `[tokens, width]`, `beta` `[tokens, heads]`.
struct Sequence<'a> {
    qkv: &'a [f32],
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

/// Which of the projections [`HeadView::row`] reads.
#[derive(Clone, Copy)]
enum Part {
    Q,
    K,
    V,
    G,
}

impl HeadView<'_> {
    fn row(&self, part: Part, t: usize) -> &[f32] {
        let width = self.heads * self.d;
        let column = self.head * self.d;
        match part {
            Part::Q => &self.sequence.qkv[t * 3 * width + column..][..self.d],
            Part::K => &self.sequence.qkv[t * 3 * width + width + column..][..self.d],
            Part::V => &self.sequence.qkv[t * 3 * width + 2 * width + column..][..self.d],
            Part::G => &self.sequence.g[t * width + column..][..self.d],
        }
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
            let (q, k, v, g) = (self.row(Part::Q, t), self.row(Part::K, t), self.row(Part::V, t), self.row(Part::G, t));
            for (row, &g) in state.chunks_exact_mut(d).zip(g) {
                let decay = exp(g);
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
            let rows = |part: Part| -> Vec<f32> {
                let mut rows = Vec::with_capacity(c * d);
                (start..start + c).for_each(|t| rows.extend_from_slice(self.row(part, t)));
                rows
            };
            // Cumulative log decay within the chunk.
            let mut g = rows(Part::G);
            for i in 1..c {
                for x in 0..d {
                    g[i * d + x] += g[(i - 1) * d + x];
                }
            }
            let beta = (start..start + c).map(|t| self.beta(t)).collect();
            let chunk = Chunk { q: rows(Part::Q), k: rows(Part::K), v: rows(Part::V), g, beta, d };
            out[start * d..][..c * d].copy_from_slice(&chunk.run(state));
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
                beta: &self.beta[range.start * self.shape.heads..range.end * self.shape.heads],
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
    fn a_gate_decaying_past_f32s_range_within_a_chunk_stays_finite_and_equal() {
        // exp(A_log) ≈ 20 and forget ≈ 4: a decay of about e^−80 per token, e^−5000 across a chunk, which a chunk
        // product factored around a single point would overflow.
        let tokens = CHUNK + 40;
        let mut case = Case::new(tokens, 5);
        case.a_log = vec![3.0; 3];
        case.forget.iter_mut().for_each(|f| *f = 4.0 + f.abs());
        let (mut chunked, mut recurrent) = (KdaState::new(&case.shape), KdaState::new(&case.shape));
        let a = kda(&case.shape, &case.params(), &case.inputs(0..tokens), &mut chunked, KdaMode::Chunked);
        let b = kda(&case.shape, &case.params(), &case.inputs(0..tokens), &mut recurrent, KdaMode::Recurrent);
        assert!(a.iter().chain(&chunked.recurrent).all(|x| x.is_finite()));
        assert!(relative(&a, &b) < 1e-5, "outputs differ: {:.3e}", relative(&a, &b));
        assert!(relative(&chunked.recurrent, &recurrent.recurrent) < 1e-5);
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
    #[ignore = "benchmark; prints timings"]
    fn chunked_prefill_timing() {
        // KDA_BENCH="heads,head_dim,tokens" (default Kimi-Linear's 32 heads × 128 over 4096 tokens): the whole op
        // per token, its chunk products' rate, and the GEMM kernel's rate on the chunk's largest product alone.
        let sizes: Vec<usize> = std::env::var("KDA_BENCH")
            .unwrap_or_else(|_| "32,128,4096".into())
            .split(',')
            .map(|n| n.trim().parse().expect("KDA_BENCH: three numbers"))
            .collect();
        let (heads, d, tokens) = (sizes[0], sizes[1], sizes[2]);
        let shape = KdaShape { heads, head_dim: d, conv_kernel: 4 };
        let (w, mut rng) = (shape.width(), Rng::new(1));
        let case = Case {
            conv: random(&mut rng, 3 * w * 4, 0.6),
            dt_bias: random(&mut rng, w, 1.0),
            a_log: random(&mut rng, heads, 0.5),
            o_norm: random(&mut rng, d, 1.0),
            qkv: random(&mut rng, tokens * 3 * w, 2.0),
            forget: random(&mut rng, tokens * w, 2.0),
            beta: random(&mut rng, tokens * heads, 2.0),
            gate: random(&mut rng, tokens * w, 2.0),
            shape,
        };
        let best = |run: &mut dyn FnMut()| {
            (0..3)
                .map(|_| {
                    let start = std::time::Instant::now();
                    run();
                    start.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let op = best(&mut || {
            let mut state = KdaState::new(&shape);
            std::hint::black_box(kda(&shape, &case.params(), &case.inputs(0..tokens), &mut state, KdaMode::Chunked));
        });
        // Multiply-adds ×2 of one full chunk's GEMMs per head (chunked.rs): the sub-chunk products, T, [U | W],
        // W·S, the output and the state update.
        let (c, sub) = (CHUNK as f64, 16.0);
        let dd = d as f64;
        let products = 2.0 * (1..=4).map(|a| sub * dd * (a as f64 * sub)).sum::<f64>();
        let per_chunk =
            2.0 * (products + c * c * c / 3.0 + c * c * 2.0 * dd + c * dd * dd + c * (dd + c) * dd + dd * c * dd);
        let flops = per_chunk * heads as f64 * (tokens as f64 / c);
        // The GEMM kernel alone: the output product [c, d + c] · [d + c, d], once per head and chunk, in parallel.
        let (left, right) = (random(&mut rng, CHUNK * (d + CHUNK), 1.0), random(&mut rng, (d + CHUNK) * d, 1.0));
        let repeats = heads * tokens / CHUNK;
        let kernel = best(&mut || {
            (0..repeats).into_par_iter().for_each(|_| {
                let mut out = vec![0f32; CHUNK * d];
                crate::runtime::host::gemm::gemm((&left, d + CHUNK), (&right, d), (&mut out, d), [CHUNK, d + CHUNK, d]);
                std::hint::black_box(out);
            })
        });
        let kernel_rate = 2.0 * (CHUNK * (d + CHUNK) * d * repeats) as f64 / kernel;
        println!(
            "KDA chunked, {heads} heads × {d}, {tokens} tokens, {} threads: {:.2} µs/token; chunk products {:.1} \
             GFLOP/s over the whole op = {:.0} % of the GEMM kernel's {:.1} GFLOP/s on [{CHUNK}, {}] · [{}, {d}]",
            rayon::current_num_threads(),
            op / tokens as f64 * 1e6,
            flops / op / 1e9,
            100.0 * (flops / op) / kernel_rate,
            kernel_rate / 1e9,
            d + CHUNK,
            d + CHUNK,
        );
    }

    #[test]
    fn the_convolution_is_causal_with_its_last_tap_on_the_current_token() {
        // One channel, kernel 3: out[t] = silu(w0·x[t−2] + w1·x[t−1] + w2·x[t]).
        let x = vec![1.0, 2.0, 3.0];
        let mut state = vec![0.0, 0.0];
        let x = short_conv_silu(&x, 1, 3, &[0.5, 0.25, 1.0], &mut state);
        let silu = |v: f32| v / (1.0 + (-v).exp());
        assert_eq!(x, [silu(1.0), silu(0.25 + 2.0), silu(0.5 + 0.5 + 3.0)]);
        assert_eq!(state, [2.0, 3.0]);
    }
}
