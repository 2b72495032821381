//! DeepSeek-V4 (Flash, Pro; `DeepseekV4ForCausalLM`, `deepseek_v4`) as DeepSeek ships it: the config keys squeeze
//! reads and every tensor the checkpoint holds, in DeepSeek's own names (no `model.` prefix), which are also the
//! names vLLM loads (`vllm/models/deepseek_v4/nvidia/model.py`, `_make_deepseek_v4_weights_mapper`).
//!
//! From DeepSeek's `inference/model.py` (V4-Flash) and transformers 5.24 `models/deepseek_v4/`
//! (`configuration_deepseek_v4.py`): each layer's attention is a single-KV-head MLA-like core (`wq_a`, `wq_b`,
//! `wkv` of `head_dim`, grouped output `wo_a`/`wo_b`, per-head `attn_sink`) whose compression ratio
//! (`compress_ratios`, or transformers' `layer_types`) adds a compressor (ratio 4: CSA, with an indexer; 128: HCA)
//! or nothing (0: sliding window only); the first `num_hash_layers` MoE routers pick experts by token id
//! (`ffn.gate.tid2eid` I32 `[vocab, top_k]`, no bias); mHC hyper-connections keep `hc_mult` streams (`hc_*` F32);
//! `mtp.N.*` draft layers follow the decoder layers. Routed experts ship MXFP4 (`expert_dtype: fp4`); other linears
//! FP8 e4m3 with E8M0 block scales, but the compressors' `wkv`/`wgate` and the indexer's `weights_proj` (BF16).
//! transformers' config has no indexer `k_norm` for V4 (V4.1 adds `indexer.wk`/`k_norm`, not read here).

use serde_json::Value;

use super::config_error::ConfigError;
use super::hybrid::HyperConnections;
use super::tensor_spec::{TensorRole, TensorSpec};

/// The DeepSeek-V4 keys beside the common ones.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeepseekV4 {
    pub head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_lora_rank: usize,
    pub o_groups: usize,
    pub sliding_window: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    /// Per stored layer (decoder layers, then draft layers): 0 (sliding window only), 4 (CSA) or 128 (HCA).
    pub compress_ratios: Vec<usize>,
    pub num_hash_layers: usize,
    pub hc_mult: usize,
    /// The mHC streams, Sinkhorn iterations and epsilon (`hc_mult`, `hc_sinkhorn_iters`, `hc_eps`).
    pub hyper: HyperConnections,
    /// RoPE base of the compressed layers, their compressors and indexers (transformers' `compress` rope).
    pub compress_rope_theta: f64,
    /// The SwiGLU clamp of routed and shared experts (`swiglu_limit`).
    pub swiglu_limit: f64,
    /// Routed experts shipped as MXFP4 (`expert_dtype: "fp4"`, vLLM's default) rather than FP8.
    pub experts_fp4: bool,
}

/// transformers' `layer_types` names of the compression ratios.
const LAYER_TYPES: [(&str, usize); 3] =
    [("sliding_attention", 0), ("compressed_sparse_attention", 4), ("heavily_compressed_attention", 128)];

impl DeepseekV4 {
    /// Reads the keys from `config` (the text config); `stored_layers` = decoder + draft layers.
    pub fn parse(
        config: &Value,
        num_hidden_layers: usize,
        stored_layers: usize,
        get: &dyn Fn(&str) -> Result<Option<usize>, ConfigError>,
        float: &dyn Fn(&str, f64) -> Result<f64, ConfigError>,
    ) -> Result<Self, ConfigError> {
        let need = |key: &str| get(key)?.ok_or_else(|| ConfigError::Missing(key.into()));
        let unsupported = |key: &str, value: String, hint: &str| ConfigError::Unsupported {
            key: key.into(),
            value,
            hint: hint.into(),
        };
        let compress_ratios: Vec<usize> = match (config.get("compress_ratios"), config.get("layer_types")) {
            (Some(Value::Array(list)), _) => list
                .iter()
                .map(|ratio| match ratio.as_u64() {
                    Some(ratio @ (0 | 4 | 128)) => Ok(ratio as usize),
                    _ => Err(unsupported("compress_ratios", ratio.to_string(), "each ratio is 0, 4 or 128")),
                })
                .collect::<Result<_, _>>()?,
            (_, Some(Value::Array(list))) => list
                .iter()
                .map(|kind| {
                    let name = kind.as_str().unwrap_or_default();
                    LAYER_TYPES.iter().find(|(known, _)| *known == name).map(|(_, ratio)| *ratio).ok_or_else(|| {
                        unsupported(
                            "layer_types",
                            kind.to_string(),
                            "DeepSeek-V4 layer types are sliding_attention, compressed_sparse_attention and \
                             heavily_compressed_attention",
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(ConfigError::Missing("compress_ratios".into())),
        };
        // DeepSeek's list covers the draft layers too (44 entries for 43 + 1); transformers' `layer_types` only the
        // decoder layers: a draft layer without an entry is sliding-window only, as transformers leaves it.
        let key = if config.get("compress_ratios").is_some() { "compress_ratios" } else { "layer_types" };
        if compress_ratios.len() < num_hidden_layers || compress_ratios.len() > stored_layers.max(num_hidden_layers + 1)
        {
            return Err(unsupported(
                key,
                format!("{} entries", compress_ratios.len()),
                &format!(
                    "one per decoder layer ({num_hidden_layers}), optionally followed by one per draft layer \
                     ({stored_layers} in all)"
                ),
            ));
        }
        let mut compress_ratios = compress_ratios;
        compress_ratios.resize(stored_layers.max(compress_ratios.len()), 0);
        compress_ratios.truncate(stored_layers);
        let expert_dtype = config.get("expert_dtype").and_then(Value::as_str).unwrap_or("fp4");
        if !matches!(expert_dtype, "fp4" | "fp8") {
            return Err(unsupported(
                "expert_dtype",
                format!("{expert_dtype:?}"),
                "DeepSeek-V4 ships fp4 or fp8 experts",
            ));
        }
        let hc_mult = get("hc_mult")?.unwrap_or(4);
        if hc_mult == 0 {
            return Err(unsupported(
                "hc_mult",
                "0".into(),
                "the residual stream needs at least one mHC stream (V4: 4)",
            ));
        }
        let num_hash_layers = match config.get("mlp_layer_types").and_then(Value::as_array) {
            Some(kinds) => hash_layers(kinds, num_hidden_layers)?,
            None => get("num_hash_layers")?.unwrap_or(3),
        };
        Ok(Self {
            head_dim: need("head_dim")?,
            qk_rope_head_dim: get("qk_rope_head_dim")?.unwrap_or(64),
            q_lora_rank: need("q_lora_rank")?,
            o_lora_rank: need("o_lora_rank")?,
            o_groups: need("o_groups")?,
            sliding_window: get("sliding_window")?.unwrap_or(128),
            index_n_heads: need("index_n_heads")?,
            index_head_dim: need("index_head_dim")?,
            index_topk: get("index_topk")?.unwrap_or(512),
            compress_ratios,
            num_hash_layers,
            hc_mult,
            hyper: HyperConnections {
                streams: hc_mult,
                eps: float("hc_eps", 1e-6)?,
                sinkhorn_iters: get("hc_sinkhorn_iters")?.unwrap_or(20).max(1),
            },
            compress_rope_theta: float("compress_rope_theta", 160000.0)?,
            swiglu_limit: float("swiglu_limit", 10.0)?,
            experts_fp4: expert_dtype == "fp4",
        })
    }

    /// The stored prefix of layer `layer`: `layers.N` for decoder layers, `mtp.J` for draft layers.
    pub fn prefix(layer: usize, num_hidden_layers: usize) -> String {
        match layer.checked_sub(num_hidden_layers) {
            Some(draft) => format!("mtp.{draft}"),
            None => format!("layers.{layer}"),
        }
    }

    /// KV-cache entries a layer keeps per `tokens` of context: the sliding window's last `sliding_window` tokens,
    /// plus one compressed entry per `ratio` tokens in compressed layers (CSA and HCA).
    pub fn cached_entries(&self, layer: usize, tokens: usize) -> usize {
        let window = tokens.min(self.sliding_window);
        match self.compress_ratios.get(layer).copied().unwrap_or(0) {
            0 => window,
            ratio => window + tokens / ratio,
        }
    }
}

/// The number of hash-routed layers transformers' `mlp_layer_types` gives: its leading `hash_moe` entries, one entry
/// per decoder layer, every later one `moe`.
fn hash_layers(kinds: &[Value], layers: usize) -> Result<usize, ConfigError> {
    let unsupported =
        |value: String, hint: String| ConfigError::Unsupported { key: "mlp_layer_types".into(), value, hint };
    if kinds.len() < layers {
        return Err(unsupported(format!("{} entries", kinds.len()), format!("one per decoder layer ({layers})")));
    }
    let hash = kinds.iter().take_while(|kind| kind.as_str() == Some("hash_moe")).count().min(layers);
    match kinds[hash..layers].iter().find(|kind| kind.as_str() != Some("moe")) {
        Some(kind) => {
            Err(unsupported(kind.to_string(), "DeepSeek-V4's MLP layers are hash_moe (the first ones) then moe".into()))
        }
        None => Ok(hash),
    }
}

/// The sizes every layer shares, from the common keys.
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub vocab: usize,
    pub experts: usize,
    pub top_k: usize,
    pub moe_intermediate: usize,
    pub shared_experts: usize,
    pub num_hidden_layers: usize,
    pub stored_layers: usize,
}

/// Every tensor of a DeepSeek-V4 checkpoint, in DeepSeek's names.
pub fn tensor_specs(v4: &DeepseekV4, dims: &Dims) -> Vec<TensorSpec> {
    use TensorRole::*;
    let mut specs = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, role: TensorRole| specs.push(TensorSpec { name, shape, role });
    let (hidden, m) = (dims.hidden, v4.hc_mult);
    push("embed.weight".into(), vec![dims.vocab, hidden], Embedding);
    for layer in 0..dims.stored_layers {
        let prefix = DeepseekV4::prefix(layer, dims.num_hidden_layers);
        if layer >= dims.num_hidden_layers {
            push(format!("{prefix}.e_proj.weight"), vec![hidden, hidden], Linear);
            push(format!("{prefix}.h_proj.weight"), vec![hidden, hidden], Linear);
            for norm in ["enorm", "hnorm", "norm"] {
                push(format!("{prefix}.{norm}.weight"), vec![hidden], Norm);
            }
            push(format!("{prefix}.hc_head_fn"), vec![m, m * hidden], Float32);
            push(format!("{prefix}.hc_head_base"), vec![m], Float32);
            push(format!("{prefix}.hc_head_scale"), vec![1], Float32);
        }
        push(format!("{prefix}.attn_norm.weight"), vec![hidden], Norm);
        push(format!("{prefix}.ffn_norm.weight"), vec![hidden], Norm);
        for site in ["attn", "ffn"] {
            push(format!("{prefix}.hc_{site}_fn"), vec![(2 + m) * m, m * hidden], Float32);
            push(format!("{prefix}.hc_{site}_base"), vec![(2 + m) * m], Float32);
            push(format!("{prefix}.hc_{site}_scale"), vec![3], Float32);
        }
        let attn = format!("{prefix}.attn");
        let (head_dim, q_rank) = (v4.head_dim, v4.q_lora_rank);
        push(format!("{attn}.attn_sink"), vec![dims.heads], Float32);
        push(format!("{attn}.wq_a.weight"), vec![q_rank, hidden], Linear);
        push(format!("{attn}.q_norm.weight"), vec![q_rank], Norm);
        push(format!("{attn}.wq_b.weight"), vec![dims.heads * head_dim, q_rank], Linear);
        push(format!("{attn}.wkv.weight"), vec![head_dim, hidden], Linear);
        push(format!("{attn}.kv_norm.weight"), vec![head_dim], Norm);
        let grouped = v4.o_groups * v4.o_lora_rank;
        push(format!("{attn}.wo_a.weight"), vec![grouped, dims.heads * head_dim / v4.o_groups.max(1)], Linear);
        push(format!("{attn}.wo_b.weight"), vec![hidden, grouped], Linear);
        let ratio = v4.compress_ratios.get(layer).copied().unwrap_or(0);
        let mut compressor = |at: String, ratio: usize, dim: usize| {
            let overlap = if ratio == 4 { 2 } else { 1 };
            push(format!("{at}.ape"), vec![ratio, overlap * dim], Float32);
            push(format!("{at}.wkv.weight"), vec![overlap * dim, hidden], LinearBf16);
            push(format!("{at}.wgate.weight"), vec![overlap * dim, hidden], LinearBf16);
            push(format!("{at}.norm.weight"), vec![dim], Norm);
        };
        if ratio != 0 {
            compressor(format!("{attn}.compressor"), ratio, head_dim);
        }
        if ratio == 4 {
            compressor(format!("{attn}.indexer.compressor"), 4, v4.index_head_dim);
            push(format!("{attn}.indexer.wq_b.weight"), vec![v4.index_n_heads * v4.index_head_dim, q_rank], Linear);
            push(format!("{attn}.indexer.weights_proj.weight"), vec![v4.index_n_heads, hidden], LinearBf16);
        }
        let ffn = format!("{prefix}.ffn");
        push(format!("{ffn}.gate.weight"), vec![dims.experts, hidden], LinearBf16);
        if layer < v4.num_hash_layers {
            push(format!("{ffn}.gate.tid2eid"), vec![dims.vocab, dims.top_k], TokenTable);
        } else {
            push(format!("{ffn}.gate.bias"), vec![dims.experts], RouterBias);
        }
        let expert = if v4.experts_fp4 { ExpertMxfp4 } else { Linear };
        let inner = dims.moe_intermediate;
        for e in 0..dims.experts {
            push(format!("{ffn}.experts.{e}.w1.weight"), vec![inner, hidden], expert);
            push(format!("{ffn}.experts.{e}.w2.weight"), vec![hidden, inner], expert);
            push(format!("{ffn}.experts.{e}.w3.weight"), vec![inner, hidden], expert);
        }
        let shared = inner * dims.shared_experts;
        push(format!("{ffn}.shared_experts.w1.weight"), vec![shared, hidden], Linear);
        push(format!("{ffn}.shared_experts.w2.weight"), vec![hidden, shared], Linear);
        push(format!("{ffn}.shared_experts.w3.weight"), vec![shared, hidden], Linear);
    }
    push("norm.weight".into(), vec![hidden], Norm);
    push("hc_head_fn".into(), vec![m, m * hidden], Float32);
    push("hc_head_base".into(), vec![m], Float32);
    push("hc_head_scale".into(), vec![1], Float32);
    push("head.weight".into(), vec![dims.vocab, hidden], Embedding);
    specs
}
