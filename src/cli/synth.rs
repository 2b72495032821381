//! `squeeze synth` arguments and output.

use std::path::PathBuf;

use crate::synth::{synth, SynthArch, SynthOptions, SynthSize};
use crate::units::both_units;

use super::output::{print_json, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// Architecture: kimi-k2, kimi-k2.6 (native INT4), glm5, glm5.2 (shared DSA indexer), glm45, kimi-linear (KDA
    /// and NoPE MLA), glm5.3-flash (KDA, k-pool DSA, mHC streams), kimi-k3 (MXFP4 experts, KDA) or deepseek-v4
    /// (MXFP4 experts, E8M0-scaled FP8, compressed attention).
    #[arg(long)]
    pub arch: SynthArch,
    /// Output folder.
    pub out: PathBuf,
    /// Decoder layers (the first is dense; glm5, glm5.2, glm45 and glm5.3-flash add one MTP layer).
    #[arg(long, default_value_t = SynthSize::default().layers, value_parser = super::values::count)]
    pub layers: usize,
    /// Hidden size (any multiple of the INT4 group size; need not be a multiple of 128).
    #[arg(long, default_value_t = SynthSize::default().hidden, value_parser = super::values::count)]
    pub hidden: usize,
    /// Routed experts per MoE layer.
    #[arg(long, default_value_t = SynthSize::default().experts, value_parser = super::values::count)]
    pub experts: usize,
    /// Expert intermediate size.
    #[arg(long, default_value_t = SynthSize::default().moe_intermediate, value_parser = super::values::count)]
    pub moe_intermediate: usize,
    /// Vocabulary size (at least 258).
    #[arg(long, default_value_t = SynthSize::default().vocab, value_parser = super::values::count)]
    pub vocab: usize,
    /// DeepSeek-V4 only: the release's attention widths (head_dim 512, qk_rope_head_dim 64, index_head_dim 128)
    /// instead of tiny ones — vLLM's V4 kernels accept no others (the loader oracle uses it).
    #[arg(long)]
    pub release_heads: bool,
    /// Number of safetensors shards.
    #[arg(long, default_value_t = 2, value_parser = super::values::count)]
    pub shards: usize,
    /// Random seed.
    #[arg(long, default_value_t = 0, value_parser = super::values::whole::<u64>)]
    pub seed: u64,
    /// Overwrite a non-empty folder.
    #[arg(long)]
    pub force: bool,
    /// Print a JSON report.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let options = SynthOptions {
        arch: args.arch,
        size: SynthSize {
            layers: args.layers,
            hidden: args.hidden,
            experts: args.experts,
            moe_intermediate: args.moe_intermediate,
            vocab: args.vocab,
            release_heads: args.release_heads,
        },
        shards: args.shards,
        seed: args.seed,
        out: args.out,
        force: args.force,
    };
    let report = synth(&options)?;
    if args.json {
        print_json(&report)?;
    } else {
        println!(
            "wrote {} ({}): {} tensors, {} parameters, {} in {} shard(s)",
            report.out.display(),
            report.architecture,
            report.tensors,
            report.parameters,
            both_units(report.bytes),
            report.shards
        );
    }
    Ok(Outcome::Success)
}
