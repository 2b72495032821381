//! What squeeze knows of a model from its `config.json`: [`ModelConfig`] and its parts (parsed in
//! [`super::parse`], with errors naming a missing or unsupported key), the context window.

pub use super::hybrid::{HyperConnections, KdaKeys};

/// The architectures squeeze knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// `DeepseekV3ForCausalLM`: Kimi K2 (`kimi_k2`) and DeepSeek-V3 (`deepseek_v3`).
    DeepseekV3,
    /// `GlmMoeDsaForCausalLM`: GLM-5 (MLA + DSA indexer).
    GlmMoeDsa,
    /// `Glm4MoeForCausalLM`: GLM-4.5/4.6/4.7 (GQA).
    Glm4Moe,
    /// `DeepseekV4ForCausalLM`: DeepSeek-V4 Flash and Pro (compressed attention, hash routing, mHC, MXFP4 experts).
    /// Read, converted and sized; the reference runtime does not run it yet.
    DeepseekV4,
    /// `KimiLinearForCausalLM` (`kimi_linear`): Kimi-Linear, and the text stack of Kimi K3 (`kimi_k3` wrapper):
    /// KDA linear attention beside NoPE MLA, MXFP4 experts in K3. The runtime runs Kimi-Linear, not K3's additions.
    KimiLinear,
    /// `Glm5NextForConditionalGeneration` (`glm5_next`, text model `glm5_next_text`): GLM-5.3-Flash — KDA layers
    /// beside NoPE MLA with a k-pool DSA indexer, mHC hyper-connections, clamped SwiGLU, FP8 as released.
    Glm5Next,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::DeepseekV3 => "DeepseekV3ForCausalLM",
            Architecture::GlmMoeDsa => "GlmMoeDsaForCausalLM",
            Architecture::Glm4Moe => "Glm4MoeForCausalLM",
            Architecture::DeepseekV4 => "DeepseekV4ForCausalLM",
            Architecture::KimiLinear => "KimiLinearForCausalLM",
            Architecture::Glm5Next => "Glm5NextForConditionalGeneration",
        }
    }

    /// The built-in recipe for this architecture.
    pub fn default_recipe(self) -> &'static str {
        match self {
            Architecture::DeepseekV3 => "kimi-k2-int4",
            Architecture::GlmMoeDsa => "glm5-int4",
            Architecture::Glm4Moe => "glm45-int4",
            Architecture::DeepseekV4 => "deepseek-v4-nvfp4",
            Architecture::KimiLinear => "kimi-k3-nvfp4",
            Architecture::Glm5Next => "glm5.3-flash-int4",
        }
    }
}

/// Attention layout.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Attention {
    /// Multi-head latent attention (DeepSeek-V3 / Kimi K2 / GLM-5).
    Mla {
        q_lora_rank: Option<usize>,
        kv_lora_rank: usize,
        qk_nope_head_dim: usize,
        qk_rope_head_dim: usize,
        v_head_dim: usize,
    },
    /// Grouped-query attention (GLM-4.5).
    Gqa {
        num_key_value_heads: usize,
        head_dim: usize,
        attention_bias: bool,
        use_qk_norm: bool,
        partial_rotary_factor: f64,
    },
}

/// The DSA lightning indexer of GLM-5.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Indexer {
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    /// Per decoder layer: `true` when the layer runs its own indexer (`"full"`), `false` when it reuses the top-k
    /// selection of the previous full layer (`"shared"`). From `indexer_types`, `index_topk_pattern` or
    /// `index_topk_freq`/`index_skip_topk_offset` as transformers' `GlmMoeDsaConfig` derives it; all full by default.
    pub full_layers: Vec<bool>,
    /// GLM-5.3-Flash's k-pool: keys scored in pools of this many tokens; `None` for GLM-5's per-token indexer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kpool: Option<Kpool>,
}

/// GLM-5.3-Flash's k-pool indexer (`index_kpool`, `index_kpool_always_select_tail`): the keys of each complete
/// pool of `size` tokens are averaged with learned per-channel weights and scored as one; the selected pools'
/// tokens (`index_topk / size` pools) are attended, and with `select_tail` the query's incomplete pool too.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Kpool {
    pub size: usize,
    pub select_tail: bool,
}

impl Indexer {
    /// The `index_topk_freq`/`index_skip_topk_offset` schedule of `layers` decoder layers as transformers, vLLM and
    /// SGLang derive it: full where `max(layer − offset + 1, 0) % frequency == 0` (GLM-5.2: frequency 4, offset 3
    /// gives full at 0, 1, 2, then every 4th from 6).
    pub fn frequency_schedule(layers: usize, frequency: usize, offset: usize) -> Vec<bool> {
        (0..layers).map(|layer| (layer + 1).saturating_sub(offset) % frequency.max(1) == 0).collect()
    }
}

/// Rotary position embedding: `rope_theta` + `rope_scaling` (legacy) or `rope_parameters` (transformers v5).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Rope {
    pub theta: f64,
    /// Fraction of the (rotary) head dimension that is rotated (GLM-4.5: 0.5 when absent).
    pub partial_rotary_factor: f64,
    /// DeepSeek's interleaved pairs `(x0,x1),(x2,x3),…` (MLA models) instead of rotate-half (GQA).
    pub interleave: bool,
    pub scaling: RopeScaling,
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    Default,
    /// YaRN as transformers' `_compute_yarn_parameters`; `mscale_all_dim` also scales the MLA softmax.
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        attention_factor: Option<f64>,
        truncate: bool,
    },
}

/// MoE routing: sigmoid scores, `e_score_correction_bias` for selection, group-limited top-k.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Routing {
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    pub scoring_func: String,
}

/// What an architecture of the FP4-native generation stores beyond the common keys: its tensors are listed by
/// its own module.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layout {
    DeepseekV4(super::deepseek_v4::DeepseekV4),
    KimiLinear(super::kimi_linear::KimiLinear),
    Glm5Next(super::glm5_next::Glm5Next),
}

/// How a MoE layer's modules are named under `model.layers.N.`: the block (router `gate`, `shared_experts` with
/// `{gate,up,down}_proj`, `experts.E`) and each routed expert's gate, up and down projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeNames {
    /// `mlp` (DeepSeek, GLM) or `block_sparse_moe` (Kimi-Linear).
    pub block: &'static str,
    /// `gate_proj`/`up_proj`/`down_proj`, or Kimi-Linear's and DeepSeek-V4's `w1`/`w3`/`w2`.
    pub expert: [&'static str; 3],
    /// The shared experts' gate, up and down projections.
    pub shared: [&'static str; 3],
}

/// The projections of a SwiGLU MLP as DeepSeek-V3 and GLM name them.
const STANDARD_PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub vocab_size: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub first_k_dense_replace: usize,
    pub num_nextn_predict_layers: usize,
    pub tie_word_embeddings: bool,
    pub attention: Attention,
    pub indexer: Option<Indexer>,
    /// FP8 block size from `quantization_config.weight_block_size`, if the source declares one.
    pub weight_block_size: Option<[usize; 2]>,
    pub rope: Rope,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    /// The positions the model attends over, and the key that sets them ([`ContextWindow`]).
    pub window: ContextWindow,
    pub routing: Routing,
    /// Per decoder layer: `true` for a MoE layer (`mlp_layer_types` when given, else `first_k_dense_replace`).
    pub moe_layers: Vec<bool>,
    /// The FP4-native generation's own layout (DeepSeek-V4), `None` for the architectures the runtime runs.
    pub layout: Option<Layout>,
}

/// The context window: how many positions the model was made to attend over, and the `config.json` key(s) that
/// say so. `max_position_embeddings`, except where YaRN scaling covers fewer positions: its frequencies are
/// stretched for `original_max_position_embeddings × factor` positions (what vLLM takes as the model's length for
/// YaRN), so the smaller of the two binds. A config without `max_position_embeddings` gets transformers' 4,096.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ContextWindow {
    pub positions: usize,
    /// Where `positions` comes from, e.g. `config.json max_position_embeddings`.
    pub source: String,
}

/// Transformers' `max_position_embeddings` when a config does not give it.
pub(super) const DEFAULT_MAX_POSITIONS: usize = 4096;

impl ContextWindow {
    pub(super) fn of(declared: Option<usize>, scaling: &RopeScaling, prefix: &str) -> Self {
        let yarn = match scaling {
            RopeScaling::Yarn { factor, original_max_position_embeddings, .. } => {
                Some(((*original_max_position_embeddings as f64) * factor).floor() as usize)
            }
            RopeScaling::Default => None,
        };
        let yarn_source = |positions: usize| match scaling {
            RopeScaling::Yarn { factor, original_max_position_embeddings, .. } => format!(
                "config.json YaRN scaling: {prefix}rope_scaling original_max_position_embeddings \
                 {original_max_position_embeddings} × factor {factor} = {positions}{}",
                declared.map_or(String::new(), |d| format!(", below {prefix}max_position_embeddings {d}"))
            ),
            RopeScaling::Default => unreachable!("only YaRN scaling has a window of its own"),
        };
        match (declared, yarn) {
            (Some(declared), Some(yarn)) if yarn < declared => Self { positions: yarn, source: yarn_source(yarn) },
            (Some(declared), _) => {
                Self { positions: declared, source: format!("config.json {prefix}max_position_embeddings") }
            }
            (None, Some(yarn)) => Self { positions: yarn, source: yarn_source(yarn) },
            (None, None) => Self {
                positions: DEFAULT_MAX_POSITIONS,
                source: format!(
                    "config.json has no {prefix}max_position_embeddings; transformers' default {DEFAULT_MAX_POSITIONS}"
                ),
            },
        }
    }

    /// Checks that `positions` positions fit in the window. `what` names the flag or input and its value (`--ctx
    /// 5000`). Beyond the window: an error saying so and how to stay inside, or with `allow` (the user passed
    /// `--allow-long-context`) `Ok(Some(warning))` for the report.
    pub fn check(&self, what: &str, positions: usize, allow: bool) -> Result<Option<String>, String> {
        if positions <= self.positions {
            return Ok(None);
        }
        let beyond = format!(
            "{what}: {positions} positions, beyond the model's context window of {} ({})",
            self.positions, self.source
        );
        if allow {
            Ok(Some(format!(
                "{beyond}; run anyway (--allow-long-context): positions past {} are outside what the model was made \
                 for, so its numbers there say little about the checkpoint",
                self.positions
            )))
        } else {
            Err(format!(
                "{beyond}; stay within {} positions, or pass --allow-long-context to run past the window anyway",
                self.positions
            ))
        }
    }
}

impl ModelConfig {
    /// Decoder layers stored in the checkpoint, MTP layers included.
    pub fn stored_layers(&self) -> usize {
        self.num_hidden_layers + self.num_nextn_predict_layers
    }

    /// Whether layer `layer` is a MoE layer (the first `first_k_dense_replace` layers are dense).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        layer >= self.first_k_dense_replace
    }

    /// Whether decoder layer `layer` runs its own DSA indexer (GLM-5's `full` layers and MTP layers); `false`
    /// without an indexer and for `shared` layers, which reuse the last full layer's selection and store no indexer.
    pub fn runs_indexer(&self, layer: usize) -> bool {
        self.indexer.as_ref().is_some_and(|i| i.full_layers.get(layer).copied().unwrap_or(true))
    }

    /// What keeps the reference runtime (`eval`, `calibrate-kv`, `serve-test`) from running this model, in words;
    /// `None` when it runs it. Such models are read, converted, verified and sized only.
    pub fn runtime_gap(&self) -> Option<&'static str> {
        match &self.layout {
            Some(Layout::KimiLinear(kimi))
                if kimi.routed_expert_hidden_size.is_some()
                    || kimi.attention_residuals
                    || kimi.mla_output_gate
                    || kimi.full_rank_gate =>
            {
                Some(
                    "Kimi K3's additions to Kimi-Linear (latent MoE, attention residuals, output-gated MLA, full-rank \
                     KDA gate), which no reference implementation outside the engines' GPU code holds yet",
                )
            }
            _ => None,
        }
    }

    /// What keeps KV-scale calibration (`calibrate-kv`) from this model, which the runtime runs; `None` when it
    /// calibrates it.
    pub fn kv_cache_gap(&self) -> Option<&'static str> {
        match &self.layout {
            Some(Layout::DeepseekV4(_)) => Some(
                "DeepSeek-V4's FP8 caches take their scales from each row as it is written, so there is nothing to \
                 calibrate (`squeeze calibrate-kv` says what the engines store per layer type)",
            ),
            _ => None,
        }
    }

    /// The built-in recipe `quantize` and `report` use without `--recipe`: the architecture's
    /// ([`Architecture::default_recipe`]), except Kimi-Linear as shipped (BF16 experts, not K3's MXFP4), which gets
    /// the INT4 decode layout.
    pub fn default_recipe(&self) -> &'static str {
        match &self.layout {
            Some(Layout::KimiLinear(kimi)) if !kimi.experts_mxfp4 => "kimi-linear-int4",
            _ => self.architecture.default_recipe(),
        }
    }

    /// Whether decoder layer `layer` is a KDA (linear attention) layer rather than a softmax attention one.
    pub fn is_kda_layer(&self, layer: usize) -> bool {
        let kda_layers = match &self.layout {
            Some(Layout::KimiLinear(kimi)) => &kimi.kda_layers,
            Some(Layout::Glm5Next(glm)) => &glm.kda_layers,
            _ => return false,
        };
        kda_layers.get(layer).copied().unwrap_or(false)
    }

    /// The KDA sizes and gate of a hybrid model; `None` without KDA layers.
    pub fn kda(&self) -> Option<KdaKeys> {
        match &self.layout {
            Some(Layout::KimiLinear(kimi)) => Some(KdaKeys {
                heads: kimi.kda_heads,
                head_dim: kimi.kda_head_dim,
                conv_kernel: kimi.conv_kernel,
                gate_lower_bound: None,
            }),
            Some(Layout::Glm5Next(glm)) => Some(glm.kda),
            _ => None,
        }
    }

    /// The model's mHC hyper-connections (GLM-5.3-Flash); `None` for a plain residual stream.
    pub fn hyper_connections(&self) -> Option<HyperConnections> {
        match &self.layout {
            Some(Layout::Glm5Next(glm)) => Some(glm.hyper),
            Some(Layout::DeepseekV4(v4)) => Some(v4.hyper),
            _ => None,
        }
    }

    /// The mHC hyper-connections around decoder layer `layer`: the model's for its decoder layers; for an MTP layer
    /// DeepSeek-V4's too (`mtp.N.hc_*`), GLM-5.3-Flash's none (vLLM builds its MTP layer with `is_mtp_layer`: a
    /// plain residual, no `hc_*` parameters).
    pub fn layer_hyper_connections(&self, layer: usize) -> Option<HyperConnections> {
        match &self.layout {
            Some(Layout::Glm5Next(_)) => self.hyper_connections().filter(|_| layer < self.num_hidden_layers),
            _ => self.hyper_connections(),
        }
    }

    /// DeepSeek-V4's own keys; `None` for every other architecture.
    pub fn deepseek_v4(&self) -> Option<&super::deepseek_v4::DeepseekV4> {
        match &self.layout {
            Some(Layout::DeepseekV4(v4)) => Some(v4),
            _ => None,
        }
    }

    /// The stored name prefix of decoder (or MTP) layer `layer`: `model.layers.N`, DeepSeek-V4's `layers.N` and
    /// `mtp.J`.
    pub fn layer_prefix(&self, layer: usize) -> String {
        match self.layout {
            Some(Layout::DeepseekV4(_)) => super::deepseek_v4::DeepseekV4::prefix(layer, self.num_hidden_layers),
            _ => format!("model.layers.{layer}"),
        }
    }

    /// The names of layer `layer`'s norm before its attention and before its MLP.
    pub fn layer_norm_names(&self, layer: usize) -> [String; 2] {
        let prefix = self.layer_prefix(layer);
        match self.layout {
            Some(Layout::DeepseekV4(_)) => [format!("{prefix}.attn_norm.weight"), format!("{prefix}.ffn_norm.weight")],
            _ => [format!("{prefix}.input_layernorm.weight"), format!("{prefix}.post_attention_layernorm.weight")],
        }
    }

    /// The token embedding's name (`model.embed_tokens.weight`, DeepSeek-V4's `embed.weight`).
    pub fn embed_name(&self) -> &'static str {
        match self.layout {
            Some(Layout::DeepseekV4(_)) => "embed.weight",
            _ => "model.embed_tokens.weight",
        }
    }

    /// The final norm's name (`model.norm.weight`, DeepSeek-V4's `norm.weight`).
    pub fn final_norm_name(&self) -> &'static str {
        match self.layout {
            Some(Layout::DeepseekV4(_)) => "norm.weight",
            _ => "model.norm.weight",
        }
    }

    /// The residual stream's width per token: `hidden_size`, times the stream count with mHC.
    pub fn residual_width(&self) -> usize {
        self.hidden_size * self.hyper_connections().map_or(1, |hc| hc.streams)
    }

    /// The clamp of the SwiGLU gate (`≤ limit`) and up (`±limit`) projections (GLM-5.3-Flash's `swiglu_limit`).
    pub fn swiglu_limit(&self) -> Option<f32> {
        match &self.layout {
            Some(Layout::Glm5Next(glm)) => Some(glm.swiglu_limit as f32),
            Some(Layout::DeepseekV4(v4)) => Some(v4.swiglu_limit as f32),
            _ => None,
        }
    }

    /// The epsilon of MLA's `q_a_layernorm`/`kv_a_layernorm`: transformers builds them with the RMSNorm default
    /// 1e-6 for DeepSeek, Kimi and GLM-5, with `rms_norm_eps` for GLM-5.3-Flash.
    pub fn latent_norm_eps(&self) -> f32 {
        match &self.layout {
            Some(Layout::Glm5Next(_)) => self.rms_norm_eps as f32,
            _ => 1e-6,
        }
    }

    /// Whether the attention layers apply no RoPE: Kimi-Linear's and GLM-5.3-Flash's NoPE MLA use the shared key
    /// part as it is (their transformers attention takes no position embeddings).
    pub fn nope_attention(&self) -> bool {
        matches!(self.layout, Some(Layout::KimiLinear(_) | Layout::Glm5Next(_)))
    }

    /// How a MoE layer's modules are named.
    pub fn moe_names(&self) -> MoeNames {
        match self.layout {
            Some(Layout::KimiLinear(_)) => {
                MoeNames { block: "block_sparse_moe", expert: ["w1", "w3", "w2"], shared: STANDARD_PROJECTIONS }
            }
            Some(Layout::DeepseekV4(_)) => {
                MoeNames { block: "ffn", expert: ["w1", "w3", "w2"], shared: ["w1", "w3", "w2"] }
            }
            _ => MoeNames { block: "mlp", expert: STANDARD_PROJECTIONS, shared: STANDARD_PROJECTIONS },
        }
    }

    /// Whether decoder layer `layer` runs a MoE block in the forward pass (`mlp_layer_types` when the config
    /// gives it; MTP layers past `num_hidden_layers` follow `first_k_dense_replace`).
    pub fn runs_moe(&self, layer: usize) -> bool {
        self.moe_layers.get(layer).copied().unwrap_or_else(|| self.is_moe_layer(layer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(factor: f64, original: usize) -> RopeScaling {
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: None,
            mscale_all_dim: None,
            attention_factor: None,
            truncate: true,
        }
    }

    #[test]
    fn the_smaller_of_max_positions_and_the_yarn_span_binds() {
        // Kimi K2 as released: 4096 × 32 = 131,072 = max_position_embeddings.
        let window = ContextWindow::of(Some(131_072), &yarn(32.0, 4096), "");
        assert_eq!((window.positions, window.source.as_str()), (131_072, "config.json max_position_embeddings"));
        // YaRN stretched for fewer positions than the config declares: YaRN binds, both keys named.
        let window = ContextWindow::of(Some(262_144), &yarn(64.0, 128), "text_config.");
        assert_eq!(window.positions, 8192);
        assert!(window.source.contains("text_config.rope_scaling original_max_position_embeddings 128 × factor 64"));
        assert!(window.source.contains("below text_config.max_position_embeddings 262144"), "{}", window.source);
        let window = ContextWindow::of(None, &RopeScaling::Default, "");
        assert_eq!(window.positions, 4096);
        assert!(window.source.contains("no max_position_embeddings"), "{}", window.source);
    }

    #[test]
    fn beyond_the_window_is_refused_or_warned() {
        let window = ContextWindow::of(Some(64), &RopeScaling::Default, "");
        assert_eq!(window.check("--ctx 64", 64, false), Ok(None));
        let error = window.check("--ctx 100", 100, false).unwrap_err();
        for needle in ["--ctx 100", "100 positions", "window of 64", "max_position_embeddings", "--allow-long-context"]
        {
            assert!(error.contains(needle), "{needle}: {error}");
        }
        let warning = window.check("--ctx 100", 100, true).unwrap().unwrap();
        assert!(warning.contains("window of 64") && warning.contains("--allow-long-context"), "{warning}");
    }
}
