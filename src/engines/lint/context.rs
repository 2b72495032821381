//! What the rules share: the output's linear modules with how each is stored, and the config's quantization
//! groups and `ignore` list parsed as the engines parse them.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::output::{OutputDescription, TensorFacts};
use super::report::Finding;
use crate::format::compressed_tensors::matching::{module_name, PatternList};
use crate::io::dtype::Dtype;

/// How a linear module's weight is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// `weight_packed` I32 (+ scale, shape): compressed-tensors INT4.
    Int4,
    /// `weight_packed` U8 (+ scale, NVFP4's global scale): compressed-tensors NVFP4 or MXFP4.
    Fp4,
    /// `weight` in BF16/F16/F32.
    Float,
    /// `weight` in F8_E4M3.
    Fp8,
}

impl Stored {
    /// A `weight_packed` module: INT4 or FP4.
    pub fn is_packed(self) -> bool {
        matches!(self, Stored::Int4 | Stored::Fp4)
    }
}

/// How the config's `quantization_config` treats a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigView {
    /// Matched by this `ignore` entry.
    Ignored(String),
    /// Matched by a target of this group (index into `Context::groups`).
    Quantized(usize),
    /// No target and no ignore entry matches.
    Untargeted,
}

/// One entry of `config_groups`.
pub struct Group<'a> {
    pub name: &'a str,
    pub json: &'a Value,
    pub targets: PatternList,
}

pub struct Context<'a> {
    pub config: &'a Value,
    pub quantization: Option<&'a Map<String, Value>>,
    pub tensors: BTreeMap<&'a str, &'a TensorFacts>,
    /// Linear modules (2-D `weight` or `weight_packed`), embeddings excluded.
    pub modules: BTreeMap<&'a str, Stored>,
    pub ignore: PatternList,
    pub groups: Vec<Group<'a>>,
    pub tp: usize,
    /// How the output names its text model's tensors (inside a vision-language wrapper: with a prefix).
    pub name_style: crate::io::composite::NameStyle,
}

impl<'a> Context<'a> {
    pub fn new(output: &'a OutputDescription, tp: usize) -> Self {
        // A vision-language wrapper's text model keys sit in `text_config` (what the engines' text model reads).
        let config = crate::io::composite::text_config(&output.config);
        let quantization = crate::io::composite::quantization_config(&output.config).and_then(Value::as_object);
        let tensors: BTreeMap<&str, &TensorFacts> = output.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut modules = BTreeMap::new();
        for tensor in &output.tensors {
            let Some((module, suffix)) = module_name(&tensor.name) else { continue };
            // vLLM and SGLang build a wrapper's vision tower and projector without the quantization config.
            // DeepSeek-V4's `embed` is vLLM's `embed_tokens` (`_make_deepseek_v4_weights_mapper`).
            if module.ends_with("embed_tokens") || module == "embed" || crate::io::composite::is_carried(module) {
                continue;
            }
            match suffix {
                "weight_packed" => {
                    modules.insert(module, if tensor.dtype == Dtype::U8 { Stored::Fp4 } else { Stored::Int4 });
                }
                "weight" if tensor.shape.len() == 2 => {
                    let stored = if tensor.dtype == Dtype::F8_E4M3 { Stored::Fp8 } else { Stored::Float };
                    modules.entry(module).or_insert(stored);
                }
                _ => {}
            }
        }
        let strings = |value: Option<&'a Value>| -> Vec<&'a str> {
            value.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
        };
        let ignore = PatternList::ignore(strings(quantization.and_then(|q| q.get("ignore"))));
        let groups = quantization
            .and_then(|q| q.get("config_groups"))
            .and_then(Value::as_object)
            .map(|groups| {
                groups
                    .iter()
                    .map(|(name, json)| Group {
                        name: name.as_str(),
                        json,
                        targets: PatternList::targets(strings(json.get("targets"))),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let names = output.tensors.iter().map(|t| t.name.as_str());
        let name_style = crate::io::composite::NameStyle::of_folder(Some(&output.config), names);
        Self { config, quantization, tensors, modules, ignore, groups, tp, name_style }
    }

    /// Whether anything in the output is quantized to 4 bits (tensors or a config group): the rules on quantized
    /// outputs apply.
    pub fn has_int4(&self) -> bool {
        self.modules.values().any(|s| s.is_packed()) || !self.groups.is_empty()
    }

    /// The module view of the engines: ignore entries are checked first, then the groups' targets in order.
    pub fn view(&self, module: &str) -> ConfigView {
        if let Some(entry) = self.ignore.first_match(module) {
            return ConfigView::Ignored(entry.to_string());
        }
        // Inside a wrapper an entry written for the text model's name (Moonshot's `lm_head` for
        // `language_model.lm_head`) covers the module too.
        if let Some(entry) = crate::io::composite::text_name(module).and_then(|text| self.ignore.first_match(&text)) {
            return ConfigView::Ignored(entry.to_string());
        }
        // DeepSeek-V4's output head `head` is the module vLLM names `lm_head` (its weights mapper renames it).
        if let Some(entry) = (module == "head").then(|| self.ignore.first_match("lm_head")).flatten() {
            return ConfigView::Ignored(entry.to_string());
        }
        match self.groups.iter().position(|group| group.targets.first_match(module).is_some()) {
            Some(index) => ConfigView::Quantized(index),
            None => ConfigView::Untargeted,
        }
    }

    /// Whether the engines would treat `module` as quantized.
    pub fn quantized_by_config(&self, module: &str) -> bool {
        matches!(self.view(module), ConfigView::Quantized(_))
    }

    /// A non-negative integer key of `config.json`, or a failed finding naming it.
    pub fn config_usize(&self, key: &str) -> Result<usize, Finding> {
        self.config.get(key).and_then(Value::as_u64).map(|v| v as usize).ok_or_else(|| {
            Finding::failed(
                format!("config.json `{key}`"),
                match self.config.get(key) {
                    None => "missing".to_string(),
                    Some(value) => format!("is {value}, not a non-negative integer"),
                },
                format!("restore `{key}` from the source model's config.json"),
            )
        })
    }

    /// The MTP layers start here (`num_hidden_layers`), when the config says.
    pub fn num_hidden_layers(&self) -> Option<usize> {
        self.config.get("num_hidden_layers").and_then(Value::as_u64).map(|v| v as usize)
    }

    /// MLA attention (Kimi K2, GLM-5): one latent KV cache.
    pub fn is_mla(&self) -> bool {
        self.config.get("kv_lora_rank").is_some_and(|v| !v.is_null())
    }

    /// `architectures[0]` of the config.
    pub fn architecture(&self) -> Option<&str> {
        self.config.get("architectures")?.as_array()?.first()?.as_str()
    }

    /// Names of the routed-expert projections (`…mlp.experts.E.{gate,up,down}_proj`), MTP layer included.
    pub fn routed_experts(&self) -> Vec<&'a str> {
        self.modules.keys().copied().filter(|m| crate::model::tensor_class::is_routed_expert(m)).collect()
    }
}

/// The router gate (`…mlp.gate`): vLLM and SGLang build it unquantized whatever the config says.
pub fn is_router(module: &str) -> bool {
    module.ends_with(".mlp.gate")
}

/// A short list of names for a finding: the first few and a count.
pub fn name_list(names: &[&str]) -> String {
    const SHOWN: usize = 3;
    let mut text = names.iter().take(SHOWN).copied().collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}
