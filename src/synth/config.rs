//! The `config.json` of a synthetic model: the real keys of each vendor's release (legacy `rope_theta` +
//! `rope_scaling` for Kimi and GLM-4.5, `rope_parameters` for GLM-5) at tiny, deliberately awkward sizes.

use std::str::FromStr;

use serde_json::{json, Value};

/// End-of-sequence token id of the synthetic tokenizer.
pub const EOS_ID: usize = 257;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthArch {
    KimiK2,
    /// Kimi K2.6 as Moonshot ships it: the Kimi K2 text model natively INT4 (routed experts `pack-quantized`
    /// g32, codes in −7…7, everything else BF16) inside the `kimi_k25` vision-language wrapper.
    KimiK26,
    Glm5,
    /// GLM-5.2: GLM-5 with a shared DSA indexer (`indexer_types`), 1 M context, RoPE θ 8e6, an F32 router.
    Glm52,
    Glm45,
    /// Kimi K3 as Moonshot ships it: a `kimi_linear` text model (KDA and NoPE-MLA layers, latent MoE, attention
    /// residuals) with MXFP4 routed experts (compressed-tensors `mxfp4-pack-quantized`, everything else BF16) inside
    /// the `kimi_k3` vision-language wrapper.
    KimiK3,
    /// Kimi-Linear as Moonshot ships it (`kimi_linear`, BF16): KDA layers with a NoPE MLA layer every third
    /// (1-indexed lists), no query LoRA, `block_sparse_moe` experts `w1/w2/w3`.
    KimiLinear,
    /// DeepSeek-V4 (Flash layout) as DeepSeek ships it: native names, FP8 with E8M0 128×128 block scales, MXFP4
    /// routed experts (`weight` I8 + `scale` E8M0), all three attention kinds, hash-routed first layer, mHC, an
    /// MTP layer.
    DeepseekV4,
    /// GLM-5.3-Flash as Z.ai ships it (`glm5_next` wrapper, FP8 e4m3 with 128×128 block scales, text tensors under
    /// `model.language_model.`): KDA layers beside NoPE MLA with the k-pool DSA indexer (a full and a shared
    /// one), mHC, clamped SwiGLU, an MTP layer.
    Glm53Flash,
}

impl SynthArch {
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::KimiK2 => "kimi-k2",
            SynthArch::KimiK26 => "kimi-k2.6",
            SynthArch::Glm5 => "glm5",
            SynthArch::Glm52 => "glm5.2",
            SynthArch::Glm45 => "glm45",
            SynthArch::KimiK3 => "kimi-k3",
            SynthArch::KimiLinear => "kimi-linear",
            SynthArch::DeepseekV4 => "deepseek-v4",
            SynthArch::Glm53Flash => "glm5.3-flash",
        }
    }
}

impl FromStr for SynthArch {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "kimi-k2" => Ok(SynthArch::KimiK2),
            "kimi-k2.6" => Ok(SynthArch::KimiK26),
            "glm5" => Ok(SynthArch::Glm5),
            "glm5.2" => Ok(SynthArch::Glm52),
            "glm45" => Ok(SynthArch::Glm45),
            "kimi-k3" => Ok(SynthArch::KimiK3),
            "kimi-linear" => Ok(SynthArch::KimiLinear),
            "deepseek-v4" => Ok(SynthArch::DeepseekV4),
            "glm5.3-flash" => Ok(SynthArch::Glm53Flash),
            _ => Err(format!(
                "unknown architecture `{text}`; known: kimi-k2, kimi-k2.6, glm5, glm5.2, glm45, kimi-k3, kimi-linear, \
                 deepseek-v4, glm5.3-flash"
            )),
        }
    }
}

/// The sizes a user can set; everything else is derived.
#[derive(Debug, Clone)]
pub struct SynthSize {
    pub layers: usize,
    pub hidden: usize,
    pub experts: usize,
    pub moe_intermediate: usize,
    pub vocab: usize,
    /// DeepSeek-V4 only: the release's attention widths (head_dim 512, qk_rope_head_dim 64, index_head_dim 128),
    /// which vLLM's V4 kernels require, instead of tiny ones.
    pub release_heads: bool,
}

impl Default for SynthSize {
    fn default() -> Self {
        // Not multiples of 128 on purpose: partial FP8 blocks everywhere.
        Self { layers: 3, hidden: 320, experts: 8, moe_intermediate: 160, vocab: 384, release_heads: false }
    }
}

pub fn config_json(arch: SynthArch, size: &SynthSize) -> Value {
    let hidden = size.hidden;
    let heads = 4;
    let common = json!({
        "hidden_size": hidden,
        "num_hidden_layers": size.layers,
        "vocab_size": size.vocab,
        "num_attention_heads": heads,
        "intermediate_size": hidden * 3 / 2 / 32 * 32,
        "moe_intermediate_size": size.moe_intermediate,
        "n_routed_experts": size.experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2.min(size.experts),
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": true,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "tie_word_embeddings": false,
        "bos_token_id": 0,
        "eos_token_id": EOS_ID,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": true,
    });
    if arch == SynthArch::KimiK3 {
        return kimi_k3(common, size);
    }
    if arch == SynthArch::DeepseekV4 {
        return deepseek_v4(common, size);
    }
    if arch == SynthArch::KimiLinear {
        return kimi_linear(common, size);
    }
    if arch == SynthArch::Glm53Flash {
        return glm53_flash(common, size);
    }
    let fp8_deepseek = json!({ "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128] });
    let specific = match arch {
        SynthArch::KimiK2 | SynthArch::KimiK26 => json!({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "num_key_value_heads": heads,
            "q_lora_rank": 96,
            "kv_lora_rank": 64,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 16,
            "v_head_dim": 32,
            "num_nextn_predict_layers": 0,
            "routed_scaling_factor": 2.827,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "moe_layer_freq": 1,
            "rms_norm_eps": 1e-6,
            "rope_theta": 50000.0,
            "rope_scaling": { "type": "yarn", "factor": 32.0, "original_max_position_embeddings": 128, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0 },
            "quantization_config": fp8_deepseek,
        }),
        SynthArch::Glm5 | SynthArch::Glm52 => json!({
            "architectures": ["GlmMoeDsaForCausalLM"],
            "model_type": "glm_moe_dsa",
            "num_key_value_heads": heads,
            "q_lora_rank": 96,
            "kv_lora_rank": 64,
            "qk_nope_head_dim": 48,
            "qk_rope_head_dim": 16,
            "v_head_dim": 64,
            "index_n_heads": 4,
            "index_head_dim": 32,
            "index_topk": 8,
            "num_nextn_predict_layers": 1,
            "routed_scaling_factor": 2.5,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "rms_norm_eps": 1e-5,
            "rope_parameters": { "rope_theta": 1000000.0, "rope_type": "default" },
            "quantization_config": fp8_deepseek,
        }),
        SynthArch::KimiK3 | SynthArch::KimiLinear | SynthArch::DeepseekV4 | SynthArch::Glm53Flash => {
            unreachable!("written by kimi_k3, kimi_linear, deepseek_v4 and glm53_flash")
        }
        SynthArch::Glm45 => json!({
            "architectures": ["Glm4MoeForCausalLM"],
            "model_type": "glm4_moe",
            "num_key_value_heads": 2,
            "head_dim": 64,
            "partial_rotary_factor": 0.5,
            "attention_bias": true,
            "use_qk_norm": true,
            "num_nextn_predict_layers": 1,
            "routed_scaling_factor": 2.5,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,
            "rope_scaling": null,
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "quantization_status": "compressed",
                "config_groups": { "group_0": {
                    "targets": ["Linear"],
                    "weights": { "num_bits": 8, "type": "float", "symmetric": true, "strategy": "block", "block_structure": [128, 128], "dynamic": false, "observer": "minmax" },
                    "input_activations": { "num_bits": 8, "type": "float", "symmetric": true, "strategy": "group", "group_size": 128, "dynamic": true },
                    "output_activations": null
                }},
                "ignore": ["lm_head", "re:.*mlp\\.gate$"],
                "kv_cache_scheme": null
            },
        }),
    };
    let mut merged = common;
    let release = if arch == SynthArch::Glm52 { glm52_keys(size.layers) } else { json!({}) };
    for extra in [specific, release] {
        if let (Some(target), Some(extra)) = (merged.as_object_mut(), extra.as_object()) {
            for (key, value) in extra {
                target.insert(key.clone(), value.clone());
            }
        }
    }
    if arch == SynthArch::KimiK26 {
        return kimi_k25_wrapper(merged);
    }
    merged
}

/// Group size of Moonshot's native INT4 experts.
pub const KIMI_INT4_GROUP: usize = 32;

/// The `kimi_k25` wrapper around a Kimi K2 text config: `quantization_config` (INT4 routed experts, the ignore list
/// Moonshot-derived checkpoints use) inside `text_config`, a small MoonViT `vision_config`, 262,144 positions with
/// YaRN factor 64 (shortened for the tiny model's original window).
fn kimi_k25_wrapper(mut text: Value) -> Value {
    if let Some(object) = text.as_object_mut() {
        object.insert(
            "quantization_config".into(),
            json!({
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "quantization_status": "compressed",
                "config_groups": { "group_0": {
                    "targets": ["Linear"],
                    "weights": { "num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                                 "group_size": KIMI_INT4_GROUP, "dynamic": false, "actorder": null, "observer": "minmax" },
                    "input_activations": null,
                    "output_activations": null
                }},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                           "re:.*vision_tower.*", "re:.*mm_projector.*"],
                "kv_cache_scheme": null
            }),
        );
        object.insert("max_position_embeddings".into(), json!(262_144));
        object.insert(
            "rope_scaling".into(),
            json!({ "type": "yarn", "factor": 64.0, "original_max_position_embeddings": 128, "beta_fast": 1.0,
                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0 }),
        );
    }
    json!({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "media_placeholder_token_id": 258,
        "pad_token_id": 259,
        "text_config": text,
        "vision_config": VISION.config(),
        "torch_dtype": "bfloat16",
    })
}

/// The small MoonViT tower and projector a synthetic K2.6 carries (squeeze never runs them).
pub struct Vision {
    pub hidden: usize,
    pub blocks: usize,
    pub patch: usize,
    pub merge: usize,
}

pub const VISION: Vision = Vision { hidden: 64, blocks: 2, patch: 14, merge: 2 };

impl Vision {
    fn config(&self) -> Value {
        json!({
            "model_type": "kimi_k25_vision",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.blocks,
            "num_attention_heads": 4,
            "patch_size": self.patch,
            "merge_kernel_size": [self.merge, self.merge],
            "intermediate_size": self.hidden * 2,
        })
    }

    /// Every tensor `[name, shape]`, as Moonshot names them, for a text model of width `text_hidden`.
    pub fn tensors(&self, text_hidden: usize) -> Vec<(String, Vec<usize>)> {
        let hidden = self.hidden;
        let merged = hidden * self.merge * self.merge;
        let mut tensors = vec![
            ("vision_tower.patch_embed.proj.weight".to_string(), vec![hidden, 3, self.patch, self.patch]),
            ("vision_tower.patch_embed.proj.bias".to_string(), vec![hidden]),
        ];
        for block in 0..self.blocks {
            let prefix = format!("vision_tower.encoder.blocks.{block}");
            for (name, shape) in [
                ("norm0.weight", vec![hidden]),
                ("wqkv.weight", vec![3 * hidden, hidden]),
                ("wo.weight", vec![hidden, hidden]),
                ("norm1.weight", vec![hidden]),
                ("mlp.fc0.weight", vec![2 * hidden, hidden]),
                ("mlp.fc1.weight", vec![hidden, 2 * hidden]),
            ] {
                tensors.push((format!("{prefix}.{name}"), shape));
            }
        }
        tensors.push(("vision_tower.encoder.final_layernorm.weight".into(), vec![hidden]));
        tensors.push(("mm_projector.pre_norm.weight".into(), vec![hidden]));
        tensors.push(("mm_projector.proj.0.weight".into(), vec![merged, merged]));
        tensors.push(("mm_projector.proj.2.weight".into(), vec![text_hidden, merged]));
        tensors
    }
}

/// What GLM-5.2's `config.json` adds to GLM-5's: the indexer schedule written three ways as the release carries it
/// (`indexer_types`, which transformers and SGLang read; `index_topk_freq`/`index_skip_topk_offset`, which vLLM
/// reads), 1 M positions, RoPE θ 8e6 and an F32 router. The real schedule (full at 0, 1, 2, then every 4th from 6:
/// frequency 4, offset 3) leaves a model of under 8 layers with no shared layer, so small models use frequency 2,
/// offset 1 (full, shared, full, …).
fn glm52_keys(layers: usize) -> Value {
    let (frequency, offset) = if layers >= 8 { (4, 3) } else { (2, 1) };
    let kinds: Vec<&str> = crate::model::config::Indexer::frequency_schedule(layers, frequency, offset)
        .into_iter()
        .map(|full| if full { "full" } else { "shared" })
        .collect();
    json!({
        "indexer_types": kinds,
        "index_topk_freq": frequency,
        "index_skip_topk_offset": offset,
        "max_position_embeddings": 1_048_576,
        "rope_parameters": { "rope_theta": 8_000_000.0, "rope_type": "default" },
        "moe_router_dtype": "float32",
    })
}

/// `common` with `extra`'s keys added (replacing those it has).
fn merge(mut common: Value, extra: Value) -> Value {
    if let (Some(target), Some(extra)) = (common.as_object_mut(), extra.as_object()) {
        for (key, value) in extra {
            target.insert(key.clone(), value.clone());
        }
    }
    common
}

/// Kimi K3's `config.json`: the `kimi_k3` wrapper around a `kimi_linear` text config with K3's keys (full-rank
/// KDA gate, NoPE MLA with output gate and a query LoRA, latent MoE of half the width with its norm, attention
/// residuals, SiTU) at tiny sizes; every 4th layer MLA and the last one too, as K3 lists them (1-indexed); the
/// compressed-tensors MXFP4 config inside `text_config`, ignoring the shared experts as Moonshot's does.
fn kimi_k3(common: Value, size: &SynthSize) -> Value {
    let layers = size.layers;
    let full: Vec<usize> = (1..=layers).filter(|n| n % 4 == 0 || *n == layers).collect();
    let kda: Vec<usize> = (1..=layers).filter(|n| !full.contains(n)).collect();
    let quantization = json!({
        "quant_method": "compressed-tensors",
        "format": "mxfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": { "group_0": {
            "targets": ["Linear"],
            "format": "mxfp4-pack-quantized",
            "weights": { "num_bits": 4, "type": "float", "symmetric": true, "strategy": "group",
                         "group_size": 32, "scale_dtype": "torch.uint8", "dynamic": false },
            "input_activations": null,
            "output_activations": null
        }},
        "ignore": ["lm_head", "re:.*shared_experts.*", "re:.*self_attn.*", "re:.*mlp\\.(gate|up|down)_proj.*",
                   "re:.*routed_expert_(down|up)_proj.*", "re:.*_res_proj.*", "re:.*vision_tower.*",
                   "re:.*mm_projector.*"],
        "kv_cache_scheme": null
    });
    let text = merge(
        common,
        json!({
            "architectures": ["KimiLinearForCausalLM"],
            "model_type": "kimi_linear",
            "num_experts": size.experts,
            "num_experts_per_token": 2.min(size.experts),
            "num_shared_experts": 1,
            "moe_layer_freq": 1,
            "q_lora_rank": 96,
            "kv_lora_rank": 64,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 0,
            "v_head_dim": 32,
            "mla_use_nope": true,
            "mla_use_output_gate": true,
            "routed_expert_hidden_size": size.hidden / 2 / 32 * 32,
            "latent_moe_use_norm": true,
            "attn_res_block_size": 2,
            "hidden_act": "situ",
            "activation_situ_beta": 4.0,
            "activation_situ_linear_beta": 25.0,
            "moe_router_activation_func": "sigmoid",
            "moe_renormalize": true,
            "routed_scaling_factor": 1.0,
            "rms_norm_eps": 1e-5,
            "rope_theta": 50000.0,
            "linear_attn_config": {
                "num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
                "use_full_rank_gate": true, "kda_layers": kda, "full_attn_layers": full,
            },
        }),
    );
    let text = merge(text, json!({ "quantization_config": quantization }));
    json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "media_placeholder_token_id": 258,
        "pad_token_id": 259,
        "text_config": text,
        "vision_config": VISION.config(),
        "torch_dtype": "bfloat16",
    })
}

/// Kimi-Linear's `config.json` at tiny sizes, with the keys of Moonshot's release (`linear_attn_config` with
/// 1-indexed layer lists, `num_experts`/`num_experts_per_token`/`num_shared_experts`, `moe_router_activation_func`,
/// `mla_use_nope`, no `q_lora_rank`); a NoPE MLA layer at every third layer (1-indexed 2, 5, …; the rest KDA),
/// whose shared key part is 16 wide (used without RoPE).
fn kimi_linear(common: Value, size: &SynthSize) -> Value {
    let layers = size.layers;
    let full: Vec<usize> = (1..=layers).filter(|n| n % 3 == 2).collect();
    let kda: Vec<usize> = (1..=layers).filter(|n| !full.contains(n)).collect();
    let mut config = merge(
        common,
        json!({
            "architectures": ["KimiLinearForCausalLM"],
            "model_type": "kimi_linear",
            "num_experts": size.experts,
            "num_experts_per_token": 2.min(size.experts),
            "num_shared_experts": 1,
            "num_expert_group": 1,
            "num_key_value_heads": 4,
            "pad_token_id": EOS_ID,
            "moe_layer_freq": 1,
            "q_lora_rank": null,
            "kv_lora_rank": 64,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 16,
            "v_head_dim": 32,
            "mla_use_nope": true,
            "moe_router_activation_func": "sigmoid",
            "moe_renormalize": true,
            "routed_scaling_factor": 2.446,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "linear_attn_config": {
                "num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4, "kda_layers": kda, "full_attn_layers": full,
            },
        }),
    );
    if let Some(object) = config.as_object_mut() {
        for deepseek in ["n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_group", "norm_topk_prob"] {
            object.remove(deepseek);
        }
    }
    config
}

/// GLM-5.3-Flash's `config.json` at tiny sizes: the `glm5_next` wrapper (FP8 `quantization_config`, a vision
/// config whose tower the synthetic folder leaves out) around a `glm5_next_text` config whose layers cycle KDA,
/// indexed attention with a full indexer, indexed attention sharing it, KDA (transformers runs a shared layer only
/// right after a full one); the first layer dense, the rest MoE; 4 mHC streams; NoPE MLA with a query LoRA; the
/// k-pool indexer pooling 4 tokens and keeping 4 pools; one MTP layer.
fn glm53_flash(common: Value, size: &SynthSize) -> Value {
    let layers = size.layers;
    let layer_types: Vec<&str> = (0..layers)
        .map(|layer| if matches!(layer % 4, 1 | 2) { "indexed_attention" } else { "linear_attention" })
        .collect();
    let indexer_types: Vec<&str> = (0..layers).map(|layer| if layer % 4 == 2 { "shared" } else { "full" }).collect();
    let mlp_layer_types: Vec<&str> = (0..layers).map(|layer| if layer == 0 { "dense" } else { "sparse" }).collect();
    let mut text = merge(
        common,
        json!({
            "model_type": "glm5_next_text",
            "num_key_value_heads": 4,
            "q_lora_rank": 96,
            "kv_lora_rank": 64,
            "qk_nope_head_dim": 48,
            "qk_rope_head_dim": 0,
            "v_head_dim": 64,
            "index_n_heads": 8,
            "index_head_dim": 32,
            "index_topk": 16,
            "index_kpool": 4,
            "index_kpool_always_select_tail": true,
            "layer_types": layer_types,
            "indexer_types": indexer_types,
            "mlp_layer_types": mlp_layer_types,
            "linear_num_heads": 4,
            "linear_head_dim": 32,
            "linear_conv_kernel_dim": 4,
            "linear_lower_bound": -5.0,
            "hc_mult": 4,
            "hc_eps": 1e-6,
            "hc_sinkhorn_iters": 20,
            "swiglu_limit": 10.0,
            "num_nextn_predict_layers": 1,
            "routed_scaling_factor": 2.5,
            "pad_token_id": EOS_ID,
            "rms_norm_eps": 1e-5,
            "rope_parameters": { "rope_theta": 1000000.0, "rope_type": "default" },
        }),
    );
    if let Some(object) = text.as_object_mut() {
        object.remove("first_k_dense_replace");
    }
    json!({
        "architectures": ["Glm5NextForConditionalGeneration"],
        "model_type": "glm5_next",
        "text_config": text,
        "vision_config": { "model_type": "glm5_next_vision", "depth": 1, "hidden_size": 64, "num_heads": 2, "intermediate_size": 128, "out_hidden_size": size.hidden },
        "image_token_id": 254,
        "video_token_id": 255,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "quantization_config": { "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128] },
    })
}

/// DeepSeek-V4's `config.json` (the Flash layout's keys) at tiny sizes: layers cycle through sliding-window only,
/// CSA (ratio 4) and HCA (ratio 128), the MTP layer's ratio last as DeepSeek lists it; the first layer hash-routed;
/// FP8 with E8M0 128×128 block scales and FP4 experts.
fn deepseek_v4(common: Value, size: &SynthSize) -> Value {
    let ratios: Vec<usize> = (0..size.layers).map(|layer| [0, 4, 128][layer % 3]).chain([0]).collect();
    // (head_dim, qk_rope_head_dim, index_head_dim): V4-Flash's and V4-Pro's, or tiny.
    let (head_dim, rope_dim, index_head_dim) = if size.release_heads { (512, 64, 128) } else { (64, 16, 32) };
    let mut config = merge(
        common,
        json!({
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "num_key_value_heads": 1,
            "head_dim": head_dim,
            "qk_rope_head_dim": rope_dim,
            "q_lora_rank": 96,
            "o_lora_rank": 32,
            "o_groups": 2,
            "sliding_window": 16,
            "compress_ratios": ratios,
            "index_n_heads": 16,
            "index_head_dim": index_head_dim,
            "index_topk": 8,
            "num_hash_layers": 1,
            "hc_mult": 4,
            "hc_sinkhorn_iters": 20,
            "hc_eps": 1e-6,
            "scoring_func": "sqrtsoftplus",
            "topk_method": "noaux_tc",
            "swiglu_limit": 10.0,
            "routed_scaling_factor": 1.5,
            "num_nextn_predict_layers": 1,
            "expert_dtype": "fp4",
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "compress_rope_theta": 160000.0,
            "quantization_config": { "quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                     "activation_scheme": "dynamic", "weight_block_size": [128, 128] },
        }),
    );
    // Every V4 layer is MoE and the release ships no `intermediate_size`: transformers reads that name as
    // `moe_intermediate_size` (its config's attribute map), so a stray one would resize the experts.
    if let Some(object) = config.as_object_mut() {
        for key in ["intermediate_size", "first_k_dense_replace", "n_group", "topk_group"] {
            object.remove(key);
        }
    }
    config
}
