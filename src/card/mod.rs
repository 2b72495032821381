//! The model card every output folder carries: `README.md` with the Hugging Face front matter of a quantized
//! release (`base_model`, `base_model_relation: quantized`, `library_name`, `pipeline_tag`, `tags`), what was
//! quantized and how (recipe, method, calibration data digest, squeeze version), the `vllm serve` / SGLang command
//! lines, and the accuracy results recorded for the folder. The source's own README travels as
//! `README.source.md`.
//!
//! One home for rendering ([`render`]), from the folder alone: `squeeze-manifest.json` (with its `card` record:
//! [`crate::io::card_record`], made for a run by [`record`]), `config.json` and `README.source.md`. `quantize`
//! and `merge` write it last before the manifest; `squeeze card DIR` rewrites it (adding `eval --json` reports,
//! `--base-model`, `--tp`, or after `calibrate-kv`).
//!
//! Front matter conventions, as read: the Hub's model-card docs (`base_model`, `base_model_relation: quantized`
//! for a quantization of its base); quantized releases such as RedHatAI's compressed-tensors cards tag
//! `compressed-tensors`, `quantized` and the scheme (`int4`, `w4a16`, …). `library_name: transformers`:
//! huggingface.js `local-apps.ts` shows the vLLM and SGLang "Use this model" snippets for a model tagged
//! `transformers` with pipeline `text-generation` or `image-text-to-text` (its quant-method checks know AWQ, GPTQ,
//! AQLM and Marlin, not compressed-tensors), and `vllm` is a local app there, not a model library; transformers
//! also loads compressed-tensors checkpoints itself.

pub mod evals;
pub mod facts;
pub mod record;
pub mod render;

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::io::checkpoint::{read_json, CONFIG_FILE, MANIFEST_FILE};
use crate::io::lock::FolderLock;
use crate::io::manifest::Manifest;
use crate::io::{atomic, IoError};

/// The card.
pub const README: &str = "README.md";
/// The source's own README in an output folder.
pub const SOURCE_README: &str = "README.source.md";
/// The start of the line that marks a README as squeeze's card (what may be replaced without asking).
pub const MARKER: &str = "<!-- squeeze model card";

/// The name a companion file of the source gets in the output folder: `README.md` becomes `README.source.md`;
/// a `README.source.md` of a source that also has a `README.md` (itself a squeeze output) is not carried.
pub fn companion_target(file: &Path, companions: &[PathBuf]) -> Option<String> {
    let name = file.file_name()?.to_string_lossy().into_owned();
    let has_readme = || companions.iter().any(|other| other.file_name().is_some_and(|n| n == README));
    match name.as_str() {
        README => Some(SOURCE_README.to_string()),
        SOURCE_README if has_readme() => None,
        _ => Some(name),
    }
}

/// Whether `bytes` are a squeeze card.
pub fn is_card(bytes: &[u8]) -> bool {
    String::from_utf8_lossy(bytes).lines().any(|line| line.starts_with(MARKER))
}

/// Whether `--force` may remove this file of an output folder before a new run: `README.source.md` (the new run
/// copies its source's) and a squeeze card.
pub fn removable_by_force(path: &Path) -> bool {
    match path.file_name().and_then(|n| n.to_str()) {
        Some(SOURCE_README) => true,
        Some(README) => fs::read(path).is_ok_and(|bytes| is_card(&bytes)),
        _ => false,
    }
}

/// Refuses, before a conversion or merge writes anything, a `README.md` in `out` that the card would replace
/// although squeeze did not write it: neither a squeeze card nor the bytes of `source_readme` (what an older
/// squeeze copied there).
pub fn check_readme_slot(out: &Path, source_readme: Option<&Path>) -> Result<(), IoError> {
    let path = out.join(README);
    let Ok(bytes) = fs::read(&path) else { return Ok(()) };
    if is_card(&bytes) || source_readme.and_then(|source| fs::read(source).ok()).is_some_and(|source| source == bytes) {
        return Ok(());
    }
    Err(IoError::folder(
        &path,
        "is not a squeeze model card and not the source's README, and squeeze writes its card there (the source's \
         README goes to README.source.md): move it away (e.g. to README.custom.md) and run again",
    ))
}

/// Renders the card of the folder `out` from `manifest` and `config` (and `out/README.source.md`) and writes it
/// atomically to `out/README.md`.
pub fn write(out: &Path, manifest: &Manifest, config: Option<&Value>) -> Result<(), IoError> {
    let source_path = out.join(SOURCE_README);
    let source = match fs::read(&source_path) {
        Ok(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(IoError::file(&source_path, error)),
    };
    let text = render::render(&render::Inputs { manifest, config, source_readme: source.as_deref() });
    atomic::write_file(&out.join(README), text.as_bytes())
}

/// What `squeeze card DIR` changes.
#[derive(Debug, Clone, Default)]
pub struct CardOptions {
    /// `--eval REPORT…`: replace the recorded accuracy results with these reports'.
    pub evals: Vec<PathBuf>,
    /// `--no-eval`: drop the recorded results.
    pub no_eval: bool,
    pub base_model: Option<String>,
    pub tp: Option<usize>,
}

/// What `squeeze card DIR` did.
#[derive(Debug, Clone, Serialize)]
pub struct CardReport {
    pub readme: PathBuf,
    /// The card's `base_model` (`None`: the source was a local folder, and the card has no `base_model`).
    pub base_model: Option<String>,
    pub base_model_from: facts::BaseModelFrom,
    pub pipeline_tag: &'static str,
    pub tags: Vec<String>,
    /// The accuracy results the card shows (report file names).
    pub evals: Vec<String>,
    /// The manifest's `card` record was changed (`--eval`, `--no-eval`, `--base-model`, `--tp`).
    pub manifest_updated: bool,
    /// A README.md that was not a squeeze card (an older squeeze copied the source's there) was moved to
    /// README.source.md.
    pub moved_source_readme: bool,
}

/// `squeeze card DIR`: records the options in the manifest's `card` object and rewrites `DIR/README.md`.
pub fn refresh(dir: &Path, options: &CardOptions) -> Result<CardReport, IoError> {
    if crate::io::hub::in_snapshot(dir) {
        return Err(IoError::folder(
            dir,
            "is a snapshot in the Hugging Face cache: its files are links into blobs other snapshots share, so \
             squeeze does not write into it; copy the folder and run `squeeze card` on the copy",
        ));
    }
    let not_squeeze = || {
        IoError::folder(
            dir,
            format!(
                "has no {MANIFEST_FILE}: the card describes a squeeze conversion, and this folder was not written by \
                 `squeeze quantize` (or `merge`)"
            ),
        )
    };
    if !dir.join(MANIFEST_FILE).is_file() {
        return Err(not_squeeze());
    }
    // Held from the first read to the last write: no conversion changes the folder in between.
    let _lock = FolderLock::acquire(dir, "card")?;
    let mut manifest = Manifest::read(dir)?.ok_or_else(not_squeeze)?;
    if !manifest.complete {
        return Err(IoError::folder(
            dir.join(MANIFEST_FILE),
            "records an unfinished conversion; finish it with `squeeze quantize SOURCE DIR --resume` first",
        ));
    }
    let config_path = dir.join(CONFIG_FILE);
    let config = if config_path.exists() { Some(read_json(&config_path)?) } else { None };
    let mut card = manifest.card.clone().unwrap_or_default();
    if let Some(base_model) = &options.base_model {
        card.base_model = Some(base_model.clone());
    }
    if let Some(tp) = options.tp {
        card.tp = Some(tp);
    }
    if options.no_eval {
        card.evals.clear();
    }
    if !options.evals.is_empty() {
        card.evals = options.evals.iter().map(|path| evals::read(path, dir)).collect::<Result<_, _>>()?;
    }
    let card = card.into_option();
    let manifest_updated = card != manifest.card;

    let readme = dir.join(README);
    let source_readme = dir.join(SOURCE_README);
    let mut moved_source_readme = false;
    if let Ok(bytes) = fs::read(&readme) {
        if !is_card(&bytes) {
            match fs::read(&source_readme) {
                Ok(source) if source == bytes => {}
                Ok(_) => check_readme_slot(dir, Some(&source_readme))?,
                Err(_) => {
                    fs::rename(&readme, &source_readme).map_err(|e| IoError::file(&readme, e))?;
                    moved_source_readme = true;
                }
            }
        }
    }
    if manifest_updated {
        manifest.card = card;
        manifest.write(dir)?;
    }
    write(dir, &manifest, config.as_ref())?;
    let base = facts::base_model(&manifest, config.as_ref());
    Ok(CardReport {
        readme,
        base_model: base.repo_id().map(str::to_string),
        base_model_from: base.from,
        pipeline_tag: facts::pipeline_tag(config.as_ref()),
        tags: facts::tags(&manifest),
        evals: manifest.card.iter().flat_map(|card| card.evals.iter().map(|e| e.report.clone())).collect(),
        manifest_updated,
        moved_source_readme,
    })
}
