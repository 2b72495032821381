//! Everything engine-specific, in one folder: the serving engines squeeze writes for (vLLM 0.32, SGLang 0.5.23)
//! and the `--engine` flag (here), what they do with a checkpoint's FP8 KV-cache scales ([`kv_scales`]) and the
//! load rules an output must pass for them ([`lint`]). docs/engines.md is the prose beside it.

pub mod kv_scales;
pub mod lint;

use serde::{Deserialize, Serialize};

/// The `ignore` entry for the routed experts of the MTP layer SGLang 0.5.23 loads as its NextN draft model: it
/// builds that layer as `model.decoder` (`glm4_moe_nextn.py`, `deepseek_nextn.py`), not under its checkpoint name.
pub const SGLANG_NEXTN_EXPERTS: &str = "re:^model\\.decoder\\.mlp\\.experts\\..*";

/// A serving engine squeeze writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Vllm,
    Sglang,
}

impl Engine {
    pub const ALL: [Engine; 2] = [Engine::Vllm, Engine::Sglang];

    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Engine::Vllm => "vLLM 0.32",
            Engine::Sglang => "SGLang 0.5.23",
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The `--engine` flag: one engine, both (`all`, the default), or `none` (skip the engine-specific work: load
/// rules, engine tensor names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineChoice {
    Vllm,
    Sglang,
    #[default]
    All,
    None,
}

impl EngineChoice {
    pub fn engines(self) -> Vec<Engine> {
        match self {
            EngineChoice::Vllm => vec![Engine::Vllm],
            EngineChoice::Sglang => vec![Engine::Sglang],
            EngineChoice::All => Engine::ALL.to_vec(),
            EngineChoice::None => Vec::new(),
        }
    }
}

impl std::fmt::Display for EngineChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineChoice::Vllm => "vllm",
            EngineChoice::Sglang => "sglang",
            EngineChoice::All => "all",
            EngineChoice::None => "none",
        })
    }
}

impl std::str::FromStr for EngineChoice {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "vllm" => Ok(EngineChoice::Vllm),
            "sglang" => Ok(EngineChoice::Sglang),
            "all" => Ok(EngineChoice::All),
            "none" => Ok(EngineChoice::None),
            other => Err(format!("unknown engine `{other}`; known: vllm, sglang, all, none")),
        }
    }
}
