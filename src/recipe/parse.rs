//! Recipe parsing (`deny_unknown_fields`, errors naming the key), validation, CLI overrides and rule lookup.

use std::path::Path;

use regex::Regex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::builtin::{builtin, ALIASES, BUILTIN_NAMES};
use crate::format::compressed_tensors::matching::PatternList;
use crate::format::compressed_tensors::Fp4Kind;
use crate::quant::ScaleRule;

/// What a rule does to the tensors it selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// compressed-tensors `pack-quantized` INT4, symmetric, group-wise.
    Int4,
    /// compressed-tensors `nvfp4-pack-quantized` (Blackwell): FP4 E2M1 in groups of 16, FP8 scales, a global
    /// scale per tensor; weights only.
    Nvfp4,
    /// NVFP4 weights and NVFP4 activations (W4A4: compressed-tensors' preset `NVFP4`, FP4 tensor cores on both
    /// operands): the weights as `nvfp4`, plus each module's `input_global_scale` from calibration (`--calibration`);
    /// the activations' group scales are computed at run time by the engine.
    Nvfp4W4a4,
    /// compressed-tensors `mxfp4-pack-quantized` (AMD, OCP MX): FP4 E2M1 in groups of 32, E8M0 scales; weights
    /// only.
    Mxfp4,
    /// INT4 `pack-quantized` weights in groups of 128 declared with FP8 per-token dynamic activations (Hopper
    /// prefill: vLLM `CompressedTensorsW4A8Fp8MoEMethod`, SGLang `CompressedTensorsW4AFP8MoE`).
    W4a8Fp8,
}

/// W4A8's group: vLLM's W4A8 MoE method asserts it ("Only group size 128 supported for W4A8 MoE",
/// `compressed_tensors_moe_w4a8_fp8.py`).
pub const W4A8_GROUP: usize = 128;

impl Scheme {
    /// The FP4 format of an FP4 scheme.
    pub fn fp4_kind(self) -> Option<Fp4Kind> {
        match self {
            Scheme::Int4 | Scheme::W4a8Fp8 => None,
            Scheme::Nvfp4 | Scheme::Nvfp4W4a4 => Some(Fp4Kind::Nvfp4),
            Scheme::Mxfp4 => Some(Fp4Kind::Mxfp4),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scheme::W4a8Fp8 => "w4a8-fp8",
            Scheme::Nvfp4W4a4 => "nvfp4-w4a4",
            _ => self.fp4_kind().map_or("int4", Fp4Kind::name),
        }
    }

    /// The group size the format fixes, if it fixes one.
    pub fn fixed_group(self) -> Option<usize> {
        match self {
            Scheme::Int4 => None,
            Scheme::W4a8Fp8 => Some(W4A8_GROUP),
            Scheme::Nvfp4 | Scheme::Nvfp4W4a4 | Scheme::Mxfp4 => self.fp4_kind().map(Fp4Kind::group),
        }
    }
}

/// Why `rule` cannot take group size `group_size` and scale rule `scale_rule`: W4A8 and the FP4 formats fix their
/// group, and the FP4 formats compute scales from the group's absmax only.
fn fixed_format_problem(rule: &Rule, group_size: usize, scale_rule: ScaleRule) -> Option<String> {
    let group = rule.scheme.fixed_group()?;
    if group_size != group {
        return Some(format!(
            "rule `{}` is {}, whose group is {group} elements (the format fixes it; vLLM and SGLang load no other), \
             got {group_size}",
            rule.name,
            rule.scheme.name(),
        ));
    }
    let kind = rule.scheme.fp4_kind()?;
    if scale_rule != ScaleRule::CtMinmax {
        return Some(format!(
            "rule `{}` is {}: its scales come from each group's absmax (compressed-tensors' minmax), so the scale \
             rule must be ct-minmax, got {}",
            rule.name,
            kind.name(),
            scale_rule.name()
        ));
    }
    None
}

/// What happens to FP8 tensors no rule selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Unselected {
    /// Dequantized to BF16.
    #[default]
    Bf16,
    /// Kept as FP8 and written as compressed-tensors `float-quantized` (block 128×128) in a second config group.
    Fp8Block,
}

/// What the rules do to the routed experts of an MTP layer (`model.layers.{num_hidden_layers}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum MtpExperts {
    /// Quantized by the same rules as every other routed expert.
    #[default]
    LikeExperts,
    /// Left out of the rules (BF16), and ignored for the engines under the names their MTP loaders give them.
    Bf16,
}

impl MtpExperts {
    fn is_default(&self) -> bool {
        *self == MtpExperts::default()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub name: String,
    /// Regular expression searched in the full tensor name (`model.layers.3.mlp.experts.7.up_proj.weight`).
    #[serde(rename = "match")]
    pub pattern: String,
    pub scheme: Scheme,
    #[serde(default = "default_group_size")]
    pub group_size: usize,
    #[serde(default = "default_scale_rule")]
    pub scale_rule: ScaleRule,
}

fn default_group_size() -> usize {
    32
}

fn default_scale_rule() -> ScaleRule {
    ScaleRule::CtMinmax
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecipeFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub unselected: Unselected,
    /// Regular expressions of tensors no rule may select (their precision is untouched).
    #[serde(default)]
    pub keep: Vec<String>,
    /// compressed-tensors `ignore` entries written to `config.json` (module names or `re:` patterns).
    #[serde(default)]
    pub config_ignore: Vec<String>,
    /// The MTP layer's routed experts: `like-experts` (default) or `bf16`. Left out of the serialized recipe when
    /// default, so the plan hash of every recipe written before the key existed is unchanged.
    #[serde(default, skip_serializing_if = "MtpExperts::is_default")]
    pub mtp: MtpExperts,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// A parsed, validated recipe with compiled patterns.
#[derive(Debug, Clone)]
pub struct Recipe {
    pub file: RecipeFile,
    rule_patterns: Vec<Regex>,
    keep_patterns: Vec<Regex>,
    ignore_patterns: PatternList,
}

#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error(
        "unknown recipe `{name}`: not a built-in ({}; aliases {}) and no such file",
        BUILTIN_NAMES.join(", "),
        ALIASES.iter().map(|(alias, target)| format!("{alias} = {target}")).collect::<Vec<_>>().join(", ")
    )]
    Unknown { name: String },
    #[error("recipe {source_name}: {message}")]
    Invalid { source_name: String, message: String },
}

impl Recipe {
    /// Loads a built-in recipe by name or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<Self, RecipeError> {
        if let Some(text) = builtin(name_or_path) {
            return Self::parse(text, name_or_path);
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            let text = std::fs::read_to_string(path)
                .map_err(|e| RecipeError::Invalid { source_name: name_or_path.into(), message: e.to_string() })?;
            return Self::parse(&text, name_or_path);
        }
        Err(RecipeError::Unknown { name: name_or_path.into() })
    }

    /// Parses TOML text; `source_name` names it in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, RecipeError> {
        let invalid = |message: String| RecipeError::Invalid { source_name: source_name.into(), message };
        let file: RecipeFile = toml::from_str(text).map_err(|e| invalid(e.to_string().trim().replace('\n', " ")))?;
        Self::from_file(file).map_err(invalid)
    }

    fn from_file(file: RecipeFile) -> Result<Self, String> {
        let compile = |key: &str, pattern: &str| {
            Regex::new(pattern).map_err(|e| format!("key `{key}`: invalid regex `{pattern}`: {e}"))
        };
        let mut rule_patterns = Vec::new();
        for (index, rule) in file.rules.iter().enumerate() {
            if rule.group_size == 0 {
                return Err(format!("key `rules[{index}].group_size`: must be positive"));
            }
            if let Some(problem) = fixed_format_problem(rule, rule.group_size, rule.scale_rule) {
                return Err(format!("key `rules[{index}]`: {problem}"));
            }
            let int4_kinds = [Scheme::Int4, Scheme::W4a8Fp8];
            if int4_kinds.contains(&rule.scheme)
                && file.rules.iter().any(|other| int4_kinds.contains(&other.scheme) && other.scheme != rule.scheme)
            {
                return Err(format!(
                    "key `rules[{index}].scheme`: int4 and w4a8-fp8 rules in one recipe would need two INT4 groups \
                     that differ only in their activations; use one of them"
                ));
            }
            rule_patterns.push(compile(&format!("rules[{index}].match"), &rule.pattern)?);
        }
        let keep_patterns = file
            .keep
            .iter()
            .enumerate()
            .map(|(index, pattern)| compile(&format!("keep[{index}]"), pattern))
            .collect::<Result<_, _>>()?;
        let ignore_patterns = PatternList::ignore(file.config_ignore.iter().map(String::as_str));
        if let Some(error) = ignore_patterns.errors.first() {
            return Err(format!("key `config_ignore`: {error}"));
        }
        Ok(Self { file, rule_patterns, keep_patterns, ignore_patterns })
    }

    pub fn name(&self) -> &str {
        &self.file.name
    }

    /// Applies `--group-size` and `--scale-rule` to every rule.
    pub fn with_overrides(
        mut self,
        group_size: Option<usize>,
        scale_rule: Option<ScaleRule>,
    ) -> Result<Self, RecipeError> {
        for rule in &mut self.file.rules {
            if let Some(group_size) = group_size {
                if group_size == 0 {
                    return Err(RecipeError::Invalid {
                        source_name: "--group-size".into(),
                        message: "must be positive".into(),
                    });
                }
                rule.group_size = group_size;
            }
            if let Some(scale_rule) = scale_rule {
                rule.scale_rule = scale_rule;
            }
            if let Some(problem) = fixed_format_problem(rule, rule.group_size, rule.scale_rule) {
                let flag = if group_size.is_some_and(|g| Some(g) != rule.scheme.fixed_group()) {
                    "--group-size"
                } else {
                    "--scale-rule"
                };
                return Err(RecipeError::Invalid { source_name: flag.into(), message: problem });
            }
        }
        Ok(self)
    }

    /// The first rule selecting `tensor_name`, unless a `keep` pattern protects it.
    pub fn rule_for(&self, tensor_name: &str) -> Option<&Rule> {
        if self.keep_patterns.iter().any(|pattern| pattern.is_match(tensor_name)) {
            return None;
        }
        self.rule_patterns.iter().position(|pattern| pattern.is_match(tensor_name)).map(|index| &self.file.rules[index])
    }

    /// Canonical TOML of the effective recipe (after overrides).
    pub fn canonical_text(&self) -> String {
        toml::to_string(&self.file).unwrap_or_default()
    }

    /// SHA-256 of the canonical text.
    pub fn sha256(&self) -> String {
        crate::hex::hex(&Sha256::digest(self.canonical_text().as_bytes()))
    }

    /// Whether a module name is covered by a `config_ignore` entry, matched as the engines match `ignore`
    /// (`lint::matching`: exact module name, or `re:` pattern as Python `re.match`, anchored at the start only).
    pub fn config_ignores(&self, module: &str) -> bool {
        self.ignore_patterns.first_match(module).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse_and_select_their_mlps() {
        // Each family's names: routed expert, shared expert, router, dense MLP (none in DeepSeek-V4), attention.
        let names = |recipe: &str| match recipe {
            r if r.starts_with("kimi-k3") => [
                "language_model.model.layers.5.block_sparse_moe.experts.12.w2.weight",
                "language_model.model.layers.5.block_sparse_moe.shared_experts.down_proj.weight",
                "language_model.model.layers.5.block_sparse_moe.gate.weight",
                "language_model.model.layers.0.mlp.down_proj.weight",
                "language_model.model.layers.5.self_attn.o_proj.weight",
            ],
            "kimi-linear-int4" => [
                "model.layers.5.block_sparse_moe.experts.12.w2.weight",
                "model.layers.5.block_sparse_moe.shared_experts.down_proj.weight",
                "model.layers.5.block_sparse_moe.gate.weight",
                "model.layers.0.mlp.down_proj.weight",
                "model.layers.5.self_attn.o_proj.weight",
            ],
            r if r.starts_with("deepseek-v4") => [
                "layers.5.ffn.experts.12.w2.weight",
                "layers.5.ffn.shared_experts.w2.weight",
                "layers.5.ffn.gate.weight",
                "",
                "layers.5.attn.wo_b.weight",
            ],
            _ => [
                "model.layers.5.mlp.experts.12.down_proj.weight",
                "model.layers.5.mlp.shared_experts.down_proj.weight",
                "model.layers.5.mlp.gate.weight",
                "model.layers.0.mlp.down_proj.weight",
                "model.layers.5.self_attn.o_proj.weight",
            ],
        };
        for name in BUILTIN_NAMES.into_iter().chain(ALIASES.map(|(alias, _)| alias)) {
            let recipe = Recipe::load(name).unwrap();
            let [expert, shared, router, dense, attention] = names(name);
            // The `-mlp` recipes select the shared experts and the dense MLP too; every other one routed experts only.
            let all_mlps = name.ends_with("-mlp");
            assert!(recipe.rule_for(expert).is_some(), "{name}");
            assert_eq!(recipe.rule_for(shared).is_some(), all_mlps, "{name}");
            assert!(recipe.rule_for(router).is_none(), "{name}");
            if !dense.is_empty() {
                assert_eq!(recipe.rule_for(dense).is_some(), all_mlps, "{name}");
            }
            assert!(recipe.rule_for(attention).is_none(), "{name}");
            assert!(recipe.config_ignores(attention.trim_end_matches(".weight")), "{name}");
            assert!(!recipe.config_ignores(expert.trim_end_matches(".weight")), "{name}");
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let error = Recipe::parse("name = \"x\"\nunselcted = \"bf16\"\n", "test.toml").unwrap_err().to_string();
        assert!(error.contains("unselcted"), "{error}");
        let error = Recipe::parse("name = \"x\"\n[[rules]]\nname=\"r\"\nmatch='('\nscheme=\"int4\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(error.contains("rules[0].match"), "{error}");
    }
}
