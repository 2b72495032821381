//! What a card states that is drawn, not copied, from the folder: the base model's id, the Hub tags, the pipeline,
//! the serve flags. Pure functions of the manifest, `config.json` and the source's README.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use serde_json::Value;

use crate::io::composite;
use crate::io::hub::RepoId;
use crate::io::manifest::Manifest;

/// The card's `base_model` and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseModel {
    pub id: String,
    pub from: BaseModelFrom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BaseModelFrom {
    /// `--base-model ORG/NAME` (quantize or card).
    Flag,
    /// `_name_or_path` of `config.json`, when it reads as a repo id.
    ConfigName,
    /// The source folder is a Hugging Face cache snapshot `models--ORG--NAME/snapshots/COMMIT`.
    HubCache,
    /// None of those: the source is a local folder, named by its folder name in the card's text only (the Hub
    /// would read a `base_model: NAME` as a repo id).
    FolderName,
}

impl BaseModel {
    /// The Hub repo id the card's `base_model` key holds: `None` for a local folder, whose name is no repo id.
    pub fn repo_id(&self) -> Option<&str> {
        (self.from != BaseModelFrom::FolderName).then_some(self.id.as_str())
    }
}

impl BaseModelFrom {
    pub fn describe(self) -> &'static str {
        match self {
            BaseModelFrom::Flag => "--base-model",
            BaseModelFrom::ConfigName => "config.json `_name_or_path`",
            BaseModelFrom::HubCache => "the source's Hugging Face cache folder",
            BaseModelFrom::FolderName => "a local folder: no base_model",
        }
    }
}

/// Whether `text` is a Hub repo id `ORG/NAME` (no revision).
pub fn is_repo_id(text: &str) -> bool {
    RepoId::parse(text).is_ok_and(|id| id.revision.is_none())
}

/// The card's base model: `--base-model`, else `_name_or_path` when it is a repo id, else the `ORG/NAME` of a
/// source in the Hugging Face cache, else the source folder's name (`manifest.source`), which the card shows but
/// does not give as `base_model` ([`BaseModel::repo_id`]).
pub fn base_model(manifest: &Manifest, config: Option<&Value>) -> BaseModel {
    if let Some(id) = manifest.card.as_ref().and_then(|card| card.base_model.clone()) {
        return BaseModel { id, from: BaseModelFrom::Flag };
    }
    let named = config.and_then(|config| {
        [config, composite::text_config(config)]
            .into_iter()
            .filter_map(|c| c.get("_name_or_path").and_then(Value::as_str))
            .find(|name| is_repo_id(name))
    });
    if let Some(id) = named {
        return BaseModel { id: id.to_string(), from: BaseModelFrom::ConfigName };
    }
    if let Some(id) = hub_repo(Path::new(&manifest.source)) {
        return BaseModel { id, from: BaseModelFrom::HubCache };
    }
    BaseModel { id: folder_name(Path::new(&manifest.source)), from: BaseModelFrom::FolderName }
}

/// `ORG/NAME` of a path inside a Hugging Face cache snapshot (`…/models--ORG--NAME/snapshots/COMMIT/…`).
pub fn hub_repo(path: &Path) -> Option<String> {
    let parts: Vec<String> = path.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    parts.windows(3).find_map(|w| {
        let (org, name) = w[0].strip_prefix("models--")?.split_once("--")?;
        (w[1] == "snapshots" && !w[2].is_empty()).then(|| format!("{org}/{name}")).filter(|id| is_repo_id(id))
    })
}

/// The last named component of `path` (`unknown` when there is none).
fn folder_name(path: &Path) -> String {
    path.components()
        .rev()
        .find_map(|c| match c {
            Component::Normal(name) => Some(name.to_string_lossy().into_owned()),
            _ => None,
        })
        .unwrap_or_else(|| "unknown".into())
}

/// How a card names a model another report mentions: its repo id in the cache, else its folder's name.
pub fn model_name(path: &str) -> String {
    hub_repo(Path::new(path)).unwrap_or_else(|| folder_name(Path::new(path)))
}

/// The output schemes of the manifest's tensors, in a fixed order, each with its tensor count.
pub fn schemes(manifest: &Manifest) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for tensor in &manifest.tensors {
        *counts.entry(tensor.scheme.as_str()).or_insert(0) += 1;
    }
    counts
}

/// The 4-bit (and FP8) schemes in the order a card names them, with their label.
const SCHEME_LABELS: [(&str, &str); 6] = [
    ("int4", "INT4 W4A16"),
    ("w4a8-fp8", "W4A8-FP8"),
    ("nvfp4", "NVFP4"),
    ("nvfp4-w4a4", "NVFP4 W4A4"),
    ("mxfp4", "MXFP4"),
    ("fp8-block", "FP8 block"),
];

/// The labels of the quantized schemes present (`INT4 W4A16`, `NVFP4`, …).
pub fn scheme_labels(manifest: &Manifest) -> Vec<&'static str> {
    let present = schemes(manifest);
    SCHEME_LABELS.iter().filter(|(scheme, _)| present.contains_key(scheme)).map(|(_, label)| *label).collect()
}

/// The Hub tags: `compressed-tensors`, `quantized`, one or two per scheme present, `squeeze`.
pub fn tags(manifest: &Manifest) -> Vec<String> {
    let present = schemes(manifest);
    let mut tags: Vec<&str> = vec!["compressed-tensors", "quantized"];
    for (scheme, scheme_tags) in [
        ("int4", &["int4", "w4a16"][..]),
        ("w4a8-fp8", &["int4", "w4a8"][..]),
        ("nvfp4", &["nvfp4", "fp4"][..]),
        ("nvfp4-w4a4", &["nvfp4", "fp4", "w4a4"][..]),
        ("mxfp4", &["mxfp4", "fp4"][..]),
        ("fp8-block", &["fp8"][..]),
    ] {
        if present.contains_key(scheme) {
            for tag in scheme_tags {
                if !tags.contains(tag) {
                    tags.push(tag);
                }
            }
        }
    }
    tags.push("squeeze");
    tags.into_iter().map(String::from).collect()
}

/// `image-text-to-text` for a vision-language wrapper (its vision tower is carried), else `text-generation`.
pub fn pipeline_tag(config: Option<&Value>) -> &'static str {
    match config.and_then(composite::wrapper) {
        Some(_) => "image-text-to-text",
        None => "text-generation",
    }
}

/// The tensor-parallel size of the serve commands: `--tp` as recorded, else `lint::default_tp` of the text config.
pub fn tp(manifest: &Manifest, config: Option<&Value>) -> (usize, bool) {
    match manifest.card.as_ref().and_then(|card| card.tp) {
        Some(tp) => (tp, true),
        None => (crate::engines::lint::default_tp(config.map(composite::text_config).unwrap_or(&Value::Null)), false),
    }
}

/// Whether `quantization_config.kv_cache_scheme` declares FP8 KV-cache scales (`calibrate-kv` wrote them).
pub fn has_kv_scales(config: Option<&Value>) -> bool {
    config
        .and_then(composite::quantization_config)
        .and_then(|q| q.get("kv_cache_scheme"))
        .is_some_and(|scheme| !scheme.is_null())
}

/// Whether the model ships custom code (`auto_map`), which both engines load only with `--trust-remote-code`.
pub fn needs_remote_code(config: Option<&Value>) -> bool {
    config.is_some_and(|config| config.get("auto_map").is_some_and(|map| !map.is_null()))
}

/// The top-level `key: value` lines of a README's YAML front matter (the block between a first line `---` and
/// the next `---`), values as written; nested and list entries are skipped.
pub fn front_matter(text: &str) -> Vec<(String, String)> {
    let mut lines = text.lines();
    if lines.next().map(str::trim_end) != Some("---") {
        return Vec::new();
    }
    let mut entries = Vec::new();
    for line in lines {
        if line.trim_end() == "---" {
            return entries;
        }
        if line.starts_with([' ', '\t', '-', '#']) {
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            let value = value.trim();
            if !key.is_empty() && !value.is_empty() {
                entries.push((key.trim().to_string(), value.to_string()));
            }
        }
    }
    Vec::new() // never closed: not front matter
}

/// The license lines of the source's card (`license`, `license_name`, `license_link`), as written there.
pub fn license(source_readme: Option<&str>) -> Vec<(String, String)> {
    source_readme
        .map(front_matter)
        .unwrap_or_default()
        .into_iter()
        .filter(|(key, _)| matches!(key.as_str(), "license" | "license_name" | "license_link"))
        .collect()
}

/// A YAML scalar: plain when it is safe to write so, else a double-quoted (JSON) string.
pub fn yaml_scalar(text: &str) -> String {
    let plain = !text.is_empty()
        && text.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'));
    if plain {
        text.to_string()
    } else {
        serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_cache_paths_name_their_repo() {
        let path = Path::new("/c/hub/models--moonshotai--Kimi-K2-Instruct/snapshots/abc123");
        assert_eq!(hub_repo(path).as_deref(), Some("moonshotai/Kimi-K2-Instruct"));
        assert_eq!(model_name("/c/hub/models--zai-org--GLM-5/snapshots/abc/"), "zai-org/GLM-5");
        assert_eq!(hub_repo(Path::new("/data/Kimi-K2-Instruct")), None);
        assert_eq!(model_name("/data/Kimi-K2-Instruct/"), "Kimi-K2-Instruct");
        assert_eq!(model_name("./fp8"), "fp8");
    }

    #[test]
    fn only_repo_ids_count_as_names() {
        assert!(is_repo_id("moonshotai/Kimi-K2-Instruct"));
        assert!(!is_repo_id("/data/models/kimi"));
        assert!(!is_repo_id("kimi"));
        assert!(!is_repo_id("org/name@main"));
    }

    #[test]
    fn front_matter_reads_top_level_scalars_only() {
        let text = "---\nlicense: other\nlicense_name: modified-mit\ntags:\n- a\nbase_model:\n  - x/y\n---\n# Title\nlicense: no\n";
        assert_eq!(
            front_matter(text),
            vec![("license".into(), "other".into()), ("license_name".into(), "modified-mit".into())]
        );
        assert_eq!(license(Some(text)).len(), 2);
        assert!(front_matter("# no front matter\n---\n").is_empty());
        assert!(front_matter("---\nlicense: mit\n").is_empty(), "an unclosed block is not front matter");
    }

    #[test]
    fn yaml_scalars_are_quoted_unless_plain() {
        assert_eq!(yaml_scalar("moonshotai/Kimi-K2"), "moonshotai/Kimi-K2");
        assert_eq!(yaml_scalar("my model: v2"), "\"my model: v2\"");
        assert_eq!(yaml_scalar("-x"), "\"-x\"");
    }
}
