//! What the model card is rendered from besides the rest of `squeeze-manifest.json` (recipe, tensors, version):
//! kept in the manifest's `card` object so that `quantize`, `merge` and `squeeze card` render the same card from
//! the folder alone. Absent (`None`) when there is nothing to record, so that a plain `quantize` writes the
//! manifest it always wrote.
//!
//! The types live here beside the manifest that holds them; a `quantize` run's record is made in
//! [`crate::card::record`] (from the run's options and calibration set), the rendering is [`crate::card`]'s.

use serde::{Deserialize, Serialize};

use crate::parity::Gates;

/// The manifest's `card` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CardRecord {
    /// `--base-model ORG/NAME`: the card's `base_model` (else guessed: [`crate::card::facts::base_model`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_model: Option<String>,
    /// `--tp N`: the tensor-parallel size of the card's serve commands (else `lint::default_tp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<usize>,
    /// `--method imatrix|gptq`: the calibration data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationData>,
    /// `squeeze card --eval REPORT`: the accuracy results shown (kept by `squeeze card` without `--eval` and by a
    /// `quantize --resume` of the same plan; a new conversion starts without any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evals: Vec<EvalRecord>,
}

impl CardRecord {
    /// `None` when nothing is recorded (the manifest then has no `card` key).
    pub fn into_option(self) -> Option<Self> {
        (self != Self::default()).then_some(self)
    }

    /// `--base-model X --tp N` as a run recorded them, for messages.
    pub fn flags(card: Option<&Self>) -> String {
        let card = card.cloned().unwrap_or_default();
        format!(
            "--base-model {} --tp {}",
            card.base_model.as_deref().unwrap_or("(not given)"),
            card.tp.map_or("(not given)".to_string(), |tp| tp.to_string())
        )
    }
}

/// The calibration data of an imatrix or GPTQ run, as the card names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationData {
    /// `imatrix` or `gptq`.
    pub method: String,
    /// The `--calibration` file's name (not its path).
    pub file: String,
    /// SHA-256 of the file's bytes (what `sha256sum FILE` prints).
    pub sha256: String,
    /// SHA-256 of the token ids the pass read (per sequence its length as u64 LE, then each id as u32 LE).
    pub tokens_sha256: String,
    pub sequences: usize,
    pub tokens: u64,
    /// `--seq-len` of a text file (`None`: a safetensors token file, used as given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<usize>,
    /// GPTQ: whether layer L + 1 was calibrated on layer L's quantized output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential: Option<bool>,
}

/// One `squeeze eval` report, summarized as the card shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// The report's file name as given to `squeeze card --eval`.
    pub report: String,
    #[serde(flatten)]
    pub result: EvalResult,
}

/// The report kinds `squeeze eval --json` (and `merge-eval --json`) print.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum EvalResult {
    /// `eval --reference REF --candidate THIS`.
    Parity {
        /// REF's name ([`crate::card::facts::model_name`]).
        reference: String,
        chunks: usize,
        ctx: usize,
        /// Prompt tokens per chunk (the scored positions follow).
        prompt: usize,
        /// What the FP8-KV modes cached with: `checkpoint`, `unit` or `dynamic-tiles`, and for which engine.
        kv_scales: String,
        engine: String,
        modes: Vec<ParityMode>,
        gates: Gates,
        /// The failed gates' names (empty: all passed).
        failed: Vec<String>,
    },
    /// `eval --reference REF --candidate THIS --task FILE`: benchmark items paired per item.
    Tasks {
        /// REF's name ([`crate::card::facts::model_name`]).
        reference: String,
        /// The task file's name.
        task_file: String,
        num_fewshot: usize,
        rows: Vec<TaskRow>,
        /// The failed gates, in words (empty: all passed or none given).
        failed: Vec<String>,
    },
    /// `eval MODEL`: perplexity of this folder or of another model (the source, for comparison).
    Perplexity {
        /// The model's name; `None` for this folder.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        chunks: usize,
        ctx: usize,
        tokens: usize,
        ppl: f64,
        ppl_stderr: f64,
        mean_nll: f64,
        mean_nll_stderr: f64,
    },
}

/// One task's metric on the reference and on this folder (`eval --reference REF --candidate THIS --task FILE`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRow {
    pub task: String,
    pub metric: String,
    pub items: usize,
    /// Accuracy as a share (0 … 1) and its standard error.
    pub reference: f64,
    pub reference_stderr: f64,
    pub candidate: f64,
    pub candidate_stderr: f64,
    pub right_to_wrong: usize,
    pub wrong_to_right: usize,
    pub agreement: f64,
    pub mcnemar_p: f64,
}

/// One parity mode's statistics against the reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParityMode {
    pub mode: String,
    pub tokens: usize,
    pub mean_kld: f64,
    pub mean_kld_stderr: f64,
    /// Same top-1 token, percent.
    pub same_top: f64,
    pub same_top_stderr: f64,
    pub ppl: f64,
    pub ppl_stderr: f64,
    pub ppl_ratio: f64,
    pub ppl_ratio_stderr: f64,
}
