//! The demo's one call into each job, with the demo's fixed settings (sizes that run in seconds on a laptop CPU).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;

use crate::calib::{calibrate, write_scales, CalibOptions, CalibReport, Strategy};
use crate::chunks::EvalInput;
use crate::convert::options::ConvertError;
use crate::convert::{quantize, QuantizeOptions, QuantizeReport};
use crate::demo_model::{write_checkpoint, Unpacked, DEMO_TASK};
use crate::engines::Engine;
use crate::eval::parity::{KvScaleChoice, ParityOptions, ParityReport};
use crate::eval::parity_pass::evaluate_parity;
use crate::eval::tasks::file as task_file;
use crate::eval::tasks::{run_paired, PairedOptions, PairedReport};
use crate::eval::{evaluate, EvalOptions, EvalReport};
use crate::inspect::{inspect, InspectReport};
use crate::parity::{Gates, Mode};
use crate::plan::prepare::PrepareError;
use crate::progress::Silent;
use crate::report::Report;
use crate::runtime::kv_cache::KvDtype;
use crate::runtime::Cpu;
use crate::serve::sampling::Sampling;
use crate::serve::{serve_test, ServeOptions, ServeReport};
use crate::synth::{synth, SynthArch, SynthOptions, SynthReport, SynthSize};
use crate::verify::{verify, VerifyOptions, VerifyReport, DEFAULT_MAX_INT4_ERROR};

use super::super::eval::{DEFAULT_MAX_MEAN_KLD, DEFAULT_MAX_PPL_RATIO, DEFAULT_MIN_SAME_TOP};

/// Bytes (= tokens: every demo model has a byte-level tokenizer) per eval, parity and calibration chunk.
pub const CTX: usize = 256;
/// Chunks of held-out text for eval and parity: 8 × 256 bytes, 8 × 127 positions scored in parity.
pub const EVAL_CHUNKS: usize = 8;
/// Calibration chunks (the sonnets hold 7 of 256 bytes).
pub const CALIBRATION_SAMPLES: usize = 8;
/// Bytes generated per serve-test prompt.
pub const MAX_NEW_TOKENS: usize = 40;
/// Sampling temperature and nucleus of serve-test: greedy decoding of a model this small repeats " the" forever.
pub const TEMPERATURE: f32 = 0.5;
/// Nucleus mass of serve-test sampling.
pub const TOP_P: f32 = 0.9;
/// Serve-test prompts: a line of sonnet 18, one of Romeo and Juliet, one of the held-out Tempest.
pub const PROMPTS: [&str; 3] = ["Shall I compare thee", "ROMEO.\nBut soft, what light", "PROSPERO.\nOur revels now"];
/// The gates `squeeze eval --reference --candidate` applies by default.
pub const GATES: Gates = Gates {
    max_mean_kld: DEFAULT_MAX_MEAN_KLD,
    min_same_top: DEFAULT_MIN_SAME_TOP,
    max_ppl_ratio: DEFAULT_MAX_PPL_RATIO,
};
/// The preset whose size and memory budget the last stage reports.
pub const REPORT_PRESET: &str = "glm-5";

/// The weights the demo runs on.
#[derive(Debug, Clone, Copy)]
pub enum Weights {
    /// The embedded tiny Shakespeare model (Kimi K2 architecture).
    Trained,
    /// A `squeeze synth` model of this architecture.
    Random(SynthArch),
}

/// How the FP8 source folder was made.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "weights", rename_all = "lowercase")]
pub enum SourceReport {
    Trained(Unpacked),
    Random(SynthReport),
}

/// Writes the FP8 source into `dir`: the embedded trained model or a synthetic random one.
pub fn source(weights: Weights, dir: &Path) -> anyhow::Result<SourceReport> {
    Ok(match weights {
        Weights::Trained => SourceReport::Trained(write_checkpoint(dir)?),
        Weights::Random(arch) => SourceReport::Random(synth(&SynthOptions {
            arch,
            size: SynthSize::default(),
            shards: 2,
            seed: 0,
            out: dir.to_path_buf(),
            force: true,
        })?),
    })
}

/// What the quantize stage did.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum Quantized {
    /// The source was FP8: `squeeze quantize`'s report.
    Converted(Box<QuantizeReport>),
    /// The source ships INT4 (Kimi K2.6): quantize refused it, and the deployment folder is a copy of the source,
    /// into which calibrate-kv writes the FP8 KV scales (the source stays the BF16-KV reference).
    Shipped { already_int4: ShippedInt4 },
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ShippedInt4 {
    /// compressed-tensors `pack-quantized` modules of the source.
    pub modules: usize,
    pub group_size: Option<usize>,
    /// Files and bytes copied into the deployment folder.
    pub files: usize,
    pub bytes: u64,
}

impl Quantized {
    /// Whether the source already shipped INT4 (and the candidate differs from it only in its KV cache).
    pub fn shipped(&self) -> bool {
        matches!(self, Quantized::Shipped { .. })
    }
}

/// `squeeze quantize SOURCE OUTPUT` with the architecture's default recipe, on the CPU; a source that already ships
/// INT4 is copied to OUTPUT instead.
pub fn quantize_source(source: &Path, output: &Path) -> anyhow::Result<Quantized> {
    let options = QuantizeOptions {
        input: source.to_path_buf(),
        output: output.to_path_buf(),
        recipe: None,
        group_size: None,
        scale_rule: None,
        max_shard_bytes: 5_000_000,
        resume: false,
        force: true,
        dry_run: false,
        device: crate::runtime::device::DeviceChoice::Cpu,
        allow_nonfinite: false,
        allow_inexact_cast: false,
        engine: crate::engines::EngineChoice::All,
        tp: None,
        calibration: None,
        part: None,
        base_model: None,
    };
    match quantize(&options, &Silent) {
        Ok(report) => Ok(Quantized::Converted(Box::new(report))),
        Err(ConvertError::Prepare(PrepareError::AlreadyInt4 { modules, group_size, .. })) => {
            let (files, bytes) = copy_files(source, output)?;
            Ok(Quantized::Shipped { already_int4: ShippedInt4 { modules, group_size, files, bytes } })
        }
        Err(error) => Err(error.into()),
    }
}

/// Copies the files of folder `from` (a synthetic checkpoint: no subfolders) into a new folder `to`.
fn copy_files(from: &Path, to: &Path) -> anyhow::Result<(usize, u64)> {
    if to.exists() {
        std::fs::remove_dir_all(to).with_context(|| format!("removing {}", to.display()))?;
    }
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    let (mut files, mut bytes) = (0, 0);
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let (path, target) = (entry.path(), to.join(entry.file_name()));
        bytes += std::fs::copy(&path, &target)
            .with_context(|| format!("copying {} to {}", path.display(), target.display()))?;
        files += 1;
    }
    Ok((files, bytes))
}

/// `squeeze verify OUTPUT [--source SOURCE]` (without a source: the conventions and every engine's rules).
pub fn verify_output(output: &Path, source: Option<&Path>) -> anyhow::Result<VerifyReport> {
    Ok(verify(&VerifyOptions {
        output: output.to_path_buf(),
        source: source.map(Path::to_path_buf),
        max_int4_error: DEFAULT_MAX_INT4_ERROR,
        worst: 1,
        engine: crate::engines::EngineChoice::All,
        tp: None,
    })?)
}

/// `squeeze inspect DIR`.
pub fn inspect_folder(dir: &Path) -> anyhow::Result<InspectReport> {
    Ok(inspect(dir)?)
}

fn text_input(path: &Path) -> EvalInput {
    EvalInput::Text { path: path.to_path_buf(), ctx: CTX, flag: "--data", ctx_flag: "--ctx" }
}

/// `squeeze eval MODEL --data TEXT --ctx 256 --chunks 8`.
pub fn eval_model(model: &Path, text: &Path) -> anyhow::Result<EvalReport> {
    let options = EvalOptions {
        model: model.to_path_buf(),
        input: text_input(text),
        chunks: Some(EVAL_CHUNKS),
        save_logits: None,
        part: None,
        save_stats: None,
        mtp: false,
        mtp_depth: 1,
        allow_long_context: false,
    };
    evaluate(&options, &Cpu::default(), &Silent).with_context(|| format!("evaluating {}", model.display()))
}

/// `squeeze calibrate-kv MODEL --data TEXT --seq-len 256 --samples 8`: the scales are written into MODEL.
pub fn calibrate_kv(model: &Path, text: &Path) -> anyhow::Result<CalibReport> {
    let options = CalibOptions {
        model: model.to_path_buf(),
        input: text_input(text),
        samples: CALIBRATION_SAMPLES,
        percentile: None,
        strategy: Strategy::Tensor,
        engines: Engine::ALL.to_vec(),
        part: None,
        save_stats: None,
        allow_long_context: false,
    };
    let mut report = calibrate(&options, &Cpu::default(), &Silent)
        .with_context(|| format!("calibrating KV scales of {}", model.display()))?;
    let written = write_scales(&report, model, None, None)?;
    report.written = written.files.iter().map(|p| p.display().to_string()).collect();
    Ok(report)
}

/// `squeeze eval --reference REF --candidate CAND --data TEXT --ctx 256 --chunks 8`: all four modes, default gates.
pub fn parity(reference: &Path, candidate: &Path, text: &Path) -> anyhow::Result<ParityReport> {
    let options = ParityOptions {
        reference: reference.to_path_buf(),
        candidate: candidate.to_path_buf(),
        input: text_input(text),
        chunks: Some(EVAL_CHUNKS),
        modes: Mode::ALL.to_vec(),
        gates: GATES,
        // The deployment that exists: what vLLM really caches with (scale 1.0 for this MLA model).
        kv_scales: KvScaleChoice::Engine,
        engine: Engine::Vllm,
        part: None,
        save_stats: None,
        max_mtp_drop: None,
        mtp_depth: 1,
        allow_long_context: false,
    };
    evaluate_parity(&options, &Cpu::default(), &Silent)
        .with_context(|| format!("evaluating {} against {}", candidate.display(), reference.display()))
}

/// `squeeze eval --reference REF --candidate CAND --task FILE` on the task [`DEMO_TASK`] of the file: both models'
/// accuracies, the items that flipped and McNemar's p (no gate: the demo shows them).
pub fn tasks(reference: &Path, candidate: &Path, file: &Path) -> anyhow::Result<PairedReport> {
    let mut tasks = task_file::read(file).map_err(anyhow::Error::msg)?;
    tasks.tasks.retain(|task| task.name == DEMO_TASK);
    run_paired((reference, candidate), &tasks, PairedOptions::default(), &Cpu::default(), &Silent)
        .with_context(|| format!("--task {}", file.display()))
}

/// `squeeze serve-test MODEL [--prefill-model PREFILL] --kv-dtype KV` on [`PROMPTS`], seed 0, pages verified.
pub fn serve(model: &Path, prefill: Option<&Path>, kv_dtype: KvDtype) -> anyhow::Result<ServeReport> {
    let options = ServeOptions {
        model: model.to_path_buf(),
        prefill_model: prefill.map(Path::to_path_buf),
        prompts: PROMPTS.iter().map(|p| p.to_string()).collect(),
        max_new_tokens: MAX_NEW_TOKENS,
        concurrency: PROMPTS.len(),
        page_size: 16,
        kv_pages: None,
        kv_dtype,
        sampling: Sampling { temperature: TEMPERATURE, top_p: TOP_P },
        seed: 0,
        fault: None,
        verify: true,
        speculative: None,
        allow_long_context: false,
    };
    serve_test(&Cpu::default(), &options, &Silent).with_context(|| format!("serve-test on {}", model.display()))
}

/// `squeeze report` exactly as the subcommand's arguments parse (same defaults).
#[derive(Parser)]
struct ReportCommand {
    #[command(flatten)]
    args: super::super::report::Args,
}

/// `squeeze report glm-5` with the subcommand's defaults (8 × H200, context 8192).
pub fn report_preset() -> anyhow::Result<Report> {
    let command = ReportCommand::try_parse_from(["report", REPORT_PRESET])?;
    super::super::report::build(&command.args)
}

/// The folders of one demo run.
pub struct Folders {
    pub source: PathBuf,
    pub output: PathBuf,
    pub heldout: PathBuf,
    pub calibration: PathBuf,
    pub tasks: PathBuf,
}

impl Folders {
    pub fn under(base: &Path) -> Self {
        Self {
            source: base.join("fp8"),
            output: base.join("int4"),
            heldout: base.join("heldout.txt"),
            calibration: base.join("calibration.txt"),
            tasks: base.join("tempest-tasks.jsonl"),
        }
    }
}
