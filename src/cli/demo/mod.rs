//! `squeeze demo`: every stage in order (model → quantize → verify → inspect → eval → calibrate-kv → parity →
//! tasks → serve-test → report) on the embedded trained tiny Shakespeare model, or on random weights with `--arch`.

mod render;
mod report;
mod stages;

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::demo_model::{heldout_dialogue, SONNETS, TASKS};
use crate::runtime::kv_cache::KvDtype;
use crate::synth::SynthArch;

use super::output::{print_json, Outcome};
use report::{Clock, DemoReport, EvalPair, ServePair};
use stages::{Folders, Weights};

#[derive(clap::Args)]
pub struct Args {
    /// Run on random weights of this architecture instead of the trained model.
    ///
    /// Run on random weights of this architecture instead of the trained model: kimi-k2, kimi-k2.6, glm5, glm5.2,
    /// glm45, kimi-linear or glm5.3-flash (the machinery only: gates fail and the decoded text is garbage, as
    /// expected of random weights). kimi-k2.6 ships INT4 already: quantize is skipped and the candidate is the same
    /// weights with an FP8 KV cache.
    #[arg(long)]
    pub arch: Option<SynthArch>,
    /// Keep the demo folders here instead of a temporary folder that is removed at the end.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Print one JSON object with every stage's report instead of the human lines.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let temporary = std::env::temp_dir().join(format!("squeeze-demo-{}", std::process::id()));
    let base = args.keep.clone().unwrap_or(temporary.clone());
    let result = stages_in(&args, &base);
    if args.keep.is_none() {
        let _ = std::fs::remove_dir_all(&temporary);
    }
    result
}

fn stages_in(args: &Args, base: &Path) -> anyhow::Result<Outcome> {
    let human = !args.json;
    let weights = args.arch.map_or(Weights::Trained, Weights::Random);
    let folders = Folders::under(base);
    let mut clock = Clock::start();
    if human {
        render::title(weights);
    }

    let source = clock.time("model", || stages::source(weights, &folders.source))?;
    if human {
        render::source(&source, weights, &folders.source, clock.last());
    }
    let quantized = clock.time("quantize", || stages::quantize_source(&folders.source, &folders.output))?;
    if human {
        render::quantize(&quantized, clock.last());
    }
    let sides = render::Sides::of(&quantized);
    // A copied INT4 source has no FP8 source to compare with: verify lints it as the engines load it.
    let compared = (!quantized.shipped()).then_some(folders.source.as_path());
    let verified = clock.time("verify", || stages::verify_output(&folders.output, compared))?;
    if human {
        render::verify(&verified, compared.is_some(), clock.last());
    }
    let inspected = clock.time("inspect", || stages::inspect_folder(&folders.output))?;
    if human {
        render::inspect(&inspected, sides, clock.last());
    }

    let text = heldout_dialogue(stages::EVAL_CHUNKS * stages::CTX);
    for (path, content) in [(&folders.heldout, text), (&folders.calibration, SONNETS), (&folders.tasks, TASKS)] {
        std::fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
    }
    let eval = clock.time("eval", || {
        let fp8 = stages::eval_model(&folders.source, &folders.heldout)?;
        let int4 = stages::eval_model(&folders.output, &folders.heldout)?;
        let ppl_ratio = int4.ppl / fp8.ppl;
        Ok(EvalPair { text: render::HELDOUT_TEXT.into(), fp8, int4, ppl_ratio })
    })?;
    if human {
        render::eval(&eval, weights, sides, clock.last());
    }
    let calibration = clock.time("calibrate-kv", || stages::calibrate_kv(&folders.output, &folders.calibration))?;
    if human {
        render::calibrate_kv(&calibration, sides, clock.last());
    }
    let parity = clock.time("parity", || stages::parity(&folders.source, &folders.output, &folders.heldout))?;
    if human {
        render::parity(&parity, weights, sides, clock.last());
    }
    let tasks = clock.time("tasks", || stages::tasks(&folders.source, &folders.output, &folders.tasks))?;
    if human {
        render::tasks(&tasks, sides, clock.last());
    }
    let served = clock.time("serve-test", || {
        let fp8 = stages::serve(&folders.source, None, KvDtype::Bf16)?;
        let int4 = stages::serve(&folders.output, Some(&folders.source), KvDtype::Fp8)?;
        Ok(ServePair { fp8, int4 })
    })?;
    if human {
        render::serve(&served, weights, sides, clock.last());
    }
    let budget = clock.time("report", stages::report_preset)?;
    if human {
        render::report(&budget, clock.last());
    }

    let random = matches!(weights, Weights::Random(_));
    let passed =
        verified.passed && served.fp8.passed() && served.int4.passed() && (random || parity.failures.is_empty());
    if human {
        render::closing(clock.total(), passed, weights, sides, args.keep.as_ref().map(|_| &folders));
    } else {
        let seconds = clock.total();
        print_json(&DemoReport {
            weights: if random { "random" } else { "trained" },
            architecture: inspected.architecture.clone().unwrap_or_default(),
            folder: base.display().to_string(),
            kept: args.keep.is_some(),
            source,
            quantize: quantized,
            verify: verified,
            inspect: inspected,
            eval,
            calibrate_kv: calibration,
            parity,
            tasks,
            serve_test: served,
            report: budget,
            stage_seconds: clock.stages,
            seconds,
            passed,
        })?;
    }
    Ok(if passed { Outcome::Success } else { Outcome::GateFailed })
}
