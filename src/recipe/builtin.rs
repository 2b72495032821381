//! The recipes shipped in `recipes/`, embedded in the binary by name.

use crate::model::Architecture;

pub const BUILTIN_NAMES: [&str; 30] = [
    "kimi-k2-int4",
    "glm5-int4",
    "glm45-int4",
    "kimi-k2-nvfp4",
    "glm5-nvfp4",
    "glm45-nvfp4",
    "kimi-k2-mxfp4",
    "glm5-mxfp4",
    "glm45-mxfp4",
    "kimi-k2-w4a8",
    "glm5-w4a8",
    "glm45-w4a8",
    "kimi-k26-nvfp4",
    "kimi-k26-mxfp4",
    "kimi-k26-w4a8",
    "kimi-k2-nvfp4-w4a4",
    "glm5-nvfp4-w4a4",
    "glm45-nvfp4-w4a4",
    "kimi-k26-nvfp4-w4a4",
    "kimi-k2-nvfp4-mlp",
    "glm5-nvfp4-mlp",
    "glm45-nvfp4-mlp",
    "kimi-k3-nvfp4",
    "kimi-k3-mxfp4",
    "kimi-k3-int4",
    "kimi-linear-int4",
    "glm5.3-flash-int4",
    "deepseek-v4-nvfp4",
    "deepseek-v4-mxfp4",
    "deepseek-v4-int4",
];

/// Other names of built-ins: GLM-5.2 (and 5.1) convert with GLM-5's recipes (the same tensors; a shared indexer
/// layer simply has no indexer weights to keep).
pub const ALIASES: [(&str, &str); 6] = [
    ("glm52-int4", "glm5-int4"),
    ("glm52-nvfp4", "glm5-nvfp4"),
    ("glm52-mxfp4", "glm5-mxfp4"),
    ("glm52-w4a8", "glm5-w4a8"),
    ("glm52-nvfp4-w4a4", "glm5-nvfp4-w4a4"),
    ("glm52-nvfp4-mlp", "glm5-nvfp4-mlp"),
];

/// The TOML text of a built-in recipe, by name or alias.
pub fn builtin(name: &str) -> Option<&'static str> {
    let name = ALIASES.iter().find(|(alias, _)| *alias == name).map_or(name, |(_, target)| target);
    match name {
        "kimi-k2-int4" => Some(include_str!("../../recipes/kimi-k2-int4.toml")),
        "glm5-int4" => Some(include_str!("../../recipes/glm5-int4.toml")),
        "glm45-int4" => Some(include_str!("../../recipes/glm45-int4.toml")),
        "kimi-k2-nvfp4" => Some(include_str!("../../recipes/kimi-k2-nvfp4.toml")),
        "glm5-nvfp4" => Some(include_str!("../../recipes/glm5-nvfp4.toml")),
        "glm45-nvfp4" => Some(include_str!("../../recipes/glm45-nvfp4.toml")),
        "kimi-k2-mxfp4" => Some(include_str!("../../recipes/kimi-k2-mxfp4.toml")),
        "glm5-mxfp4" => Some(include_str!("../../recipes/glm5-mxfp4.toml")),
        "glm45-mxfp4" => Some(include_str!("../../recipes/glm45-mxfp4.toml")),
        "kimi-k2-w4a8" => Some(include_str!("../../recipes/kimi-k2-w4a8.toml")),
        "glm5-w4a8" => Some(include_str!("../../recipes/glm5-w4a8.toml")),
        "glm45-w4a8" => Some(include_str!("../../recipes/glm45-w4a8.toml")),
        "kimi-k26-nvfp4" => Some(include_str!("../../recipes/kimi-k26-nvfp4.toml")),
        "kimi-k26-mxfp4" => Some(include_str!("../../recipes/kimi-k26-mxfp4.toml")),
        "kimi-k26-w4a8" => Some(include_str!("../../recipes/kimi-k26-w4a8.toml")),
        "kimi-k2-nvfp4-w4a4" => Some(include_str!("../../recipes/kimi-k2-nvfp4-w4a4.toml")),
        "glm5-nvfp4-w4a4" => Some(include_str!("../../recipes/glm5-nvfp4-w4a4.toml")),
        "glm45-nvfp4-w4a4" => Some(include_str!("../../recipes/glm45-nvfp4-w4a4.toml")),
        "kimi-k26-nvfp4-w4a4" => Some(include_str!("../../recipes/kimi-k26-nvfp4-w4a4.toml")),
        "kimi-k2-nvfp4-mlp" => Some(include_str!("../../recipes/kimi-k2-nvfp4-mlp.toml")),
        "glm5-nvfp4-mlp" => Some(include_str!("../../recipes/glm5-nvfp4-mlp.toml")),
        "glm45-nvfp4-mlp" => Some(include_str!("../../recipes/glm45-nvfp4-mlp.toml")),
        "kimi-k3-nvfp4" => Some(include_str!("../../recipes/kimi-k3-nvfp4.toml")),
        "kimi-k3-mxfp4" => Some(include_str!("../../recipes/kimi-k3-mxfp4.toml")),
        "kimi-k3-int4" => Some(include_str!("../../recipes/kimi-k3-int4.toml")),
        "kimi-linear-int4" => Some(include_str!("../../recipes/kimi-linear-int4.toml")),
        "glm5.3-flash-int4" => Some(include_str!("../../recipes/glm5.3-flash-int4.toml")),
        "deepseek-v4-nvfp4" => Some(include_str!("../../recipes/deepseek-v4-nvfp4.toml")),
        "deepseek-v4-mxfp4" => Some(include_str!("../../recipes/deepseek-v4-mxfp4.toml")),
        "deepseek-v4-int4" => Some(include_str!("../../recipes/deepseek-v4-int4.toml")),
        _ => None,
    }
}

/// The built-in recipes that requantize a natively INT4 folder of `architecture` into another 4-bit format, with
/// the nodes each is for: NVFP4 (Blackwell), MXFP4 (AMD), W4A8 (Hopper prefill), those the architecture has. Kimi K2's
/// family names them after the release that ships INT4 (K2.5/K2.6/K2.7: `kimi-k26-*`); the others use the family's
/// own recipes, which dequantize an INT4 source exactly as they would an FP8 one.
pub fn int4_requantizing(architecture: Architecture) -> Vec<(&'static str, &'static str)> {
    let family = match architecture {
        Architecture::DeepseekV3 => "kimi-k26",
        Architecture::GlmMoeDsa => "glm5",
        Architecture::Glm4Moe => "glm45",
        Architecture::KimiLinear => "kimi-k3",
        Architecture::DeepseekV4 => "deepseek-v4",
        Architecture::Glm5Next => "glm5.3-flash",
    };
    [("nvfp4", "Blackwell"), ("mxfp4", "AMD"), ("w4a8", "Hopper prefill")]
        .into_iter()
        .filter_map(|(format, nodes)| {
            let name = format!("{family}-{format}");
            BUILTIN_NAMES.iter().find(|builtin| **builtin == name).map(|builtin| (*builtin, nodes))
        })
        .collect()
}
