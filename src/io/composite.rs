//! A model folder whose causal LM sits inside a vision-language wrapper (Kimi K2.5/K2.6/K2.7 `kimi_k25`, and
//! transformers-style `model.language_model.` checkpoints): where its text config, its `quantization_config` and
//! its tensors are, and which tensors (vision tower, projector) squeeze carries but never quantizes or runs.
//!
//! Checked against the engines' loaders: vLLM 0.32 `models/kimi_k25.py` builds the text model under the prefix
//! `language_model` (so Moonshot's `language_model.model.layers.N.*` are its module names as stored; its mapper
//! only rewrites the legacy `language_model.layers.` form and `mm_projector.proj.0/2`), reads
//! `quantization_config` from `text_config` when the top level has none (`weight_utils.py::get_quant_config`) and
//! builds the vision tower and projector without a quantization config; SGLang 0.5.23 `models/kimi_k25.py`
//! strips `language_model.` and hands the rest to its DeepSeek-V2 loader.

use serde_json::Value;

/// Stored-name prefixes of a wrapped text model and the names squeeze's text model gives them.
const TEXT_PREFIXES: [(&str, &str); 3] = [
    // Moonshot (Kimi K2.5/K2.6/K2.7): `language_model.model.layers.N.*`, `language_model.lm_head.weight`.
    ("language_model.model.", "model."),
    ("language_model.lm_head", "lm_head"),
    // transformers v5 and GLM-4.xV: `model.language_model.layers.N.*` (`lm_head.weight` unprefixed).
    ("model.language_model.", "model."),
];

/// Name prefixes of the parts a wrapper adds around its text model (vision tower, projector): carried byte for
/// byte by every writer, never quantized, never run.
const CARRIED_PREFIXES: [&str; 6] =
    ["vision_tower.", "mm_projector.", "model.vision_tower.", "model.mm_projector.", "model.visual.", "visual."];

/// The wrapper around a text model, from `config.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Wrapper {
    /// `architectures[0]` of the wrapper (`KimiK25ForConditionalGeneration`).
    pub architecture: String,
    /// The wrapper's `model_type` (`kimi_k25`).
    pub model_type: String,
    /// The wrapped text model's `model_type` (`kimi_k2`).
    pub text_model_type: String,
}

/// The wrapper `config` describes, or `None` for a plain causal LM (no `text_config` object).
pub fn wrapper(config: &Value) -> Option<Wrapper> {
    let text = config.get("text_config").filter(|t| t.is_object())?;
    let string = |value: &Value, key: &str| value.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    let architecture = config
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|list| list.first())
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Some(Wrapper {
        architecture,
        model_type: string(config, "model_type"),
        text_model_type: string(text, "model_type"),
    })
}

/// The config of the text model: `text_config` inside a wrapper, else the config itself.
pub fn text_config(config: &Value) -> &Value {
    config.get("text_config").filter(|t| t.is_object()).unwrap_or(config)
}

/// `quantization_config` at the top level, else inside `text_config` (where Moonshot puts it; vLLM falls back to it).
pub fn quantization_config(config: &Value) -> Option<&Value> {
    config
        .get("quantization_config")
        .filter(|q| !q.is_null())
        .or_else(|| config.get("text_config")?.get("quantization_config").filter(|q| !q.is_null()))
}

/// The `quantization_config` [`quantization_config`] reads, to change in place (where the checkpoint keeps it: a
/// new top-level one would hide Moonshot's inside `text_config` from vLLM).
pub fn quantization_config_mut(config: &mut Value) -> Option<&mut Value> {
    if config.get("quantization_config").is_some_and(|q| !q.is_null()) {
        return config.get_mut("quantization_config");
    }
    config.get_mut("text_config")?.get_mut("quantization_config").filter(|q| !q.is_null())
}

/// The text model's name for stored tensor `stored` (`language_model.model.layers.0.…` → `model.layers.0.…`), or
/// `None` when the name carries no wrapper prefix.
pub fn text_name(stored: &str) -> Option<String> {
    TEXT_PREFIXES.iter().find_map(|(from, to)| stored.strip_prefix(from).map(|rest| format!("{to}{rest}")))
}

/// Whether stored tensor `stored` belongs to a wrapper's vision tower or projector.
pub fn is_carried(stored: &str) -> bool {
    CARRIED_PREFIXES.iter().any(|prefix| stored.starts_with(prefix))
}

/// The stored name of text-model tensor `text` in a folder whose tensors carry `prefix`'s wrapper names (the inverse
/// of [`text_name`] for the prefix style the folder uses), for writers that add tensors beside the vendor's
/// (KV scales).
pub fn stored_name(text: &str, style: NameStyle) -> String {
    match style {
        NameStyle::Plain => text.to_string(),
        NameStyle::Moonshot => format!("language_model.{text}"),
        NameStyle::Transformers => match text.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => text.to_string(),
        },
    }
}

/// Prompt text that stands for an image or video in a vision-language chat template (Kimi K2.5/K2.6's
/// `<|media_begin|>image<|media_content|><|media_pad|><|media_end|>`, vLLM's video placeholder, `<image>`).
pub const MEDIA_MARKERS: [&str; 6] = [
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_pad|>",
    "<|media_end|>",
    "<|kimi_k25_video_placeholder|>",
    "<image>",
];

/// The token ids a wrapper's config reserves for media (`media_placeholder_token_id`, `image_token_id`,
/// `video_token_id`): a text-only runtime cannot embed them.
pub fn media_token_ids(config: &Value) -> Vec<u64> {
    ["media_placeholder_token_id", "image_token_id", "video_token_id"]
        .iter()
        .filter_map(|key| config.get(key).and_then(Value::as_u64))
        .collect()
}

/// Why `prompt` (encoded as `ids`) cannot run on the text model of a wrapper described by `config`, if it cannot.
pub fn media_in_prompt(config: &Value, prompt: &str, ids: &[u32]) -> Option<String> {
    wrapper(config)?;
    if let Some(marker) = MEDIA_MARKERS.iter().find(|marker| prompt.contains(*marker)) {
        return Some(format!("holds the media marker `{marker}`"));
    }
    let media = media_token_ids(config);
    ids.iter()
        .position(|id| media.contains(&(*id as u64)))
        .map(|position| format!("holds the media token id {} at position {position}", ids[position]))
}

/// How a folder names its text model's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NameStyle {
    /// `model.layers.N.*`, `lm_head.weight`.
    Plain,
    /// `language_model.model.layers.N.*`, `language_model.lm_head.weight`.
    Moonshot,
    /// `model.language_model.layers.N.*`, `lm_head.weight`.
    Transformers,
}

impl NameStyle {
    /// The style of a folder whose `config.json` is `config` and whose tensors are `names`: plain unless the config
    /// is a wrapper's.
    pub fn of_folder<'a>(config: Option<&Value>, names: impl IntoIterator<Item = &'a str>) -> Self {
        match config.and_then(wrapper) {
            Some(_) => Self::of(names),
            None => NameStyle::Plain,
        }
    }

    /// The style of a folder holding `names`.
    pub fn of<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        for name in names {
            if name.starts_with("language_model.model.") {
                return NameStyle::Moonshot;
            }
            if name.starts_with("model.language_model.") {
                return NameStyle::Transformers;
            }
        }
        NameStyle::Plain
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kimi_k26_names_and_config_map_to_the_text_model_and_back() {
        let config = json!({"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "text_config": {"model_type": "kimi_k2", "hidden_size": 7168, "quantization_config": {"quant_method": "compressed-tensors"}},
            "vision_config": {"model_type": "kimi_k25_vision"}});
        let wrapper = wrapper(&config).expect("a wrapper");
        assert_eq!(wrapper.text_model_type, "kimi_k2");
        assert_eq!(text_config(&config)["hidden_size"], 7168);
        assert_eq!(quantization_config(&config).unwrap()["quant_method"], "compressed-tensors");
        let stored = "language_model.model.layers.3.mlp.experts.7.up_proj.weight_packed";
        let text = text_name(stored).unwrap();
        assert_eq!(text, "model.layers.3.mlp.experts.7.up_proj.weight_packed");
        assert_eq!(stored_name(&text, NameStyle::of([stored])), stored);
        assert_eq!(text_name("language_model.lm_head.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(stored_name("lm_head.weight", NameStyle::Moonshot), "language_model.lm_head.weight");
        assert!(is_carried("vision_tower.encoder.blocks.0.wqkv.weight") && is_carried("mm_projector.proj.0.weight"));
        assert!(!is_carried(stored) && text_name("vision_tower.patch_embed.weight").is_none());
    }

    #[test]
    fn transformers_style_and_plain_folders() {
        let stored = "model.language_model.layers.0.self_attn.o_proj.weight";
        assert_eq!(text_name(stored).as_deref(), Some("model.layers.0.self_attn.o_proj.weight"));
        assert_eq!(
            stored_name("model.layers.0.self_attn.k_scale", NameStyle::of([stored])),
            "model.language_model.layers.0.self_attn.k_scale"
        );
        let plain = json!({"model_type": "kimi_k2", "quantization_config": {"quant_method": "fp8"}});
        assert!(wrapper(&plain).is_none());
        assert_eq!(text_config(&plain), &plain);
        assert_eq!(quantization_config(&plain).unwrap()["quant_method"], "fp8");
        assert_eq!(NameStyle::of(["model.layers.0.mlp.gate.weight"]), NameStyle::Plain);
    }
}
