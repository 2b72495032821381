//! KV-cache bytes per token on one GPU: the MLA latent row (plus the DSA indexer's key row) or GQA's K and V heads,
//! per layer and over the decoder layers, for a BF16 or FP8 cache.

use crate::format::kv_scales::KvDtype;
use crate::model::config::{KdaKeys, Layout};
use crate::model::{Attention, ModelConfig};

/// Elements per FP32 scale in the DSA indexer's FP8 key cache (vLLM `DeepseekV32IndexerCache`, SGLang NSA).
pub const INDEXER_QUANT_BLOCK: usize = 128;

/// KV bytes one token costs on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KvPerToken {
    pub dtype: KvDtype,
    /// Decoder layers that cache KV: `num_hidden_layers` (MTP layers excluded).
    pub layers: usize,
    /// Elements cached per token per layer on one GPU: MLA `kv_lora_rank + qk_rope_head_dim`;
    /// GQA `2 × kv_heads_per_gpu × head_dim`.
    pub elements_per_layer: usize,
    /// DSA indexer key bytes per cached entry in a layer that runs an indexer (always FP8 with FP32 scales; 0
    /// without an indexer): one entry per token, or per pool of [`Self::indexer_pool`] tokens.
    pub indexer_bytes_per_layer: u64,
    /// Tokens per cached indexer entry: GLM-5.3-Flash's `index_kpool` (vLLM `Glm5NextIndexerCache` stores one
    /// pooled key per pool, `tokens_per_state`); absent (1) elsewhere.
    #[serde(skip_serializing_if = "is_one")]
    pub indexer_pool: usize,
    /// Decoder layers that run their own indexer and so cache its keys (GLM-5.2's `full` layers; `shared` layers
    /// reuse a selection and get no indexer cache in vLLM, which builds no indexer there, or SGLang, whose DSA pool
    /// gives them a 0-row buffer).
    pub indexer_layers: usize,
    /// `elements_per_layer × dtype bytes + indexer_bytes_per_layer` (a layer with an indexer).
    pub bytes_per_layer: u64,
    /// `elements_per_layer × dtype bytes × layers + indexer_bytes_per_layer × indexer_layers`; DeepSeek-V4: what
    /// each context token adds at length, `Σ row bytes / ratio` over its compressed layers plus the CSA indexer's
    /// key per compressed entry (rounded up).
    pub bytes_per_token: u64,
    /// Bytes each request holds whatever its length (absent when 0): KDA's recurrent state (F32) and convolution
    /// tail (BF16) per linear-attention layer, DeepSeek-V4's sliding window of `sliding_window` tokens in every layer.
    #[serde(skip_serializing_if = "is_zero")]
    pub state_bytes_per_request: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn is_one(value: &usize) -> bool {
    *value == 1
}

/// The k-pool indexer's per-request tail on one GPU (vLLM `Glm5NextTailCache`, no speculative tokens): a ring of
/// `index_kpool` rows of the pool being filled, each the raw key and the gate score in BF16 (`2 × index_head_dim`).
fn kpool_tail_bytes(pool: usize, index_head_dim: usize) -> usize {
    if pool > 1 {
        pool * 2 * index_head_dim * 2
    } else {
        0
    }
}

/// KDA's per-request state per layer on one GPU, in bytes, as vLLM keeps it (`kda.py`, `mamba_utils.py`
/// `kda_state_shape`/`kda_state_dtype`): the `heads × head_dim × head_dim` recurrent state in F32 and the last
/// `kernel − 1` inputs of the q, k and v convolutions in the model's dtype (BF16), both split over the
/// `attention_tp` ranks by heads.
fn kda_state_bytes(kda: &KdaKeys, attention_tp: usize) -> usize {
    let heads = kda.heads.div_ceil(attention_tp.max(1));
    let width = heads * kda.head_dim;
    heads * kda.head_dim * kda.head_dim * 4 + 3 * width * kda.conv_kernel.saturating_sub(1) * 2
}

/// KV heads each GPU holds under `attention_tp`-way tensor-parallel attention: heads are split, and a rank
/// that would get less than one head holds a replica of one.
pub fn kv_heads_per_gpu(num_key_value_heads: usize, attention_tp: usize) -> usize {
    num_key_value_heads.div_ceil(attention_tp.max(1)).max(1)
}

/// Bytes of KV per token on one GPU when attention runs `attention_tp`-way tensor parallel
/// (`tp` without DP attention, 1 with it). MLA's latent row is replicated on every rank whatever `attention_tp`.
pub fn per_token(config: &ModelConfig, dtype: KvDtype, attention_tp: usize) -> KvPerToken {
    let elements_per_layer = match &config.attention {
        Attention::Mla { kv_lora_rank, qk_rope_head_dim, .. } => kv_lora_rank + qk_rope_head_dim,
        Attention::Gqa { num_key_value_heads, head_dim, .. } => {
            2 * kv_heads_per_gpu(*num_key_value_heads, attention_tp) * head_dim
        }
    };
    let indexer_bytes_per_layer = config
        .indexer
        .as_ref()
        .map(|indexer| (indexer.index_head_dim + indexer.index_head_dim / INDEXER_QUANT_BLOCK * 4) as u64)
        .unwrap_or(0);
    let row_bytes = (elements_per_layer * dtype.bytes()) as u64;
    if let Some(kda) = config.kda() {
        // Only the attention layers cache keys and values (and indexer keys); a KDA layer keeps a fixed state per
        // request.
        let attention: Vec<usize> = (0..config.num_hidden_layers).filter(|&l| !config.is_kda_layer(l)).collect();
        let indexer_layers = attention.iter().filter(|&&layer| config.runs_indexer(layer)).count();
        let kda_layers = config.num_hidden_layers - attention.len();
        let indexer = config.indexer.as_ref();
        let pool = indexer.and_then(|indexer| indexer.kpool.as_ref()).map_or(1, |kpool| kpool.size.max(1));
        let tail = kpool_tail_bytes(pool, indexer.map_or(0, |indexer| indexer.index_head_dim)) * indexer_layers;
        return KvPerToken {
            dtype,
            layers: attention.len(),
            elements_per_layer,
            indexer_bytes_per_layer,
            indexer_pool: pool,
            indexer_layers,
            bytes_per_layer: row_bytes + indexer_bytes_per_layer.div_ceil(pool as u64),
            bytes_per_token: row_bytes * attention.len() as u64
                + (indexer_bytes_per_layer * indexer_layers as u64).div_ceil(pool as u64),
            state_bytes_per_request: (kda_state_bytes(&kda, attention_tp) * kda_layers + tail) as u64,
        };
    }
    if let Some(Layout::DeepseekV4(v4)) = &config.layout {
        // One `head_dim` row per cached entry: every layer the last `sliding_window` tokens, compressed layers
        // one more entry per `ratio` tokens (CSA with its indexer's FP8 key). An FP8 row is vLLM 0.32's
        // `fp8_ds_mla` slot (`models/deepseek_v4/attention.py`: "448B NoPE + 128B RoPE + 8B fp8 scale = 584B per
        // token"): the NoPE part FP8 with a UE8M0 scale per 64, the RoPE part BF16.
        let nope = v4.head_dim - v4.qk_rope_head_dim.min(v4.head_dim);
        let row_bytes = match dtype {
            KvDtype::Fp8 => (nope + 2 * (v4.head_dim - nope) + nope.div_ceil(64).next_multiple_of(8)) as u64,
            _ => row_bytes,
        };
        let ratios = &v4.compress_ratios[..config.num_hidden_layers.min(v4.compress_ratios.len())];
        let compressed: Vec<usize> = ratios.iter().copied().filter(|&ratio| ratio > 0).collect();
        let indexer_bytes_per_layer = (v4.index_head_dim + v4.index_head_dim / INDEXER_QUANT_BLOCK * 4) as u64;
        let csa_layers = compressed.iter().filter(|&&ratio| ratio == 4).count();
        let growth: f64 = compressed.iter().map(|&ratio| row_bytes as f64 / ratio as f64).sum::<f64>()
            + csa_layers as f64 * indexer_bytes_per_layer as f64 / 4.0;
        return KvPerToken {
            dtype,
            layers: compressed.len(),
            elements_per_layer,
            indexer_bytes_per_layer,
            indexer_pool: 1,
            indexer_layers: csa_layers,
            bytes_per_layer: row_bytes,
            bytes_per_token: growth.ceil() as u64,
            state_bytes_per_request: row_bytes * (v4.sliding_window * ratios.len()) as u64,
        };
    }
    let layers = config.num_hidden_layers;
    let indexer_layers = (0..layers).filter(|&layer| config.runs_indexer(layer)).count();
    KvPerToken {
        dtype,
        layers,
        elements_per_layer,
        indexer_bytes_per_layer,
        indexer_pool: 1,
        indexer_layers,
        bytes_per_layer: row_bytes + indexer_bytes_per_layer,
        bytes_per_token: row_bytes * layers as u64 + indexer_bytes_per_layer * indexer_layers as u64,
        state_bytes_per_request: 0,
    }
}

#[cfg(test)]
mod tests {

    /// vLLM 0.32 stores a V4 FP8 KV row as its `fp8_ds_mla` slot: 448 B of NoPE FP8, 128 B of BF16 RoPE, 8 B of
    /// UE8M0 scales (`models/deepseek_v4/attention.py`); a BF16 row is `head_dim` × 2.
    #[test]
    fn deepseek_v4_fp8_rows_are_vllm_fp8_ds_mla_slots() {
        let config = config_from("deepseek-v4-flash");
        assert_eq!(per_token(&config, KvDtype::Fp8, 8).bytes_per_layer, 584);
        assert_eq!(per_token(&config, KvDtype::Bf16, 8).bytes_per_layer, 1024);
    }
    use super::*;

    fn config_from(text: &str) -> ModelConfig {
        let json: serde_json::Value = serde_json::from_str(crate::model::presets::config_text(text).unwrap()).unwrap();
        ModelConfig::from_json(&json).unwrap()
    }

    #[test]
    fn glm53_flash_caches_one_indexer_key_per_pool_and_holds_the_unfinished_pool_per_request() {
        let config = config_from("glm-5.3-flash");
        let bf16 = per_token(&config, KvDtype::Bf16, 8);
        assert_eq!((bf16.layers, bf16.indexer_layers, bf16.indexer_pool), (11, 11, 16));
        assert_eq!(bf16.indexer_bytes_per_layer, 132, "one 128-byte FP8 key + its FP32 scale per pool");
        // NoPE MLA: the 512-wide latent only; the indexer's keys a 16th of a token's each.
        assert_eq!(bf16.bytes_per_token, 11 * 512 * 2 + (11 * 132_u64).div_ceil(16));
        let without_tail = per_token(&config, KvDtype::Bf16, 8).state_bytes_per_request - 11 * 16 * 2 * 128 * 2;
        let mut plain = config.clone();
        plain.indexer.as_mut().unwrap().kpool = None;
        let unpooled = per_token(&plain, KvDtype::Bf16, 8);
        assert_eq!(unpooled.state_bytes_per_request, without_tail, "the tail ring is the only state a pool adds");
        assert_eq!(unpooled.bytes_per_token, 11 * (512 * 2 + 132));
    }

    #[test]
    fn kimi_k2_mla_row_is_576_wide_on_every_rank() {
        let kimi = config_from("kimi-k2");
        let bf16 = per_token(&kimi, KvDtype::Bf16, 8);
        assert_eq!(bf16.elements_per_layer, 576);
        assert_eq!(bf16.bytes_per_layer, 1152);
        assert_eq!(bf16.bytes_per_token, 61 * 576 * 2);
        assert_eq!(bf16.bytes_per_token, 70_272);
        let fp8 = per_token(&kimi, KvDtype::Fp8, 8);
        assert_eq!(fp8.bytes_per_token, 35_136);
        assert_eq!(per_token(&kimi, KvDtype::Bf16, 1), bf16, "the latent row is not split by tensor parallelism");
    }

    #[test]
    fn glm5_adds_the_indexer_key_row() {
        let glm5 = config_from("glm-5");
        let bf16 = per_token(&glm5, KvDtype::Bf16, 8);
        assert_eq!(bf16.indexer_bytes_per_layer, 132, "128 FP8 keys + one FP32 scale");
        assert_eq!(bf16.bytes_per_layer, 576 * 2 + 132);
        assert_eq!(bf16.bytes_per_token, 78 * (576 * 2 + 132));
        assert_eq!(per_token(&glm5, KvDtype::Fp8, 8).bytes_per_token, 78 * (576 + 132));
    }

    #[test]
    fn glm52_caches_indexer_keys_only_in_its_21_full_layers() {
        let glm52 = config_from("glm-5.2");
        let fp8 = per_token(&glm52, KvDtype::Fp8, 8);
        assert_eq!(fp8.indexer_layers, 21);
        assert_eq!(fp8.bytes_per_token, 78 * 576 + 21 * 132);
        assert_eq!(per_token(&glm52, KvDtype::Bf16, 8).bytes_per_token, 78 * 576 * 2 + 21 * 132);
    }

    #[test]
    fn glm45_gqa_heads_are_sharded_then_replicated() {
        let glm45 = config_from("glm-4.5");
        // 8 KV heads × 128, K and V, 92 layers.
        assert_eq!(per_token(&glm45, KvDtype::Bf16, 1).bytes_per_token, 92 * 2 * 8 * 128 * 2);
        assert_eq!(per_token(&glm45, KvDtype::Bf16, 4).bytes_per_token, 92 * 2 * 2 * 128 * 2);
        assert_eq!(per_token(&glm45, KvDtype::Bf16, 8).bytes_per_token, 92 * 2 * 128 * 2);
        // tp 16 > 8 KV heads: each rank keeps a replica of one head.
        assert_eq!(per_token(&glm45, KvDtype::Bf16, 16).bytes_per_token, 92 * 2 * 128 * 2);
        assert_eq!(per_token(&glm45, KvDtype::Fp8, 8).bytes_per_token, 92 * 2 * 128);
    }

    #[test]
    fn kv_heads_round_up() {
        assert_eq!(kv_heads_per_gpu(8, 3), 3);
        assert_eq!(kv_heads_per_gpu(8, 0), 8);
        assert_eq!(kv_heads_per_gpu(1, 8), 1);
    }

    #[test]
    fn indexer_without_a_full_scale_block_has_no_scale_bytes() {
        let mut glm5 = config_from("glm-5");
        if let Some(indexer) = glm5.indexer.as_mut() {
            indexer.index_head_dim = 64;
        }
        assert_eq!(per_token(&glm5, KvDtype::Fp8, 8).indexer_bytes_per_layer, 64);
    }
}
