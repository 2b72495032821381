//! The rule list: every engine load rule (docs/engines.md) with its id, title, the file each engine's rule was
//! read in, and its check.

mod config;
mod fp4;
mod modules;
mod shapes;
mod tensors;

use super::context::Context;
use super::report::Outcome;
use crate::engines::Engine;

/// One engine load rule.
pub struct Rule {
    pub id: &'static str,
    pub title: &'static str,
    /// Where the rule was read for vLLM.
    pub vllm: &'static str,
    /// Where the rule was read for SGLang.
    pub sglang: &'static str,
    pub check: fn(&Context, Engine) -> Outcome,
}

impl Rule {
    pub fn source(&self, engine: Engine) -> &'static str {
        match engine {
            Engine::Vllm => self.vllm,
            Engine::Sglang => self.sglang,
        }
    }
}

const NOT_READ_SGLANG: &str = "SGLang: file not read, same rule as vLLM assumed";

/// Every rule, in the order the report lists them.
pub const RULES: [Rule; 21] = [
    Rule {
        id: "quant-method",
        title: "quant_method compressed-tensors, format pack-quantized",
        vllm: "vLLM compressed_tensors_moe_wna16.py",
        sglang: "SGLang compressed_tensors_wNa16_moe.py",
        check: config::quant_method,
    },
    Rule {
        id: "linear-target",
        title: "one config group with targets [\"Linear\"] (SGLang also: targets naming the routed experts, except for W4A8 and where it would fuse an unquantized shared expert)",
        vllm: "vLLM compressed_tensors_moe_wna16.py",
        sglang: "SGLang 0.5.23 compressed_tensors.py get_moe_scheme (find_matched_target on <layer>.experts.0.*_proj); compressed_tensors_w4a8_fp8_moe.py CompressedTensorsW4AFP8MoE.__init__ (target_scheme_map[\"Linear\"]); deepseek_v2.py shared_experts_fusion_disable_reason, deepseek_common/utils.py is_wint4afp8_or_wint4a16_config (\"Linear\" only)",
        check: config::linear_target,
    },
    Rule {
        id: "weight-args",
        title: "weights int4 static, group 32/64/128 or channel, symmetric (vLLM also asymmetric), actorder null or static (vLLM also weight; SGLang weight and group only with the experts unsplit), no input activations (or W4A8's)",
        vllm: "vLLM compressed_tensors_moe_wna16.py, fused_moe/oracle/int_wna16.py",
        sglang: "SGLang 0.5.23 compressed_tensors.py get_moe_scheme/_is_wNa16_group_channel; compressed_tensors_wNa16_moe.py CompressedTensorsWNA16MoE.create_weights (load_full_w2, zero points), process_weights_after_loading (actorder == \"group\", moe_awq_to_marlin_zero_points); fused_moe_triton/layer.py FusedMoE._weight_loader_impl (zero points not transposed, load_full_w2 never read)",
        check: config::weight_args,
    },
    Rule {
        id: "group-size-tp",
        title: "group size divides hidden_size and moe_intermediate_size / tp",
        vllm: "vLLM compressed_tensors_moe_wna16.py, marlin_utils.py",
        sglang: "SGLang compressed_tensors_wNa16_moe.py (0.5.23 CompressedTensorsWNA16MoE.create_weights: strategy channel is one group)",
        check: shapes::group_size_tp,
    },
    Rule {
        id: "ignore-coverage",
        title: "ignore covers every unquantized linear (re: = re.match, literal = exact)",
        vllm: "vLLM compressed_tensors.py (ignore matching, re.match)",
        sglang: "SGLang compressed_tensors.py (ignore matching, re.match)",
        check: modules::ignore_coverage,
    },
    Rule {
        id: "fused-pairs",
        title: "fused pairs all ignored or all quantized",
        vllm: "vLLM deepseek_v2.py (q_a_proj+kv_a_proj_with_mqa fused), models/kimi_k3/nvidia/kda.py \
               (in_proj_qkvgfab), models/deepseek_v4/nvidia/model.py (fused_wqa_wkv, fused_wkv_wgate; #41276), \
               compressed_tensors.py",
        sglang: NOT_READ_SGLANG,
        check: modules::fused_pairs,
    },
    Rule {
        id: "routed-experts",
        title: "every routed expert gate/up/down INT4 under one scheme (the MTP layer's too, unless kept BF16 whole and ignored under each engine's name for it)",
        vllm: "vLLM compressed_tensors_moe_wna16.py; compressed_tensors_moe.py get_moe_method; glm4_moe_mtp.py/deepseek_mtp.py (prefix model.layers.N)",
        sglang: "SGLang compressed_tensors_wNa16_moe.py; compressed_tensors.py get_moe_scheme; glm4_moe_nextn.py/deepseek_nextn.py (prefix model.decoder)",
        check: modules::routed_experts,
    },
    Rule {
        id: "mtp-eh-proj",
        title: "MTP eh_proj ignored",
        vllm: "vLLM #41108 (eh_proj shape mismatch 3072 vs 6144)",
        sglang: NOT_READ_SGLANG,
        check: modules::mtp_eh_proj,
    },
    Rule {
        id: "int4-tensors",
        title: "INT4 tensors: weight_packed I32, weight_scale BF16/F16/F32 > 0, weight_shape I64, weight_zero_point only when asymmetric (SGLang: none), no FP8 leftovers",
        vllm: "vLLM compressed_tensors_wNa16.py, compressed_tensors_moe_wna16.py",
        sglang: "SGLang 0.5.23 compressed_tensors_wNa16_moe.py CompressedTensorsWNA16MoE.create_weights (scales in params_dtype, zero points [E, groups, out/8]); fused_moe_triton/layer.py FusedMoE._weight_loader_impl, _load_w13/_load_w2 (copy_ casts the scales; zero points not transposed)",
        check: tensors::int4_tensors,
    },
    Rule {
        id: "w4a8-shapes",
        title: "W4A8 (INT4 weights, FP8 per-token activations): group 128, hidden_size % 256, moe_intermediate_size / tp % 256",
        vllm: "vLLM compressed_tensors.py _is_fp8_w4a8; compressed_tensors_moe_w4a8_fp8.py (asserts)",
        sglang: "SGLang 0.5.23 compressed_tensors.py _is_wint4afp8, compressed_tensors_w4a8_fp8_moe.py (symmetric, pack-quantized; group 128 hard-coded in cutlass_w4a8_moe; K a multiple of 128, which % 256 implies)",
        check: config::w4a8_shapes,
    },
    Rule {
        id: "fp4-weight-args",
        title: "FP4 weights float 4-bit symmetric static: tensor_group 16 (NVFP4) or group 32 (MXFP4)",
        vllm: "vLLM compressed_tensors.py _is_nvfp4_format/_is_mxfp4",
        sglang: "SGLang 0.5.23 compressed_tensors.py _is_fp4a16_nvfp4, _is_mxfp4_moe",
        check: fp4::fp4_weight_args,
    },
    Rule {
        id: "fp4-tensors",
        title: "FP4 tensors: weight_packed U8 [out, in/2], weight_scale F8_E4M3 [out, in/16] + weight_global_scale F32 > 0 (NVFP4) or U8 [out, in/32] (MXFP4), no weight_shape",
        vllm: "vLLM compressed_tensors_moe NVFP4/MXFP4 methods; compressed-tensors 0.20.1 NVFP4PackedCompressor, MXFP4PackedCompressor",
        sglang: "SGLang 0.5.23 compressed_tensors_w4a16_nvfp4_moe.py, compressed_tensors_w4a16_nvfp4.py (no weight_shape parameter; a stray one is skipped)",
        check: fp4::fp4_tensors,
    },
    Rule {
        id: "fp4-fused-global-scale",
        title: "NVFP4 gate/up of one expert share one weight_global_scale",
        vllm: "vLLM compressed_tensors_moe NVFP4 method (\"w1_weight_global_scale must match w3_weight_global_scale\")",
        sglang: "SGLang 0.5.23 compressed_tensors_w4a16_nvfp4_moe.py (ValueError unless gate and up share one weight_global_scale, exact compare)",
        check: fp4::fp4_fused_global_scale,
    },
    Rule {
        id: "fp4-moe-engine",
        title: "FP4 routed experts the engine's MoE method loads: SGLang NVFP4 needs hidden % 128 and moe_intermediate / tp % 64, and has no MXFP4 method for split experts",
        vllm: "vLLM compressed_tensors_moe NVFP4/MXFP4 methods (no shape rule beyond fp4-tensors)",
        sglang: "SGLang 0.5.23 compressed_tensors_w4a16_nvfp4_moe.py (ValueErrors), compressed_tensors.py _is_mxfp4_moe → mxfp4.py Mxfp4MoEMethod (w13_weight), deepseek_weight_loader.py (weight_packed renamed on NPU only)",
        check: fp4::fp4_moe_engine,
    },
    Rule {
        id: "router-topk",
        title: "e_score_correction_bias (DeepSeek-V4: ffn.gate.bias) needs topk_method noaux_tc (and, outside V4, \
                scoring_func sigmoid)",
        vllm: "vLLM deepseek_v2.py, models/deepseek_v4/{nvidia,cpu}/model.py (bias created only for noaux_tc; \
               softmax by default)",
        sglang: NOT_READ_SGLANG,
        check: config::router_topk,
    },
    Rule {
        id: "indexer-schedule",
        title: "the engine builds a DSA indexer exactly in the layers indexer_types marks full",
        vllm: "vLLM deepseek_v2.py (index_topk_pattern, index_topk_freq/index_skip_topk_offset; no indexer_types)",
        sglang: "SGLang configs/model_config.py dsa_layer_skips_topk (indexer_types first)",
        check: config::indexer_schedule,
    },
    Rule {
        id: "kda-params",
        title: "KDA short convolutions, A_log and dt_bias unquantized floats",
        vllm: "vLLM model_executor/layers/kda.py KimiDeltaAttention.__init__ (q/k/v_conv1d: ColumnParallelLinear, params_dtype float32, no quant_config; A_log, dt_bias float32 parameters)",
        sglang: NOT_READ_SGLANG,
        check: modules::kda_params,
    },
    Rule {
        id: "glm5-next-keys",
        title: "GLM-5.3-Flash text_config carries mhc, mla_use_nope and indexer_rope_interleave",
        vllm: "vLLM 0.32 models/glm5next/common/model.py Glm5NextDecoderLayer (config.mhc, config.mla_use_nope), \
               attention.py (config.indexer_rope_interleave): read without defaults; transformers' \
               Glm5NextTextConfig (5.19, 5.24) defines none",
        sglang: NOT_READ_SGLANG,
        check: config::glm5_next_keys,
    },
    Rule {
        id: "glm5-next-attention",
        title: "GLM-5.3-Flash MLA, KDA and indexer projections unquantized (block-FP8 only where dequantized at load)",
        vllm: "vLLM 0.32 models/glm5next/common/model.py (MLA quant_config=None, _try_load_fp8_attn_proj), kda.py \
               (quant_config None around the KDA projections), attention.py (indexer wk_weights_proj quant_config \
               None)",
        sglang: "SGLang models/glm5_next.py: KDA projections fused when unquantized or FP8 and loaded unfused \
                 otherwise (not checked); the MLA's and indexer's rule assumed as vLLM's",
        check: modules::glm5_next_attention,
    },
    Rule {
        id: "kv-cache-scheme",
        title: "kv_cache_scheme float 8-bit per-tensor symmetric static",
        vllm: "vLLM compressed_tensors_kv.py, kv_cache.py",
        sglang: "SGLang compressed_tensors.py (CompressedTensorsKVCacheMethod), kv_cache.py",
        check: config::kv_cache_scheme,
    },
    Rule {
        id: "kv-scales",
        title: "KV scales: names the engines load, F32 scalars > 0",
        vllm: "vLLM weight_utils.py maybe_remap_kv_scale_name, kv_cache.py",
        sglang: "SGLang deepseek_weight_loader.py, kv_cache.py",
        check: tensors::kv_scales,
    },
];
