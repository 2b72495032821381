//! mHC hyper-connections (GLM-5.3-Flash; transformers 5.24 `Glm5NextTextHyperConnection`): the residual stream
//! is `N` streams per token (`[tokens, N · hidden]`); before each block (attention, MLP) a one-layer perceptron of
//! the unweighted-RMS-normed streams gives per token the weights that collapse the streams into the block's input
//! (`pre`), expand the block's output back (`post`) and mix the streams (`comb`, made doubly stochastic by
//! Sinkhorn-Knopp). The first layer takes `N` copies of the embedding; the final norm takes the streams' mean
//! (DeepSeek-V4, whose mHC is the same: their weighted sum, [`HyperHead`]).
//! Computed on the host (its one projection on the backend).

use crate::load::weights::WeightReader;
use crate::model::config::HyperConnections;
use crate::model::ModelConfig;
use crate::runtime::backend::Backend;
use crate::runtime::matrix::Matrix;
use crate::runtime::tensor::Tensor;
use crate::runtime::RuntimeError;

/// One block's mHC weights (`hc_attn_*` or `hc_ffn_*` of a layer).
pub struct HyperWeights {
    /// `fn` `[(2 + N)·N, N · hidden]`.
    projection: Matrix,
    /// `base` `[(2 + N)·N]`.
    base: Vec<f32>,
    /// `scale` `[3]`: of `pre`, `post` and `comb`.
    scale: [f32; 3],
    settings: HyperConnections,
    hidden: usize,
    /// The unweighted norm's epsilon (`rms_norm_eps`).
    norm_eps: f32,
}

/// A block's per-token expand and mix weights, from [`HyperWeights::enter`] to [`exit`].
pub struct HyperMix {
    /// `[tokens, N]`.
    post: Vec<f32>,
    /// `[tokens, N, N]`: `comb[t][m][n]` carries stream `m` into stream `n`.
    comb: Vec<f32>,
    streams: usize,
}

impl HyperMix {
    /// The weights of the tokens `rows` only (a decode step's requests left after some faulted).
    pub fn rows(&self, rows: &[usize]) -> Self {
        let n = self.streams;
        Self {
            post: rows.iter().flat_map(|&t| self.post[t * n..][..n].iter().copied()).collect(),
            comb: rows.iter().flat_map(|&t| self.comb[t * n * n..][..n * n].iter().copied()).collect(),
            streams: n,
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl HyperWeights {
    /// The mHC weights of decoder layer `layer` before its attention (`site` `attn`) or MLP (`ffn`).
    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize, site: &str) -> Result<Self, RuntimeError> {
        let settings = config
            .hyper_connections()
            .ok_or_else(|| RuntimeError::Input(format!("layer {layer}: mHC weights in a model without hc_mult")))?;
        let (n, hidden) = (settings.streams, config.hidden_size);
        let prefix = config.layer_prefix(layer);
        let name = |part: &str| format!("{prefix}.hc_{site}_{part}");
        let scale = reader.vector(&name("scale"), 3)?;
        Ok(Self {
            projection: reader.matrix(&name("fn"), [(2 + n) * n, n * hidden])?,
            base: reader.vector(&name("base"), (2 + n) * n)?,
            scale: [scale[0], scale[1], scale[2]],
            settings,
            hidden,
            norm_eps: config.rms_norm_eps as f32,
        })
    }

    /// Its one weight matrix, the projection (for device prefetch).
    pub fn matrix(&self) -> &Matrix {
        &self.projection
    }

    /// The block's input `[tokens, hidden]` (the streams collapsed by `pre`) and the weights [`exit`] takes.
    pub fn enter(&self, backend: &dyn Backend, streams: &Tensor) -> Result<(Tensor, HyperMix), RuntimeError> {
        let HyperConnections { streams: n, eps, sinkhorn_iters } = self.settings;
        let (hidden, eps) = (self.hidden, eps as f32);
        let width = n * hidden;
        let values = backend.download(streams)?;
        let tokens = streams.rows();
        let normed = unweighted_norm(&values, width, self.norm_eps);
        let mixed = backend.download(&backend.linear(&backend.upload(&normed, width)?, &self.projection, None)?)?;
        let parts = (2 + n) * n;
        let (mut post, mut comb) = (vec![0f32; tokens * n], vec![0f32; tokens * n * n]);
        let mut collapsed = vec![0f32; tokens * hidden];
        for t in 0..tokens {
            let w = &mixed[t * parts..][..parts];
            let pre: Vec<f32> = (0..n).map(|i| sigmoid(w[i] * self.scale[0] + self.base[i]) + eps).collect();
            for i in 0..n {
                post[t * n + i] = 2.0 * sigmoid(w[n + i] * self.scale[1] + self.base[n + i]);
            }
            let c = &mut comb[t * n * n..][..n * n];
            for (m, row) in c.chunks_exact_mut(n).enumerate() {
                let logits: Vec<f32> =
                    (0..n).map(|i| w[2 * n + m * n + i] * self.scale[2] + self.base[2 * n + m * n + i]).collect();
                let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let total: f32 = logits.iter().map(|l| (l - top).exp()).sum();
                for (value, logit) in row.iter_mut().zip(&logits) {
                    *value = (logit - top).exp() / total + eps;
                }
            }
            normalize_columns(c, n, eps);
            for _ in 1..sinkhorn_iters {
                for row in c.chunks_exact_mut(n) {
                    let total: f32 = row.iter().sum::<f32>() + eps;
                    row.iter_mut().for_each(|v| *v /= total);
                }
                normalize_columns(c, n, eps);
            }
            let out = &mut collapsed[t * hidden..][..hidden];
            for (i, stream) in values[t * width..][..width].chunks_exact(hidden).enumerate() {
                for (o, v) in out.iter_mut().zip(stream) {
                    *o += pre[i] * v;
                }
            }
        }
        Ok((backend.upload(&collapsed, hidden)?, HyperMix { post, comb, streams: n }))
    }
}

/// Each column of the `[n, n]` matrix `c` divided by its sum plus `eps`.
fn normalize_columns(c: &mut [f32], n: usize, eps: f32) {
    for column in 0..n {
        let total: f32 = (0..n).map(|m| c[m * n + column]).sum::<f32>() + eps;
        (0..n).for_each(|m| c[m * n + column] /= total);
    }
}

/// The streams after a block: stream `n` of token `t` becomes `post[t][n] · out[t] + Σ_m comb[t][m][n] ·
/// stream_m[t]` (`out` `[tokens, hidden]`, the block's output).
pub fn exit(backend: &dyn Backend, streams: &mut Tensor, out: &Tensor, mix: &HyperMix) -> Result<(), RuntimeError> {
    let n = mix.streams;
    let hidden = out.columns();
    let (values, out) = (backend.download(streams)?, backend.download(out)?);
    let mut next = vec![0f32; values.len()];
    for (t, (row, next)) in values.chunks_exact(n * hidden).zip(next.chunks_exact_mut(n * hidden)).enumerate() {
        let block = &out[t * hidden..][..hidden];
        for (i, target) in next.chunks_exact_mut(hidden).enumerate() {
            let post = mix.post[t * n + i];
            for (o, b) in target.iter_mut().zip(block) {
                *o = post * b;
            }
            for (m, source) in row.chunks_exact(hidden).enumerate() {
                let weight = mix.comb[(t * n + m) * n + i];
                for (o, s) in target.iter_mut().zip(source) {
                    *o += weight * s;
                }
            }
        }
    }
    *streams = backend.upload(&next, n * hidden)?;
    Ok(())
}

/// The residual stream entering the first layer for embedded rows `hidden` `[tokens, hidden_size]`: as it is, or
/// with mHC `N` copies of each row side by side.
pub fn widen(backend: &dyn Backend, config: &ModelConfig, hidden: Tensor) -> Result<Tensor, RuntimeError> {
    let Some(settings) = config.hyper_connections() else { return Ok(hidden) };
    let values = backend.download(&hidden)?;
    let widened: Vec<f32> =
        values.chunks_exact(config.hidden_size).flat_map(|row| row.repeat(settings.streams)).collect();
    backend.upload(&widened, config.residual_width())
}

/// The residual stream leaving the last layer as the final norm takes it: as it is, or with mHC the mean of the
/// streams (GLM-5.3-Flash's `Glm5NextTextHyperHead`) or DeepSeek-V4's weighted sum ([`HyperHead`]).
pub fn narrow(
    backend: &dyn Backend,
    reader: &WeightReader,
    config: &ModelConfig,
    streams: Tensor,
) -> Result<Tensor, RuntimeError> {
    let Some(settings) = config.hyper_connections() else { return Ok(streams) };
    if config.deepseek_v4().is_some() {
        return HyperHead::load(reader, config, "")?.collapse(backend, &streams);
    }
    let (n, hidden) = (settings.streams, config.hidden_size);
    let values = backend.download(&streams)?;
    let mut mean = vec![0f32; values.len() / n];
    for (row, out) in values.chunks_exact(n * hidden).zip(mean.chunks_exact_mut(hidden)) {
        for stream in row.chunks_exact(hidden) {
            out.iter_mut().zip(stream).for_each(|(o, v)| *o += v);
        }
        out.iter_mut().for_each(|o| *o /= n as f32);
    }
    backend.upload(&mean, hidden)
}

/// DeepSeek-V4's hyper-head (transformers 5.24 `DeepseekV4HyperHead`): the streams collapsed by per-token weights
/// `sigmoid(fn · unweighted_rms_norm(streams) · scale + base) + hc_eps` (`hc_head_*`).
pub struct HyperHead {
    projection: Matrix,
    base: Vec<f32>,
    scale: f32,
    settings: HyperConnections,
    hidden: usize,
    norm_eps: f32,
}

impl HyperHead {
    /// The hyper-head stored under `prefix` (`""` for the model's, `mtp.J.` for a draft layer's).
    pub fn load(reader: &WeightReader, config: &ModelConfig, prefix: &str) -> Result<Self, RuntimeError> {
        let settings = config
            .hyper_connections()
            .ok_or_else(|| RuntimeError::Input("a hyper-head in a model without hc_mult".into()))?;
        let (n, hidden) = (settings.streams, config.hidden_size);
        Ok(Self {
            projection: reader.matrix(&format!("{prefix}hc_head_fn"), [n, n * hidden])?,
            base: reader.vector(&format!("{prefix}hc_head_base"), n)?,
            scale: reader.vector(&format!("{prefix}hc_head_scale"), 1)?[0],
            settings,
            hidden,
            norm_eps: config.rms_norm_eps as f32,
        })
    }

    /// The streams `[tokens, N · hidden]` collapsed to `[tokens, hidden]`.
    pub fn collapse(&self, backend: &dyn Backend, streams: &Tensor) -> Result<Tensor, RuntimeError> {
        let (n, hidden) = (self.settings.streams, self.hidden);
        let values = backend.download(streams)?;
        let normed = unweighted_norm(&values, n * hidden, self.norm_eps);
        let mixes =
            backend.download(&backend.linear(&backend.upload(&normed, n * hidden)?, &self.projection, None)?)?;
        let mut collapsed = vec![0f32; values.len() / n];
        for ((row, mix), out) in
            values.chunks_exact(n * hidden).zip(mixes.chunks_exact(n)).zip(collapsed.chunks_exact_mut(hidden))
        {
            for ((stream, m), b) in row.chunks_exact(hidden).zip(mix).zip(&self.base) {
                let pre = sigmoid(m * self.scale + b) + self.settings.eps as f32;
                out.iter_mut().zip(stream).for_each(|(o, v)| *o += pre * v);
            }
        }
        backend.upload(&collapsed, hidden)
    }
}

/// Each `width`-wide row of `values` divided by its root mean square (plus `eps` under the root).
fn unweighted_norm(values: &[f32], width: usize, eps: f32) -> Vec<f32> {
    let mut normed = values.to_vec();
    for row in normed.chunks_exact_mut(width) {
        let mean = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
        let inverse = 1.0 / (mean + eps).sqrt();
        row.iter_mut().for_each(|v| *v *= inverse);
    }
    normed
}
