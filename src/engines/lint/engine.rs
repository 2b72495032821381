//! The tensor-parallel size a lint run checks (`--tp`): 8 for models of a real release's size, 1 otherwise. The
//! engines (`--engine`) are [`crate::engines`]'.

use serde_json::Value;

/// The tensor-parallel size deployments of the real releases use (8×H200 class).
pub const REAL_SIZE_TP: usize = 8;

/// The default `--tp`: [`REAL_SIZE_TP`] when the config's `hidden_size` and `moe_intermediate_size` are those of
/// a built-in preset (a real-size Kimi K2, GLM-5 or GLM-4.5), 1 otherwise (tiny and synthetic models).
pub fn default_tp(config: &Value) -> usize {
    let shape = |json: &Value| -> Option<(u64, u64)> {
        Some((json.get("hidden_size")?.as_u64()?, json.get("moe_intermediate_size")?.as_u64()?))
    };
    let Some(model) = shape(config) else { return 1 };
    let real = crate::model::presets::names().into_iter().any(|name| {
        crate::model::presets::config_text(name)
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
            .and_then(|preset| shape(&preset))
            == Some(model)
    });
    if real {
        REAL_SIZE_TP
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::{Engine, EngineChoice};

    #[test]
    fn real_sizes_default_to_tp_8_and_tiny_ones_to_1() {
        let glm45 = serde_json::json!({"hidden_size": 5120, "moe_intermediate_size": 1536});
        assert_eq!(default_tp(&glm45), 8);
        let kimi = serde_json::json!({"hidden_size": 7168, "moe_intermediate_size": 2048});
        assert_eq!(default_tp(&kimi), 8);
        let tiny = serde_json::json!({"hidden_size": 320, "moe_intermediate_size": 160});
        assert_eq!(default_tp(&tiny), 1);
        assert_eq!(default_tp(&serde_json::json!({"hidden_size": "x"})), 1);
    }

    #[test]
    fn engine_choices_parse() {
        assert_eq!("all".parse::<EngineChoice>().unwrap().engines(), vec![Engine::Vllm, Engine::Sglang]);
        assert!("none".parse::<EngineChoice>().unwrap().engines().is_empty());
        assert!("trt".parse::<EngineChoice>().unwrap_err().contains("vllm, sglang"));
    }
}
