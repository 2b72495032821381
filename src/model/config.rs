//! `config.json` for `deepseek_v3`/`kimi_k2`, `glm_moe_dsa` and `glm4_moe`: the keys squeeze needs, with errors
//! naming a missing or unsupported key (the FP4-native generation's configs are read in [`super::layout`]).

use serde_json::Value;

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
    /// KDA linear attention beside MLA, MXFP4 experts in K3. Read, converted and sized; not run yet.
    KimiLinear,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::DeepseekV3 => "DeepseekV3ForCausalLM",
            Architecture::GlmMoeDsa => "GlmMoeDsaForCausalLM",
            Architecture::Glm4Moe => "Glm4MoeForCausalLM",
            Architecture::DeepseekV4 => "DeepseekV4ForCausalLM",
            Architecture::KimiLinear => "KimiLinearForCausalLM",
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
        }
    }

    /// Whether the reference runtime runs it (`eval`, `calibrate-kv`, `serve-test`); the others are read,
    /// converted and sized only.
    pub fn runs(self) -> bool {
        !matches!(self, Architecture::DeepseekV4 | Architecture::KimiLinear)
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
    pub layout: Option<super::layout::Layout>,
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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("missing key `{0}` (needed for this architecture); add it or use a complete config")]
    Missing(String),
    #[error("key `{key}` has an unsupported value {value}: {hint}")]
    Unsupported { key: String, value: String, hint: String },
}

impl ModelConfig {
    /// Parses a `config.json` value: a causal LM's, or the text model's inside a vision-language wrapper
    /// (`text_config`, [`crate::io::composite`]), whose missing keys are then named `text_config.KEY`.
    pub fn from_json(config: &Value) -> Result<Self, ConfigError> {
        if crate::io::composite::wrapper(config).is_none() {
            return Self::from_text_json(config, config, "");
        }
        let text = crate::io::composite::text_config(config);
        Self::from_text_json(text, config, "text_config.").map_err(|error| match error {
            ConfigError::Missing(key) => ConfigError::Missing(format!("text_config.{key}")),
            ConfigError::Unsupported { key, value, hint } => {
                ConfigError::Unsupported { key: format!("text_config.{key}"), value, hint }
            }
        })
    }

    /// Parses the text model's keys from `config`; `quantization_config` may sit in `whole` (the wrapper), and
    /// `prefix` is how messages reach `config` from the top (`text_config.` inside a wrapper).
    fn from_text_json(config: &Value, whole: &Value, prefix: &str) -> Result<Self, ConfigError> {
        let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or_default().to_string();
        let architecture_names: Vec<&str> = config
            .get("architectures")
            .and_then(Value::as_array)
            .map(|list| list.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let architecture = match model_type.as_str() {
            "deepseek_v3" | "kimi_k2" => Architecture::DeepseekV3,
            "glm_moe_dsa" => Architecture::GlmMoeDsa,
            "glm4_moe" => Architecture::Glm4Moe,
            "deepseek_v4" => Architecture::DeepseekV4,
            "kimi_linear" => Architecture::KimiLinear,
            _ if architecture_names.contains(&"KimiLinearForCausalLM") => Architecture::KimiLinear,
            _ if architecture_names.contains(&"DeepseekV4ForCausalLM") => Architecture::DeepseekV4,
            _ if architecture_names.contains(&"DeepseekV3ForCausalLM") => Architecture::DeepseekV3,
            _ if architecture_names.contains(&"GlmMoeDsaForCausalLM") => Architecture::GlmMoeDsa,
            _ if architecture_names.contains(&"Glm4MoeForCausalLM") => Architecture::Glm4Moe,
            _ => {
                return Err(ConfigError::Unsupported {
                    key: "model_type".into(),
                    value: format!("{model_type:?} (architectures {architecture_names:?})"),
                    hint: "squeeze supports deepseek_v3/kimi_k2, glm_moe_dsa, glm4_moe, deepseek_v4 and kimi_linear (Kimi K3's text model)".into(),
                })
            }
        };
        let reader = Keys(config);
        if architecture == Architecture::DeepseekV4 {
            return Self::deepseek_v4(config, whole, prefix, model_type);
        }
        if architecture == Architecture::KimiLinear {
            return Self::kimi_linear(config, whole, prefix, model_type);
        }
        let hidden_size = reader.usize("hidden_size")?;
        let num_attention_heads = reader.usize("num_attention_heads")?;
        let attention = match architecture {
            Architecture::DeepseekV3 | Architecture::GlmMoeDsa => Attention::Mla {
                q_lora_rank: reader.optional_usize("q_lora_rank")?,
                kv_lora_rank: reader.usize("kv_lora_rank")?,
                qk_nope_head_dim: reader.usize("qk_nope_head_dim")?,
                qk_rope_head_dim: reader.usize("qk_rope_head_dim")?,
                v_head_dim: reader.usize("v_head_dim")?,
            },
            Architecture::Glm4Moe | Architecture::DeepseekV4 | Architecture::KimiLinear => Attention::Gqa {
                num_key_value_heads: reader.usize("num_key_value_heads")?,
                head_dim: reader.optional_usize("head_dim")?.unwrap_or(hidden_size / num_attention_heads.max(1)),
                attention_bias: reader.bool_or("attention_bias", false),
                use_qk_norm: reader.bool_or("use_qk_norm", false),
                partial_rotary_factor: reader.partial_rotary_factor().unwrap_or(0.5),
            },
        };
        let num_hidden_layers = reader.usize("num_hidden_layers")?;
        let indexer = match architecture {
            Architecture::GlmMoeDsa => Some(Indexer {
                index_n_heads: reader.usize("index_n_heads")?,
                index_head_dim: reader.usize("index_head_dim")?,
                index_topk: reader.usize("index_topk")?,
                full_layers: reader.indexer_full_layers(num_hidden_layers)?,
            }),
            _ => None,
        };
        let rope = reader.rope(architecture)?;
        let declared_positions = reader.optional_usize("max_position_embeddings")?;
        let window = ContextWindow::of(declared_positions, &rope.scaling, prefix);
        let routing = Routing {
            n_group: reader.optional_usize("n_group")?.unwrap_or(1).max(1),
            topk_group: reader.optional_usize("topk_group")?.unwrap_or(1).max(1),
            norm_topk_prob: reader.bool_or("norm_topk_prob", true),
            routed_scaling_factor: reader
                .f64_or("routed_scaling_factor", if architecture == Architecture::Glm4Moe { 1.0 } else { 2.5 })?,
            scoring_func: config.get("scoring_func").and_then(Value::as_str).unwrap_or("sigmoid").to_string(),
        };
        let first_k_dense_replace = reader.optional_usize("first_k_dense_replace")?.unwrap_or(0);
        let moe_layers = match config.get("mlp_layer_types").and_then(Value::as_array) {
            Some(kinds) => kinds.iter().map(|kind| kind.as_str() == Some("sparse")).collect(),
            None => (0..num_hidden_layers).map(|layer| layer >= first_k_dense_replace).collect(),
        };
        let default_eps = if architecture == Architecture::DeepseekV3 { 1e-6 } else { 1e-5 };
        let weight_block_size = pair_of(crate::io::composite::quantization_config(whole), "weight_block_size");
        Ok(Self {
            architecture,
            model_type,
            hidden_size,
            num_hidden_layers,
            vocab_size: reader.usize("vocab_size")?,
            num_attention_heads,
            intermediate_size: reader.usize("intermediate_size")?,
            moe_intermediate_size: reader.usize("moe_intermediate_size")?,
            n_routed_experts: reader.usize("n_routed_experts")?,
            n_shared_experts: reader.optional_usize("n_shared_experts")?.unwrap_or(0),
            num_experts_per_tok: reader.usize("num_experts_per_tok")?,
            first_k_dense_replace,
            num_nextn_predict_layers: reader.optional_usize("num_nextn_predict_layers")?.unwrap_or(0),
            tie_word_embeddings: reader.bool_or("tie_word_embeddings", false),
            attention,
            indexer,
            weight_block_size,
            rope,
            rms_norm_eps: reader.f64_or("rms_norm_eps", default_eps)?,
            max_position_embeddings: declared_positions.unwrap_or(DEFAULT_MAX_POSITIONS),
            window,
            routing,
            moe_layers,
            layout: None,
        })
    }

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

    /// Whether decoder layer `layer` runs a MoE block in the forward pass (`mlp_layer_types` when the config
    /// gives it; MTP layers past `num_hidden_layers` follow `first_k_dense_replace`).
    pub fn runs_moe(&self, layer: usize) -> bool {
        self.moe_layers.get(layer).copied().unwrap_or_else(|| self.is_moe_layer(layer))
    }
}

/// A `[rows, columns]` pair under `key` of `object`.
pub(super) fn pair_of(object: Option<&Value>, key: &str) -> Option<[usize; 2]> {
    match object?.get(key)?.as_array()?.as_slice() {
        [rows, columns] => Some([rows.as_u64()? as usize, columns.as_u64()? as usize]),
        _ => None,
    }
}

pub(super) struct Keys<'a>(pub(super) &'a Value);

impl Keys<'_> {
    pub(super) fn optional_usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value.as_u64().map(|v| Some(v as usize)).ok_or_else(|| ConfigError::Unsupported {
                key: key.into(),
                value: value.to_string(),
                hint: "expected a non-negative integer".into(),
            }),
        }
    }

    pub(super) fn usize(&self, key: &str) -> Result<usize, ConfigError> {
        self.optional_usize(key)?.ok_or_else(|| ConfigError::Missing(key.into()))
    }

    pub(super) fn bool_or(&self, key: &str, default: bool) -> bool {
        self.0.get(key).and_then(Value::as_bool).unwrap_or(default)
    }

    /// `partial_rotary_factor` at top level or inside `rope_parameters` (transformers v5 style).
    pub(super) fn partial_rotary_factor(&self) -> Option<f64> {
        self.0
            .get("partial_rotary_factor")
            .or_else(|| self.0.get("rope_parameters").and_then(|r| r.get("partial_rotary_factor")))
            .and_then(Value::as_f64)
    }

    pub(super) fn f64_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(value) => value.as_f64().ok_or_else(|| ConfigError::Unsupported {
                key: key.into(),
                value: value.to_string(),
                hint: "expected a number".into(),
            }),
        }
    }

    /// RoPE settings, resolved like transformers' `convert_rope_params_to_dict`: `rope_scaling` wins over
    /// `rope_parameters`; `rope_theta` comes from inside the dict or from the top level.
    pub(super) fn rope(&self, architecture: Architecture) -> Result<Rope, ConfigError> {
        let parameters = match self.0.get("rope_scaling") {
            Some(value @ Value::Object(_)) => Some(value),
            _ => self.0.get("rope_parameters").filter(|value| value.is_object()),
        };
        let inside = |key: &str| parameters.and_then(|p| p.get(key)).filter(|value| !value.is_null());
        let number = |key: &str| -> Result<Option<f64>, ConfigError> {
            match inside(key) {
                None => Ok(None),
                Some(value) => value.as_f64().map(Some).ok_or_else(|| ConfigError::Unsupported {
                    key: format!("rope_parameters.{key}"),
                    value: value.to_string(),
                    hint: "expected a number".into(),
                }),
            }
        };
        let theta = match number("rope_theta")? {
            Some(theta) => theta,
            None => self.f64_or("rope_theta", 10000.0)?,
        };
        let kind = inside("rope_type").or_else(|| inside("type")).and_then(Value::as_str).unwrap_or("default");
        let scaling = match kind {
            "default" => RopeScaling::Default,
            "yarn" => RopeScaling::Yarn {
                factor: number("factor")?.ok_or_else(|| ConfigError::Missing("rope_scaling.factor".into()))?,
                original_max_position_embeddings: match number("original_max_position_embeddings")? {
                    Some(value) => value as usize,
                    None => self
                        .optional_usize("original_max_position_embeddings")?
                        .or(self.optional_usize("max_position_embeddings")?)
                        .unwrap_or(4096),
                },
                beta_fast: number("beta_fast")?.filter(|v| *v != 0.0).unwrap_or(32.0),
                beta_slow: number("beta_slow")?.filter(|v| *v != 0.0).unwrap_or(1.0),
                mscale: number("mscale")?,
                mscale_all_dim: number("mscale_all_dim")?,
                attention_factor: number("attention_factor")?,
                truncate: inside("truncate").and_then(Value::as_bool).unwrap_or(true),
            },
            other => {
                return Err(ConfigError::Unsupported {
                    key: "rope_scaling.rope_type".into(),
                    value: format!("{other:?}"),
                    hint: "the runtime supports default and yarn RoPE".into(),
                })
            }
        };
        let mla = matches!(architecture, Architecture::DeepseekV3 | Architecture::GlmMoeDsa);
        let interleave = match architecture {
            Architecture::DeepseekV3 => self.bool_or("rope_interleave", true),
            Architecture::GlmMoeDsa => true,
            Architecture::Glm4Moe | Architecture::DeepseekV4 | Architecture::KimiLinear => false,
        };
        let partial_rotary_factor = match number("partial_rotary_factor")? {
            Some(factor) => factor,
            None if mla => 1.0,
            None => self.partial_rotary_factor().unwrap_or(0.5),
        };
        Ok(Rope { theta, partial_rotary_factor, interleave, scaling })
    }

    /// GLM-5's per-layer indexer kinds, as `GlmMoeDsaConfig.__post_init__` derives them: `indexer_types`
    /// (`"full"`/`"shared"` per layer), else `index_topk_pattern` (a string of `F`/`S` or such a list), else
    /// `index_topk_freq`/`index_skip_topk_offset` (full where `max(layer − offset + 1, 0) % freq == 0`). A given
    /// list must name every decoder layer, and layer 0 must be full (a shared layer reuses an earlier selection).
    pub(super) fn indexer_full_layers(&self, layers: usize) -> Result<Vec<bool>, ConfigError> {
        let unsupported =
            |key: &str, value: String, hint: String| ConfigError::Unsupported { key: key.into(), value, hint };
        let kinds = |key: &str, list: &[Value]| -> Result<Vec<bool>, ConfigError> {
            list.iter()
                .enumerate()
                .map(|(layer, kind)| match kind.as_str() {
                    Some("full") => Ok(true),
                    Some("shared") => Ok(false),
                    _ => Err(unsupported(
                        &format!("{key}[{layer}]"),
                        kind.to_string(),
                        "each layer is \"full\" (runs its indexer) or \"shared\" (reuses the previous full layer's)"
                            .into(),
                    )),
                })
                .collect()
        };
        let (key, full) = if let Some(list) = self.0.get("indexer_types").and_then(Value::as_array) {
            ("indexer_types", kinds("indexer_types", list)?)
        } else {
            match self.0.get("index_topk_pattern") {
                Some(Value::String(pattern)) => {
                    let full = pattern
                        .chars()
                        .enumerate()
                        .map(|(layer, c)| match c {
                            'F' => Ok(true),
                            'S' => Ok(false),
                            other => Err(unsupported(
                                "index_topk_pattern",
                                format!("{other:?} at layer {layer}"),
                                "the pattern has one letter per layer: F (full) or S (shared)".into(),
                            )),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    ("index_topk_pattern", full)
                }
                Some(Value::Array(list)) => ("index_topk_pattern", kinds("index_topk_pattern", list)?),
                _ => {
                    let frequency = self.optional_usize("index_topk_freq")?.unwrap_or(1).max(1);
                    let offset = self.optional_usize("index_skip_topk_offset")?.unwrap_or(2);
                    return Ok(Indexer::frequency_schedule(layers, frequency, offset));
                }
            }
        };
        if full.len() != layers {
            return Err(unsupported(
                key,
                format!("with {} entries", full.len()),
                format!("it needs one entry per decoder layer: num_hidden_layers is {layers}"),
            ));
        }
        if full.first() == Some(&false) {
            return Err(unsupported(
                key,
                "starting with a shared layer".into(),
                "layer 0 has no earlier full layer whose top-k it could reuse; make it \"full\"".into(),
            ));
        }
        Ok(full)
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
