//! The demo's human output: one or two lines per stage, then the commands to run on a real checkpoint.

use crate::engines::kv_scales::ScaleUse;
use std::path::Path;

use crate::calib::CalibReport;
use crate::eval::parity::ParityReport;
use crate::eval::tasks::PairedReport;
use crate::inspect::InspectReport;
use crate::parity::Mode;
use crate::report::Report;
use crate::synth::SynthArch;
use crate::units::human;
use crate::verify::{VerifyReport, DEFAULT_MAX_INT4_ERROR};

use super::super::report::count;
use super::super::table::Table;
use super::report::{EvalPair, ServePair};
use super::stages::{Folders, Quantized, SourceReport, Weights, MAX_NEW_TOKENS, REPORT_PRESET, TEMPERATURE};

/// What the eval and parity stages read.
pub const HELDOUT_TEXT: &str = "The Tempest, held out of training (eval/shakespeare-heldout.txt from Act 1)";

const STAGES: usize = 10;

/// The two deployments the demo compares: the FP8 source and its INT4 output, or, where the source ships INT4
/// (Kimi K2.6), the same weights with a BF16 and with an FP8 KV cache.
#[derive(Clone, Copy)]
pub struct Sides {
    pub reference: &'static str,
    pub candidate: &'static str,
    shipped: bool,
}

impl Sides {
    pub fn of(quantized: &Quantized) -> Self {
        if quantized.shipped() {
            Sides { reference: "BF16 KV", candidate: "FP8 KV", shipped: true }
        } else {
            Sides { reference: "FP8", candidate: "INT4", shipped: false }
        }
    }
}
/// Indent of a stage's detail lines.
const INDENT: &str = "      ";

fn stage(number: usize, name: &str, line: String, seconds: f64) {
    println!("[{number}/{STAGES}] {name}: {line} ({seconds:.2} s)");
}

pub fn title(weights: Weights) {
    match weights {
        Weights::Trained => println!(
            "squeeze demo on a trained model: tiny Shakespeare (Kimi K2 architecture, byte-level), embedded in this binary\n"
        ),
        Weights::Random(arch) => println!(
            "squeeze demo on RANDOM weights of a tiny {} model: this shows the machinery only, so failing parity gates and \
             garbage text are expected (run `squeeze demo` without --arch for a trained model)\n",
            arch.name()
        ),
    }
}

pub fn source(source: &SourceReport, weights: Weights, dir: &Path, seconds: f64) {
    let line = match source {
        SourceReport::Trained(unpacked) => format!(
            "wrote the FP8 checkpoint {} ({} files, {}) to {}",
            unpacked.name,
            unpacked.files,
            human(unpacked.bytes),
            dir.display()
        ),
        SourceReport::Random(made) => format!(
            "synth wrote a random {} checkpoint in {} ({} tensors, {} parameters, {}) to {}",
            made.architecture,
            match weights {
                Weights::Random(SynthArch::KimiK26) =>
                    "Moonshot's layout (kimi_k25 wrapper, routed experts natively INT4 g32)",
                _ => "the vendor FP8 block format",
            },
            made.tensors,
            made.parameters,
            human(made.bytes),
            dir.display()
        ),
    };
    stage(1, "model", line, seconds);
}

pub fn quantize(quantized: &Quantized, seconds: f64) {
    let report = match quantized {
        Quantized::Converted(report) => report,
        Quantized::Shipped { already_int4: shipped } => {
            let group = shipped.group_size.map_or("unknown".to_string(), |g| g.to_string());
            let line = format!(
                "nothing to do: the source ships INT4 ({} pack-quantized modules, group {group}) as Kimi K2.6 does; \
                 copied it ({} files, {}) as the deployment whose KV cache becomes FP8",
                shipped.modules,
                shipped.files,
                human(shipped.bytes)
            );
            stage(2, "quantize", line, seconds);
            return;
        }
    };
    let line = format!(
        "recipe {}: {} tensors to INT4, {} to BF16, {} copied; {} → {}",
        report.recipe,
        report.tensors_quantized,
        report.tensors_converted,
        report.tensors_copied,
        human(report.input_bytes),
        human(report.output_bytes)
    );
    stage(2, "quantize", line, seconds);
    if report.output_bytes > report.input_bytes {
        println!("{INDENT}(larger at this size: only the routed experts shrink, the FP8 rest becomes BF16)");
    }
}

pub fn verify(report: &VerifyReport, against_source: bool, seconds: f64) {
    let worst = report
        .worst
        .first()
        .map(|w| format!(" (worst relative L2 {:.4} ≤ {DEFAULT_MAX_INT4_ERROR}: {})", w.relative_l2, w.name))
        .unwrap_or_default();
    let verdict = if report.passed { "OK" } else { "FAILED" };
    if !against_source {
        let line = format!(
            "{} INT4 tensors follow the compressed-tensors conventions and every engine's loading rules: {verdict}",
            report.quantized_tensors
        );
        stage(3, "verify", line, seconds);
    } else {
        let line = format!(
            "{} shard(s) match the manifest, {} INT4 tensors the conventions, {} tensors the FP8 source: \
             {verdict}{worst}",
            report.shards_checked, report.quantized_tensors, report.compared_tensors
        );
        stage(3, "verify --source", line, seconds);
    }
    for problem in &report.problems {
        println!("{INDENT}mismatch: {problem}");
    }
}

pub fn inspect(report: &InspectReport, sides: Sides, seconds: f64) {
    let dtypes = report
        .dtypes
        .iter()
        .map(|(dtype, count)| format!("{dtype} {} ({})", count.tensors, human(count.bytes)))
        .collect::<Vec<_>>()
        .join(", ");
    let kind = report.architecture.as_deref().unwrap_or("unknown architecture");
    let what = if sides.shipped { "deployment copy" } else { "INT4 output" };
    stage(4, "inspect", format!("{what}, {kind}, {} tensors: {dtypes}", report.tensors), seconds);
}

pub fn eval(pair: &EvalPair, weights: Weights, sides: Sides, seconds: f64) {
    // Every demo tokenizer is byte-level; the synthetic ones add special tokens, so a token is not always a byte.
    let unit = match weights {
        Weights::Trained => "nats/byte",
        Weights::Random(_) => "nats/token",
    };
    let (reference, candidate) =
        if sides.shipped { ("INT4 as shipped", "its copy") } else { (sides.reference, sides.candidate) };
    let line = format!(
        "{} bytes of {}: {reference} {:.4} {unit} (PPL {:.3}), {candidate} {:.4} (PPL {:.3}), PPL ratio {:.4}",
        pair.fp8.chunks * pair.fp8.ctx,
        pair.text,
        pair.fp8.mean_nll,
        pair.fp8.ppl,
        pair.int4.mean_nll,
        pair.int4.ppl,
        pair.ppl_ratio
    );
    stage(5, "eval", line, seconds);
}

pub fn calibrate_kv(report: &CalibReport, sides: Sides, seconds: f64) {
    let scales = report
        .layers
        .iter()
        .map(|l| format!("L{} {:.4} (amax {:.2})", l.layer, l.k_scale[0], l.k_amax))
        .collect::<Vec<_>>()
        .join(", ");
    let line = format!(
        "{} {} layers from the sonnets ({} × {} bytes), scales written into the {} folder: {scales}",
        report.layers.len(),
        report.cache.to_uppercase(),
        report.samples,
        report.seq_len,
        if sides.shipped { "copied" } else { "INT4" }
    );
    stage(6, "calibrate-kv", line, seconds);
    let engines: Vec<String> = report
        .engines
        .iter()
        .map(|e| {
            let verdict = match e.uses {
                ScaleUse::Checkpoint => "uses them",
                ScaleUse::Unit => "ignores them (scale 1.0)",
                ScaleUse::DynamicTiles => "ignores them (dynamic tile scales)",
                ScaleUse::PowerOfTwoTiles => "ignores them (UE8M0 scales per row)",
            };
            format!("{} {verdict}", e.engine.label())
        })
        .collect();
    println!("{INDENT}engines: {}; parity below caches FP8 KV as vLLM does", engines.join(", "));
}

pub fn parity(report: &ParityReport, weights: Weights, sides: Sides, seconds: f64) {
    let gates = &report.gates;
    let line = format!(
        "{} reference vs {} candidate, {} chunks × {} bytes of the held-out play ({} prompt, {} scored each)",
        sides.reference,
        sides.candidate,
        report.chunks,
        report.ctx,
        report.prompt,
        report.ctx - 1 - report.prompt
    );
    stage(7, "eval --reference --candidate", line, seconds);
    let mut table = Table::new(&[
        "mode",
        &format!("mean KLD ≤ {}", gates.max_mean_kld),
        &format!("same top ≥ {} %", gates.min_same_top),
        &format!("PPL ratio ≤ {}", gates.max_ppl_ratio),
    ]);
    for (mode, mode_report) in &report.mode_reports {
        let s = &mode_report.summary;
        if *mode == Mode::Reference {
            table.row(vec![
                "reference (not gated)".into(),
                format!("{:.5}", s.mean_kld),
                format!("{:.2} %", s.same_top),
                format!("{:.4}", s.ppl_ratio),
            ]);
            continue;
        }
        table.row(vec![
            mode.name().into(),
            format!("{:.5} (margin {:.5})", s.mean_kld, gates.max_mean_kld - s.mean_kld),
            format!("{:.2} % (margin {:+.2} pt)", s.same_top, s.same_top - gates.min_same_top),
            format!("{:.4} (margin {:.4})", s.ppl_ratio, gates.max_ppl_ratio - s.ppl_ratio),
        ]);
    }
    for line in table.render().trim_end().lines() {
        println!("{INDENT}{line}");
    }
    let gated = 3 * report.mode_reports.iter().filter(|(mode, _)| *mode != Mode::Reference).count();
    if report.failures.is_empty() {
        println!("{INDENT}all {gated} gates passed (kv, weights, split; the gates of `squeeze eval`)");
        return;
    }
    let failed: Vec<String> = report.failures.iter().map(|f| format!("{} {}", f.mode, f.gate)).collect();
    match weights {
        Weights::Random(_) => println!(
            "{INDENT}{} of {gated} gates failed ({}): expected on random weights",
            failed.len(),
            failed.join(", ")
        ),
        Weights::Trained => {
            println!("{INDENT}{} of {gated} gates FAILED on the trained model: {}", failed.len(), failed.join(", "))
        }
    }
}

pub fn tasks(report: &PairedReport, sides: Sides, seconds: f64) {
    // A shipped INT4 release is compared with its copy: the task scores weights, which are the same.
    let (reference, candidate) =
        if sides.shipped { ("INT4 as shipped", "its copy") } else { (sides.reference, sides.candidate) };
    for metric in report.comparison.iter().filter(|metric| metric.metric == "acc") {
        let line = format!(
            "{}: which of four words ends a line of the held-out play, {} items scored by log-likelihood as \
             lm-evaluation-harness does: {} {:.1} ± {:.1} %, {} {:.1} ± {:.1} %",
            metric.task,
            metric.items,
            reference,
            metric.reference * 100.0,
            metric.reference_stderr * 100.0,
            candidate,
            metric.candidate * 100.0,
            metric.candidate_stderr * 100.0
        );
        stage(8, "eval --task", line, seconds);
        let flips = match metric.right_to_wrong + metric.wrong_to_right {
            0 => "no item flipped".to_string(),
            _ => format!(
                "{} items flipped right → wrong, {} wrong → right (flips that cancel out leave the accuracy as it was)",
                metric.right_to_wrong, metric.wrong_to_right
            ),
        };
        println!(
            "{INDENT}{flips}; {:.1} % of the choices agree, McNemar's exact p {:.3}",
            metric.agreement * 100.0,
            metric.mcnemar_p
        );
    }
}

pub fn serve(pair: &ServePair, weights: Weights, sides: Sides, seconds: f64) {
    let deployments = if sides.shipped {
        "INT4 weights + BF16 KV beside the same + FP8 KV (prompts prefilled on the first)"
    } else {
        "FP8 weights + BF16 KV beside INT4 weights + FP8 KV (prompts prefilled on FP8)"
    };
    let line = format!(
        "{deployments}, {MAX_NEW_TOKENS} bytes sampled at temperature {TEMPERATURE} with one seed (the texts agree \
         until a near-tie flips a byte)",
    );
    stage(9, "serve-test", line, seconds);
    let (fp8, int4) = (&pair.fp8, &pair.int4);
    println!(
        "{INDENT}paged KV cache: {} {} / {} {} page mappings verified before their decode steps, {} faults, {} aborted, \
         verification {:.2} % / {:.2} % of decode time",
        sides.reference,
        fp8.mappings_verified,
        sides.candidate,
        int4.mappings_verified,
        fp8.faults_detected + int4.faults_detected,
        fp8.aborted + int4.aborted,
        100.0 * fp8.verify_share,
        100.0 * int4.verify_share
    );
    for (fp8, int4) in fp8.requests.iter().zip(&int4.requests) {
        let same = fp8.token_ids.iter().zip(&int4.token_ids).take_while(|(a, b)| a == b).count();
        println!("{INDENT}{:?} (the first {same} of {} bytes agree)", fp8.prompt, fp8.tokens);
        let width = sides.reference.len().max(sides.candidate.len());
        println!("{INDENT}  {:width$} → {:?}", sides.reference, fp8.text);
        println!("{INDENT}  {:width$} → {:?}", sides.candidate, int4.text);
    }
    if let Weights::Random(_) = weights {
        println!("{INDENT}(random weights: the text is expected to be garbage)");
    }
}

pub fn report(report: &Report, seconds: f64) {
    let line = format!(
        "{REPORT_PRESET} preset ({}, {:.1} B parameters with MTP): FP8 {:.1} GiB → {} {:.1} GiB (published: 705 → 421 GiB)",
        report.architecture,
        report.parameters as f64 / 1e9,
        report.source_gib,
        report.recipe,
        report.output_gib
    );
    stage(10, "report", line, seconds);
    let layout = &report.layout;
    println!(
        "{INDENT}KV capacity of one {} × {} node: prefill (FP8 weights, BF16 KV) {} tokens = {} requests of {}; decode ({}, FP8 KV) {} tokens = {} requests",
        layout.gpus,
        layout.gpu_memory.name,
        count(report.prefill.kv_capacity_tokens),
        report.prefill.max_concurrency,
        count(layout.context),
        report.recipe,
        count(report.decode.kv_capacity_tokens),
        report.decode.max_concurrency
    );
}

pub fn closing(seconds: f64, passed: bool, weights: Weights, sides: Sides, kept: Option<&Folders>) {
    let verdict = match (passed, weights) {
        (false, _) => "a check FAILED (see above)",
        (true, Weights::Trained) => "every check passed",
        (true, Weights::Random(_)) => {
            "verify and the page checks passed; parity gates are not enforced on random weights"
        }
    };
    println!("\ndemo finished in {seconds:.1} s: {verdict}");
    if let Some(folders) = kept {
        let (source, output) = if sides.shipped { ("as shipped", "with FP8 KV scales") } else { ("FP8", "INT4") };
        println!("folders kept: {} ({source}), {} ({output})", folders.source.display(), folders.output.display());
    }
    if sides.shipped {
        println!(
            "\nOn your own Kimi K2.5/K2.6/K2.7 folder (K26 = the release as shipped, K26KV = a copy of it):\n\
             \x20 squeeze verify $K26 --engine vllm                  # the release against vLLM's loading rules\n\
             \x20 squeeze calibrate-kv $K26KV --data calibration.txt # FP8 KV scales written into the copy\n\
             \x20 squeeze eval --reference $K26 --candidate $K26KV --data heldout.txt   # BF16 vs FP8 KV parity gates\n\
             \x20 squeeze serve-test $K26KV --prefill-model $K26 --kv-dtype fp8 --prompt \"Shall I compare thee\"\n\
             \x20 squeeze report kimi-k2.6                           # KV capacity with BF16 and FP8 KV"
        );
        return;
    }
    println!(
        "\nOn your own checkpoint (FP8 = the vendor's FP8 release folder, INT4 = a new folder):\n\
         \x20 squeeze quantize $FP8 $INT4                        # routed experts → INT4 group 32, the rest BF16\n\
         \x20 squeeze verify $INT4 --source $FP8                 # hashes, compressed-tensors conventions, error vs source\n\
         \x20 squeeze calibrate-kv $INT4 --data calibration.txt  # FP8 KV scales written into $INT4\n\
         \x20 squeeze eval --reference $FP8 --candidate $INT4 --data heldout.txt   # parity gates; exit 1 if one fails\n\
         \x20 squeeze eval --reference $FP8 --candidate $INT4 --task tasks.jsonl   # benchmark items, flips, McNemar p\n\
         \x20 squeeze serve-test $INT4 --prefill-model $FP8 --kv-dtype fp8 --prompt \"Shall I compare thee\"\n\
         \x20 squeeze report $FP8                                # size after the recipe and the GPU memory budget"
    );
}
