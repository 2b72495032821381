//! The card record of a `quantize` run ([`CardRecord::of_run`]) and the calibration data it names
//! ([`CalibrationData::of`]); the record's types are the manifest's ([`crate::io::card_record`]).

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::chunks::EvalInput;
use crate::hex::hex;
use crate::io::card_record::{CalibrationData, CardRecord};
use crate::io::manifest::Manifest;
use crate::io::writer::sha256_file;
use crate::io::IoError;
use crate::plan::calibration::{CalibrationOptions, CalibrationSet, Method};

impl CardRecord {
    /// The record of a `quantize` run: its `--base-model`, `--tp` and calibration data (the options and the set
    /// they read); the accuracy results of `previous`, the manifest of the same plan a `--resume` continues (the
    /// weights are the same).
    pub fn of_run(
        base_model: Option<String>,
        tp: Option<usize>,
        calibration: Option<(&CalibrationOptions, &CalibrationSet)>,
        previous: Option<&Manifest>,
    ) -> Result<Option<Self>, IoError> {
        let calibration = match calibration {
            Some((options, set)) => Some(CalibrationData::of(options, set)?),
            None => None,
        };
        let evals = previous.and_then(|previous| previous.card.as_ref()).map(|card| card.evals.clone());
        Ok(Self { base_model, tp, calibration, evals: evals.unwrap_or_default() }.into_option())
    }
}

impl CalibrationData {
    /// The record of a calibration `options` read as `set`.
    pub fn of(options: &CalibrationOptions, set: &CalibrationSet) -> Result<Self, IoError> {
        let (path, seq_len): (&Path, Option<usize>) = match &options.input {
            EvalInput::Text { path, ctx, .. } => (path, Some(*ctx)),
            EvalInput::Tokens { path, .. } => (path, None),
        };
        let (_, sha256) = sha256_file(path)?;
        let mut hasher = Sha256::new();
        for sequence in &set.sequences {
            hasher.update((sequence.len() as u64).to_le_bytes());
            for id in sequence {
                hasher.update(id.to_le_bytes());
            }
        }
        Ok(Self {
            method: match options.method {
                Method::Rtn => "rtn",
                Method::Imatrix => "imatrix",
                Method::Gptq => "gptq",
            }
            .to_string(),
            file: path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default(),
            sha256,
            tokens_sha256: hex(&hasher.finalize()),
            sequences: set.sequences.len(),
            tokens: set.sequences.iter().map(|sequence| sequence.len() as u64).sum(),
            seq_len,
            sequential: (options.method == Method::Gptq).then_some(options.sequential),
        })
    }
}
