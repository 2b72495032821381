//! Built-in model presets: the public `config.json` values of Kimi K2, Kimi K2.6 (natively INT4 inside its
//! vision-language wrapper), GLM-5, GLM-5.2 (and GLM-5.3, its post-trained successor: the same architecture and
//! config), GLM-4.5, and the FP4-native releases Kimi K3 (MXFP4 experts inside `kimi_k3`) and DeepSeek-V4 Flash and
//! Pro (MXFP4 experts, E8M0-scaled FP8), embedded from
//! `src/model/presets/` so that `squeeze report kimi-k2` works before anything is downloaded. GLM-5.3-Flash's is put
//! together from transformers 5.24's `Glm5NextTextConfig` defaults (documented as `zai-org/GLM-5.3-Flash`'s) and the
//! shared REFERENCES §11 (one dense layer, FP8 128×128 blocks, `linear_attn_config`); its released `config.json` was
//! not read here, so its `layer_types`/`indexer_types` are transformers' defaults.

/// Preset name and its `config.json` text.
const PRESETS: [(&str, &str); 10] = [
    ("kimi-k2", include_str!("presets/kimi-k2.json")),
    ("kimi-k2.6", include_str!("presets/kimi-k2.6.json")),
    ("glm-5", include_str!("presets/glm-5.json")),
    ("glm-5.2", include_str!("presets/glm-5.2.json")),
    ("glm-4.5", include_str!("presets/glm-4.5.json")),
    ("glm-5.3", include_str!("presets/glm-5.3.json")),
    ("glm-5.3-flash", include_str!("presets/glm-5.3-flash.json")),
    ("kimi-k3", include_str!("presets/kimi-k3.json")),
    ("deepseek-v4-flash", include_str!("presets/deepseek-v4-flash.json")),
    ("deepseek-v4-pro", include_str!("presets/deepseek-v4-pro.json")),
];

/// The preset names, in the order the help and the errors list them.
pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|(name, _)| *name).collect()
}

/// The `config.json` text of preset `name`.
pub fn config_text(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|(preset, _)| *preset == name).map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Architecture, ModelConfig};

    #[test]
    fn every_preset_parses_with_a_block_fp8_quantization_config() {
        for name in names() {
            let text = config_text(name).expect("listed presets exist");
            let json: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            let quantization = crate::io::composite::quantization_config(&json).expect("presets are quantized");
            if quantization["quant_method"] == "compressed-tensors" {
                continue; // natively INT4 (Kimi K2.6): no FP8 block config to check
            }
            let config = ModelConfig::from_json(&json).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(config.weight_block_size, Some([128, 128]), "{name}");
            assert_eq!(json["quantization_config"]["quant_method"], "fp8", "{name}");
        }
    }

    #[test]
    fn presets_map_to_their_architectures() {
        let architecture = |name: &str| {
            let json: serde_json::Value = serde_json::from_str(config_text(name).unwrap()).unwrap();
            ModelConfig::from_json(&json).unwrap().architecture
        };
        assert_eq!(architecture("kimi-k2"), Architecture::DeepseekV3);
        assert_eq!(architecture("kimi-k2.6"), Architecture::DeepseekV3);
        assert_eq!(architecture("glm-5"), Architecture::GlmMoeDsa);
        assert_eq!(architecture("glm-5.2"), Architecture::GlmMoeDsa);
        assert_eq!(architecture("glm-4.5"), Architecture::Glm4Moe);
        assert_eq!(architecture("glm-5.3"), Architecture::GlmMoeDsa);
        assert_eq!(architecture("glm-5.3-flash"), Architecture::Glm5Next);
        assert_eq!(architecture("kimi-k3"), Architecture::KimiLinear);
        assert_eq!(architecture("deepseek-v4-flash"), Architecture::DeepseekV4);
        assert_eq!(architecture("deepseek-v4-pro"), Architecture::DeepseekV4);
        assert!(config_text("glm-6").is_none());
    }
}
