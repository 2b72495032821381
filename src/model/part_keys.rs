//! The `config.json` readers that build parts of a [`super::ModelConfig`]: RoPE (with its scaling) and the DSA
//! indexer's layer schedule, each error naming its key.

use serde_json::Value;

use super::config::{Architecture, Indexer, Rope, RopeScaling};
use super::config_error::ConfigError;
use super::keys::Keys;

impl Keys<'_> {
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
            Architecture::Glm4Moe | Architecture::DeepseekV4 | Architecture::KimiLinear | Architecture::Glm5Next => {
                false
            }
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
    pub(super) fn indexer_full_layers(&self, layers: usize, first_attention: usize) -> Result<Vec<bool>, ConfigError> {
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
        if full.get(first_attention) == Some(&false) {
            return Err(unsupported(
                key,
                format!("shared at layer {first_attention}, the first attention layer"),
                format!(
                    "layer {first_attention} has no earlier full layer whose top-k it could reuse; make it \"full\""
                ),
            ));
        }
        Ok(full)
    }
}
