//! What `squeeze demo --json` prints: every stage's own report, with each stage's wall time.

use std::time::Instant;

use serde::Serialize;

use crate::calib::CalibReport;
use crate::eval::parity::ParityReport;
use crate::eval::tasks::PairedReport;
use crate::eval::EvalReport;
use crate::inspect::InspectReport;
use crate::report::Report;
use crate::serve::ServeReport;
use crate::verify::VerifyReport;

use super::stages::{Quantized, SourceReport};

/// The same text evaluated on both checkpoints.
#[derive(Debug, Clone, Serialize)]
pub struct EvalPair {
    /// What the text is.
    pub text: String,
    pub fp8: EvalReport,
    pub int4: EvalReport,
    /// `int4.ppl / fp8.ppl`.
    pub ppl_ratio: f64,
}

/// The same prompts decoded on both deployments.
#[derive(Debug, Clone, Serialize)]
pub struct ServePair {
    /// FP8 weights, BF16 KV.
    pub fp8: ServeReport,
    /// INT4 weights, FP8 KV with the calibrated scales, prompts prefilled on the FP8 model (the split deployment).
    pub int4: ServeReport,
}

/// One stage's wall time.
#[derive(Debug, Clone, Serialize)]
pub struct StageTime {
    pub stage: &'static str,
    pub seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// `trained` (the embedded tiny Shakespeare model) or `random` (a `squeeze synth` model).
    pub weights: &'static str,
    pub architecture: String,
    /// Where the stages wrote (removed at the end unless `--keep`).
    pub folder: String,
    pub kept: bool,
    pub source: SourceReport,
    /// `squeeze quantize`'s report, or `{"already_int4": …}` where the source ships INT4 and was copied.
    pub quantize: Quantized,
    pub verify: VerifyReport,
    pub inspect: InspectReport,
    pub eval: EvalPair,
    pub calibrate_kv: CalibReport,
    pub parity: ParityReport,
    /// Both models on one task of the held-out play, paired per item.
    pub tasks: PairedReport,
    pub serve_test: ServePair,
    pub report: Report,
    pub stage_seconds: Vec<StageTime>,
    pub seconds: f64,
    /// Verify passed, no integrity fault, and (on trained weights) every parity gate passed.
    pub passed: bool,
}

/// Times the stages in order.
pub struct Clock {
    started: Instant,
    pub stages: Vec<StageTime>,
}

impl Clock {
    pub fn start() -> Self {
        Self { started: Instant::now(), stages: Vec::new() }
    }

    /// Runs one stage and records its wall time.
    pub fn time<T>(&mut self, stage: &'static str, run: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        let started = Instant::now();
        let value = run()?;
        self.stages.push(StageTime { stage, seconds: started.elapsed().as_secs_f64() });
        Ok(value)
    }

    /// The wall time of the stage that ran last.
    pub fn last(&self) -> f64 {
        self.stages.last().map_or(0.0, |s| s.seconds)
    }

    pub fn total(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}
