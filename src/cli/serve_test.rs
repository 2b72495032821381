//! `squeeze serve-test` arguments and output.

use std::path::PathBuf;

use anyhow::{bail, Context};

use crate::arch::mtp_chain::MAX_DEPTH as MAX_SPECULATIVE_DEPTH;
use crate::runtime::device::DeviceChoice;
use crate::runtime::kv_cache::{Fault, KvDtype};
use crate::serve::prompts::read_prompts;
use crate::serve::sampling::Sampling;
use crate::serve::{serve_test, ServeOptions};
use crate::units::human;

use super::output::{print_json, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// Model to decode with: folder or Hugging Face repo id.
    ///
    /// Model to decode with (e.g. the INT4 output), with config.json and a tokenizer: folder or Hugging Face repo
    /// id (ORG/NAME[@REV]) in the local cache.
    #[arg(value_parser = super::values::model_dir)]
    pub model: PathBuf,
    /// A prompt (repeatable).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// File of prompts: one per line, or JSONL with a `prompt` field.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Most tokens generated per request (stops earlier at EOS).
    #[arg(long, default_value_t = 32, value_parser = super::values::count)]
    pub max_new_tokens: usize,
    /// Requests decoded together.
    ///
    /// Requests decoded together; new ones join as others finish (admission waits while the pool is full).
    #[arg(long, default_value_t = 8, value_parser = super::values::count)]
    pub concurrency: usize,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16, value_parser = super::values::page_size)]
    pub page_size: usize,
    /// Pages in the KV pool (default: a quarter of available memory).
    #[arg(long, value_parser = super::values::count)]
    pub kv_pages: Option<usize>,
    /// KV storage: bf16, fp8 (e4m3 with the checkpoint's k_scale/v_scale) or f32.
    #[arg(long, default_value = "bf16")]
    pub kv_dtype: String,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, value_parser = super::values::temperature)]
    pub temperature: f32,
    /// Nucleus sampling mass (with --temperature > 0).
    #[arg(long, default_value_t = 1.0, value_parser = super::values::mass)]
    pub top_p: f32,
    /// Seed for sampling and for the choice of the fault's victim.
    #[arg(long, default_value_t = 0, value_parser = super::values::whole::<u64>)]
    pub seed: u64,
    /// Run prefill on this model and hand its KV to MODEL.
    ///
    /// Run prefill on this model (e.g. the FP8 source; folder or Hugging Face repo id (ORG/NAME[@REV]) in the local
    /// cache); its KV is handed to MODEL converted to --kv-dtype.
    #[arg(long, value_parser = super::values::model_dir)]
    pub prefill_model: Option<PathBuf>,
    /// Inject a mapping fault, optionally @STEP.
    ///
    /// Inject a mapping fault: stale-page, swap, out-of-range, tag-corrupt, double-map or rollback-stale (and on a model
    /// with KDA layers or DeepSeek-V4's caches state-swap, state-stale, state-corrupt or state-size, on its state
    /// slots); on DeepSeek-V4 a page fault other than rollback-stale may name the cache kind whose pages it hits,
    /// KIND:window, KIND:entries or KIND:index-keys; optionally @STEP (the decode step before whose verification it
    /// happens; default 1).
    #[arg(long)]
    pub inject_fault: Option<String>,
    /// Skip mapping verification (to measure its cost; faults then go undetected).
    #[arg(long)]
    pub no_verify: bool,
    /// Speculative decoding with the model's MTP layer: mtp or mtp=K.
    ///
    /// Speculative decoding with the model's MTP layer: `mtp` (one draft per step) or `mtp=K` (K chained drafts,
    /// as vLLM's num_speculative_tokens). Greedy only; the run also decodes plain greedy and fails (exit 1) unless
    /// both yield the same tokens; the report gives the acceptance, accepted length and speed-up.
    #[arg(long, value_name = "mtp[=K]", value_parser = parse_speculative)]
    pub speculative: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Run requests that pass the context window, with a warning.
    ///
    /// Run requests whose prompt plus --max-new-tokens pass the model's context window (max_position_embeddings,
    /// or YaRN's original_max_position_embeddings × factor where that is smaller), with a warning in the report,
    /// instead of refusing.
    #[arg(long)]
    pub allow_long_context: bool,
    /// Where the runtime computes: auto, cpu, cuda or emulated.
    ///
    /// Where the runtime computes: auto (the GPU when one is usable, else the CPU), cpu, cuda, or emulated (the
    /// CUDA kernels run on the host under emulation: slow, for tests on machines without a GPU).
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
}

fn parse_fault(text: &str) -> anyhow::Result<(Fault, u64)> {
    let (fault, step) = match text.split_once('@') {
        Some((fault, step)) => {
            (fault, step.parse::<u64>().with_context(|| format!("--inject-fault {text}: STEP must be an integer"))?)
        }
        None => (text, 1),
    };
    let fault = Fault::parse(fault).map_err(|problem| anyhow::anyhow!("--inject-fault {text}: {problem}"))?;
    Ok((fault, step))
}

fn parse_speculative(text: &str) -> Result<usize, String> {
    let depth = match text.split_once('=') {
        None if text == "mtp" => return Ok(1),
        Some(("mtp", k)) => k.parse::<usize>().map_err(|_| format!("K in mtp={k} must be a whole number"))?,
        _ => {
            return Err(format!(
                "expected mtp or mtp=K (K drafts per step, 1 … {MAX_SPECULATIVE_DEPTH}); MTP is the only draft method"
            ))
        }
    };
    if !(1..=MAX_SPECULATIVE_DEPTH).contains(&depth) {
        return Err(format!("K in mtp={depth} must be 1 … {MAX_SPECULATIVE_DEPTH}"));
    }
    Ok(depth)
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let mut prompts = args.prompt.clone();
    if let Some(path) = &args.prompts {
        prompts.extend(read_prompts(path).map_err(anyhow::Error::msg)?);
    }
    let Some(kv_dtype) = KvDtype::parse(&args.kv_dtype) else {
        bail!("--kv-dtype {}: expected bf16, fp8 or f32", args.kv_dtype)
    };
    let fault = args.inject_fault.as_deref().map(parse_fault).transpose()?;
    let options = ServeOptions {
        model: args.model.clone(),
        prefill_model: args.prefill_model.clone(),
        prompts,
        max_new_tokens: args.max_new_tokens,
        concurrency: args.concurrency,
        page_size: args.page_size,
        kv_pages: args.kv_pages,
        kv_dtype,
        sampling: Sampling { temperature: args.temperature, top_p: args.top_p },
        seed: args.seed,
        fault,
        verify: !args.no_verify,
        speculative: args.speculative,
        allow_long_context: args.allow_long_context,
    };
    let report =
        serve_test(super::output::open_backend(args.device)?.as_ref(), &options, &super::progress::Bar::new(false))?;
    if args.json {
        print_json(&report)?;
    } else {
        for warning in &report.warnings {
            println!("warning: {warning}");
        }
        for request in &report.requests {
            match &request.error {
                None => println!("[{}] {} → {}", request.id, request.prompt, request.text),
                Some(error) => println!("[{}] {} → ABORTED ({error})", request.id, request.prompt),
            }
        }
        println!(
            "requests: {} completed, {} aborted; prefill {} tokens {:.1} tok/s, decode {} tokens {:.1} tok/s",
            report.completed,
            report.aborted,
            report.prefill_tokens,
            report.prefill_tokens_per_second,
            report.decode_tokens,
            report.decode_tokens_per_second
        );
        let states = match report.state_bytes_peak {
            0 => String::new(),
            bytes => {
                format!(", state slots peak {} (beside the pages, not bounded by --kv-pages)", human(bytes as u64))
            }
        };
        println!(
            "kv: {} pool of {} pages × {} tokens, peak {} pages{states}; verification {:.3} % of decode time",
            report.kv_dtype.name(),
            report.kv_pages,
            report.page_size,
            report.pages_peak,
            report.verify_share * 100.0
        );
        if !report.cache_pages.is_empty() {
            let kinds: Vec<String> = report
                .cache_pages
                .iter()
                .map(|kind| {
                    let evicted = match kind.pages_evicted {
                        0 => String::new(),
                        pages => format!(", {pages} freed behind the window"),
                    };
                    format!(
                        "{} peak {} × {}{evicted}",
                        kind.kind.name(),
                        kind.pages_peak,
                        human(kind.page_bytes as u64)
                    )
                })
                .collect();
            println!("DeepSeek-V4 cache pages (f32 rows): {}", kinds.join("; "));
        }
        println!(
            "integrity: {} mappings verified, {} faults injected, {} detected by verification, {} stopped, {} requests aborted, {} false positives, {} undetected",
            report.mappings_verified,
            report.faults_injected,
            report.faults_detected,
            report.faults_stopped,
            report.requests_aborted,
            report.false_positives,
            report.undetected
        );
        if let Some(speculative) = &report.speculative {
            let stats = &speculative.stats;
            println!(
                "speculative (mtp, {} draft(s) per step): {}/{} drafts accepted ({:.1} %; by depth {}), {:.2} tokens \
                 per pass of the main model, {} pages rolled back; decode {:.1} tok/s vs {:.1} plain greedy ({:.2}×); \
                 tokens {}",
                stats.depth,
                stats.accepted,
                stats.drafted,
                speculative.acceptance_rate * 100.0,
                speculative
                    .acceptance_by_depth
                    .iter()
                    .map(|r| format!("{:.1} %", r * 100.0))
                    .collect::<Vec<_>>()
                    .join(", "),
                speculative.mean_accepted_length,
                speculative.pages_rolled_back,
                report.decode_tokens_per_second,
                speculative.greedy_decode_tokens_per_second,
                speculative.speedup,
                if speculative.identical_to_greedy {
                    "identical to plain greedy decoding".to_string()
                } else {
                    format!("DIFFER from plain greedy decoding in requests {:?}", speculative.mismatched_requests)
                }
            );
        }
        if let Some(device) = &report.decode_device {
            let steps = report.decode_steps.max(1) as f64;
            let transfers = &device.transfers;
            println!(
                "device, per decode step: {:.1} activation copies, {:.1} decision copies, {:.0} launches; {:.3} ms \
                 copying ({:.1} % of decode time), {:.3} ms waiting for kernels before the copies",
                transfers.activations.count() as f64 / steps,
                transfers.decisions.count() as f64 / steps,
                device.launches as f64 / steps,
                device.copy_seconds / steps * 1e3,
                device.copy_seconds / report.decode_seconds.max(f64::MIN_POSITIVE) * 100.0,
                device.wait_seconds / steps * 1e3
            );
        }
    }
    Ok(if report.passed() { Outcome::Success } else { Outcome::GateFailed })
}
