//! The card's text: Hugging Face front matter, then what was quantized and how, how to serve it, and the accuracy
//! results recorded for it. A pure function of the manifest, `config.json` and the source's README: no clock, no
//! path but file names, so that a merge of parts renders the card of one run byte for byte.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

use super::facts::{self, BaseModelFrom};
use super::{MARKER, SOURCE_README};
use crate::engines::kv_scales::{kv_scale_handling, CacheLayout};
use crate::engines::Engine;
use crate::io::card_record::{CalibrationData, EvalRecord, EvalResult};
use crate::io::composite;
use crate::io::manifest::Manifest;
use crate::model::ModelConfig;
use crate::units::human;

/// What a card is rendered from.
pub struct Inputs<'a> {
    pub manifest: &'a Manifest,
    /// The folder's `config.json`.
    pub config: Option<&'a Value>,
    /// `README.source.md`, when the folder holds one.
    pub source_readme: Option<&'a str>,
}

/// The card (`README.md`).
pub fn render(inputs: &Inputs) -> String {
    let mut out = String::new();
    front_matter(&mut out, inputs);
    body(&mut out, inputs);
    out
}

/// `writeln!` into a String cannot fail.
macro_rules! put {
    ($out:expr) => { let _ = writeln!($out); };
    ($out:expr, $($arg:tt)*) => { let _ = writeln!($out, $($arg)*); };
}

fn front_matter(out: &mut String, inputs: &Inputs) {
    let base = facts::base_model(inputs.manifest, inputs.config);
    put!(out, "---");
    if let Some(id) = base.repo_id() {
        put!(out, "base_model: {}", facts::yaml_scalar(id));
        put!(out, "base_model_relation: quantized");
    }
    put!(out, "library_name: transformers");
    put!(out, "pipeline_tag: {}", facts::pipeline_tag(inputs.config));
    for (key, value) in facts::license(inputs.source_readme) {
        put!(out, "{key}: {value}");
    }
    put!(out, "tags:");
    for tag in facts::tags(inputs.manifest) {
        put!(out, "- {tag}");
    }
    put!(out, "---");
    put!(out);
}

fn body(out: &mut String, inputs: &Inputs) {
    let manifest = inputs.manifest;
    let base = facts::base_model(manifest, inputs.config);
    let short_name = base.id.rsplit('/').next().unwrap_or(&base.id).to_string();
    let labels = facts::scheme_labels(manifest);
    put!(
        out,
        "{MARKER}: written by squeeze {} from squeeze-manifest.json and config.json; `squeeze card DIR` rewrites it, \
         edits here are replaced -->",
        manifest.version
    );
    put!(out);
    let title = if labels.is_empty() { "unquantized".to_string() } else { labels.join(" + ") };
    put!(out, "# {short_name} — {title} (compressed-tensors)");
    put!(out);
    let linked = if base.from == BaseModelFrom::FolderName {
        format!("the weights of the local folder `{}`", base.id)
    } else if facts::is_repo_id(&base.id) {
        format!("[{}](https://huggingface.co/{})", base.id, base.id)
    } else {
        format!("`{}`", base.id)
    };
    put!(
        out,
        "A quantized version of {linked}, converted by [squeeze](#how-it-was-made) {} with the recipe `{}`.",
        manifest.version,
        manifest.recipe.name
    );
    if base.from == BaseModelFrom::FolderName {
        put!(out);
        put!(
            out,
            "The source was read from a local folder, not from a Hugging Face repo or its cache, so this card gives no \
             `base_model`: name the repo the weights came from with `squeeze card DIR --base-model ORG/NAME`."
        );
    }
    if inputs.source_readme.is_some() {
        put!(out);
        put!(out, "The source model's own card is kept as [{SOURCE_README}]({SOURCE_README}).");
    }
    put!(out);
    quantization(out, inputs);
    serving(out, inputs);
    accuracy(out, &manifest.card.as_ref().map(|card| card.evals.clone()).unwrap_or_default());
    made(out, inputs);
}

fn quantization(out: &mut String, inputs: &Inputs) {
    let manifest = inputs.manifest;
    put!(out, "## Quantization");
    put!(out);
    if let Some(groups) = inputs
        .config
        .and_then(composite::quantization_config)
        .and_then(|q| q.get("config_groups"))
        .and_then(Value::as_object)
    {
        put!(out, "| group | format | weights | activations | targets |");
        put!(out, "| --- | --- | --- | --- | --- |");
        for (name, group) in groups {
            let targets = group
                .get("targets")
                .and_then(Value::as_array)
                .map(|targets| targets.iter().filter_map(Value::as_str).map(|t| format!("`{t}`")).collect::<Vec<_>>())
                .unwrap_or_default()
                .join(", ");
            put!(
                out,
                "| {name} | `{}` | {} | {} | {} |",
                group.get("format").and_then(Value::as_str).unwrap_or("?"),
                describe_args(group.get("weights")),
                describe_args(group.get("input_activations")),
                cell(&targets)
            );
        }
        if let Some(ignored) = inputs
            .config
            .and_then(composite::quantization_config)
            .and_then(|q| q.get("ignore"))
            .and_then(Value::as_array)
        {
            put!(out);
            put!(
                out,
                "Modules left unquantized: {} entries in `quantization_config.ignore` (config.json).",
                ignored.len()
            );
        }
        put!(out);
    }
    for label in facts::scheme_labels(manifest) {
        let note = match label {
            "INT4 W4A16" => {
                "INT4 W4A16: 4-bit integer weights in groups with BF16 scales, 16-bit activations (compressed-tensors \
                 `pack-quantized`, the layout Moonshot ships Kimi-K2-Thinking in)."
            }
            "NVFP4" => {
                "NVFP4 is for Blackwell FP4 tensor cores (B200/B300): E2M1 values in groups of 16 with FP8 scales under \
                 one F32 global scale per tensor, an expert's gate and up sharing it."
            }
            "MXFP4" => "MXFP4 is the OCP MX format (AMD fleets): E2M1 values in groups of 32 with E8M0 scales.",
            "FP8 block" => "FP8 block-scaled tensors are kept from the source as compressed-tensors `float-quantized`.",
            _ => {
                "W4A8-FP8 (INT4 weights, FP8 activations) is for Hopper prefill: the INT4 tensors in groups of 128, with FP8 per-token dynamic activations \
                 (FP8 tensor cores at the INT4 footprint)."
            }
        };
        put!(out, "- {note}");
    }
    put!(out);
    // Per tensor class, as `quantize` prints it.
    let mut classes: BTreeMap<&str, ClassRow> = BTreeMap::new();
    for tensor in &manifest.tensors {
        let row = classes.entry(tensor.class.as_str()).or_default();
        row.tensors += 1;
        *row.schemes.entry(tensor.scheme.as_str()).or_insert(0) += 1;
        row.before += tensor.bytes_in;
        row.after += tensor.bytes_out;
    }
    put!(out, "| class | tensors | schemes | before | after |");
    put!(out, "| --- | ---: | --- | ---: | ---: |");
    for (class, row) in &classes {
        let schemes = row.schemes.iter().map(|(scheme, n)| format!("{scheme} × {n}")).collect::<Vec<_>>().join(", ");
        put!(out, "| {class} | {} | {schemes} | {} | {} |", row.tensors, human(row.before), human(row.after));
    }
    let before: u64 = manifest.tensors.iter().map(|t| t.bytes_in).sum();
    let shards: u64 = manifest.shards.iter().map(|s| s.bytes).sum();
    put!(
        out,
        "| **all** | {} | | {} | {} in {} shard(s) |",
        manifest.tensors.len(),
        human(before),
        human(shards),
        manifest.shards.len()
    );
    put!(out);
    put!(out, "| | |");
    put!(out, "| --- | --- |");
    put!(out, "| method | {} |", method(manifest));
    put!(out, "| calibration data | {} |", calibration(manifest));
    put!(out, "| recipe | `{}` (SHA-256 `{}`, below) |", manifest.recipe.name, manifest.recipe.sha256);
    put!(out, "| plan digest | `{}` |", manifest.plan_sha256);
    put!(out, "| squeeze | {} |", manifest.version);
    put!(out);
}

/// One tensor class's line of the table: tensors, their output schemes, bytes before and after.
#[derive(Default)]
struct ClassRow<'a> {
    tensors: usize,
    schemes: BTreeMap<&'a str, usize>,
    before: u64,
    after: u64,
}

/// `4-bit int, group 32, symmetric, observer minmax` from a compressed-tensors `QuantizationArgs`.
fn describe_args(args: Option<&Value>) -> String {
    let Some(args) = args.filter(|a| a.is_object()) else { return "16-bit (not quantized)".into() };
    let field = |key: &str| args.get(key).filter(|v| !v.is_null());
    let mut parts = vec![format!(
        "{}-bit {}",
        field("num_bits").map(Value::to_string).unwrap_or_else(|| "?".into()),
        field("type").and_then(Value::as_str).unwrap_or("?")
    )];
    match (field("strategy").and_then(Value::as_str), field("group_size"), field("block_structure")) {
        (Some("block"), _, Some(block)) => parts.push(format!(
            "block {}",
            block.as_array().map(|b| b.iter().map(Value::to_string).collect::<Vec<_>>().join("×")).unwrap_or_default()
        )),
        (_, Some(group), _) => parts.push(format!("group {group}")),
        (Some(strategy), _, _) => parts.push(format!("per {strategy}")),
        _ => {}
    }
    match field("dynamic") {
        Some(Value::Bool(true)) => parts.push("dynamic".into()),
        Some(Value::String(how)) => parts.push(format!("dynamic ({how})")),
        _ => {}
    }
    if field("symmetric").and_then(Value::as_bool) == Some(true) {
        parts.push("symmetric".into());
    }
    if let Some(observer) = field("observer").and_then(Value::as_str) {
        parts.push(format!("observer `{observer}`"));
    }
    parts.join(", ")
}

/// A table cell: `|` escaped, empty as `—`.
fn cell(text: &str) -> String {
    if text.is_empty() {
        "—".into()
    } else {
        text.replace('|', "\\|")
    }
}

fn method(manifest: &Manifest) -> String {
    let Some(coverage) = manifest.expert_coverage.as_ref() else {
        return "`rtn`: round to nearest, each group's scale from the weights alone by its rule's `scale_rule` \
                (recipe below)"
            .into();
    };
    let get = |key: &str| coverage.get(key).and_then(Value::as_u64).unwrap_or(0);
    let name = coverage.get("method").and_then(Value::as_str).unwrap_or("?");
    if name == "rtn" {
        return format!(
            "`rtn`: round to nearest, each group's scale from the weights alone by its rule's `scale_rule`; W4A4 \
             activation global scales from the largest input each routed expert saw on the calibration data ({} of \
             {} experts saw tokens, {} took their layer's largest, which the engines use for all)",
            get("calibrated"),
            get("experts"),
            get("fell_back")
        );
    }
    let what = match name {
        "imatrix" => {
            "routed experts' scales minimise the error weighted by their calibration inputs' mean x² per channel"
        }
        "gptq" => "routed experts quantized by GPTQ against the Hessian of their calibration inputs",
        _ => "calibrated routed experts",
    };
    let sequential = match manifest.card.as_ref().and_then(|c| c.calibration.as_ref()).and_then(|c| c.sequential) {
        Some(true) => " (sequential: layer L + 1 calibrated on layer L's quantized output)",
        Some(false) => " (every layer on the source model's activations)",
        None => "",
    };
    format!(
        "`{name}`: {what}{sequential}; {} of {} routed experts calibrated, {} fell back to `mse` (fewer than {} \
         calibration tokens); other tensors by their rule's `scale_rule`",
        get("calibrated"),
        get("experts"),
        get("fell_back"),
        get("min_expert_tokens")
    )
}

fn calibration(manifest: &Manifest) -> String {
    match (manifest.card.as_ref().and_then(|c| c.calibration.as_ref()), manifest.expert_coverage.as_ref()) {
        (Some(CalibrationData { file, sha256, tokens_sha256, sequences, tokens, seq_len, .. }), _) => format!(
            "`{}` (SHA-256 `{sha256}`): {sequences} sequences{}, {tokens} tokens in all (token ids' SHA-256 `{tokens_sha256}`)",
            file.replace('`', "'"),
            seq_len.map(|n| format!(" (the text cut into {n}-token chunks)")).unwrap_or_default()
        ),
        (None, Some(coverage)) => format!(
            "{} sequences, {} tokens (the file was not recorded)",
            coverage.get("sequences").and_then(Value::as_u64).unwrap_or(0),
            coverage.get("tokens").and_then(Value::as_u64).unwrap_or(0)
        ),
        (None, None) => "none (round to nearest reads no data)".into(),
    }
}

fn serving(out: &mut String, inputs: &Inputs) {
    let (tp, recorded) = facts::tp(inputs.manifest, inputs.config);
    let kv = facts::has_kv_scales(inputs.config);
    let remote = if facts::needs_remote_code(inputs.config) { " --trust-remote-code" } else { "" };
    put!(out, "## Serving");
    put!(out);
    put!(out, "```sh");
    put!(out, "MODEL=path/to/this/folder   # or the Hugging Face repo id it is published under");
    put!(
        out,
        "vllm serve \"$MODEL\" --tensor-parallel-size {tp}{}{remote}",
        if kv { " --kv-cache-dtype fp8" } else { "" }
    );
    put!(
        out,
        "python -m sglang.launch_server --model-path \"$MODEL\" --tp {tp}{}{remote}",
        if kv { " --kv-cache-dtype fp8_e4m3" } else { "" }
    );
    put!(out, "```");
    put!(out);
    put!(
        out,
        "Both engines read the compressed-tensors `quantization_config` in config.json; no quantization flag is \
         needed. Tensor parallelism {tp}: {}; `squeeze verify DIR --engine all --tp N` checks another size against \
         the engines' load rules.{}",
        if recorded {
            "the size `quantize --tp` checked the load rules against"
        } else {
            "squeeze's default (8 for the real-size Kimi K2, GLM-5 and GLM-4.5 shapes, 1 for smaller models)"
        },
        if remote.is_empty() { "" } else { " The model ships custom code (`auto_map`): hence `--trust-remote-code`." }
    );
    put!(out);
    if kv {
        put!(
            out,
            "The folder holds calibrated FP8 KV-cache scales (`kv_cache_scheme`, written by `squeeze calibrate-kv`). \
             What each engine does with them for this cache layout:"
        );
        put!(out);
        if let Some(layout) = inputs.config.and_then(|c| ModelConfig::from_json(c).ok()).map(|c| CacheLayout::of(&c)) {
            for engine in Engine::ALL {
                put!(out, "- {}: {}.", engine.label(), kv_scale_handling(engine, layout).summary);
            }
        }
        put!(out);
    } else {
        put!(
            out,
            "This folder holds no calibrated KV-cache scales. For an FP8 KV cache run `squeeze calibrate-kv DIR`, then \
             `squeeze card DIR`: the card then adds the flags and what each engine does with the scales."
        );
        put!(out);
    }
}

fn accuracy(out: &mut String, evals: &[EvalRecord]) {
    if evals.is_empty() {
        return;
    }
    put!(out, "## Accuracy");
    put!(out);
    put!(
        out,
        "Measured by squeeze's reference runtime (`squeeze eval`), f32 compute, on the token chunks or task items \
         each report names."
    );
    put!(out);
    for record in evals {
        if let EvalResult::Parity { reference, chunks, ctx, prompt, kv_scales, engine, modes, gates, failed } =
            &record.result
        {
            put!(out, "### Parity against {reference} (`{}`)", record.report.replace('`', "'"));
            put!(out);
            put!(
                out,
                "{chunks} chunks of {ctx} tokens: the first {prompt} of each the prompt, the next {} scored. FP8-KV \
                 modes cached with {} (as {} does).",
                ctx.saturating_sub(prompt + 1),
                match kv_scales.as_str() {
                    "checkpoint" => "this folder's k_scale/v_scale",
                    "unit" => "scale 1.0",
                    "dynamic-tiles" => "dynamic per-128 tile scales",
                    other => other,
                },
                serde_json::from_value::<Engine>(Value::from(engine.as_str()))
                    .map_or_else(|_| engine.clone(), |engine| engine.label().to_string())
            );
            put!(out);
            put!(out, "| mode | prompt → scored | mean KLD | same top-1 | PPL | PPL ratio |");
            put!(out, "| --- | --- | ---: | ---: | ---: | ---: |");
            for mode in modes {
                let what = match mode.mode.as_str() {
                    "reference" => "reference, BF16 KV".to_string(),
                    "kv" => "reference, FP8 KV".to_string(),
                    "weights" => "this model, BF16 KV".to_string(),
                    "split" => "reference prefill (BF16 KV) → this model decodes (FP8 KV)".to_string(),
                    other => other.to_string(),
                };
                put!(
                    out,
                    "| {} | {what} | {:.5} ± {:.5} | {:.2} ± {:.2} % | {:.4} ± {:.4} | {:.4} ± {:.4} |",
                    mode.mode,
                    mode.mean_kld,
                    mode.mean_kld_stderr,
                    mode.same_top,
                    mode.same_top_stderr,
                    mode.ppl,
                    mode.ppl_stderr,
                    mode.ppl_ratio,
                    mode.ppl_ratio_stderr
                );
            }
            put!(out);
            put!(
                out,
                "Gates: mean KLD ≤ {}, same top-1 ≥ {} %, PPL ratio ≤ {}: {}.",
                gates.max_mean_kld,
                gates.min_same_top,
                gates.max_ppl_ratio,
                if failed.is_empty() { "all passed".to_string() } else { format!("failed {}", failed.join(", ")) }
            );
            put!(out);
        }
    }
    for record in evals {
        if let EvalResult::Tasks { reference, task_file, num_fewshot, rows, failed } = &record.result {
            put!(out, "### Tasks against {reference} (`{}`)", record.report.replace('`', "'"));
            put!(out);
            put!(
                out,
                "Items of `{}`, {num_fewshot}-shot, scored as lm-evaluation-harness scores them (multiple choice by \
                 log-likelihood, generation with exact match) on both models and paired per item: the items that \
                 flipped each way and McNemar's exact p on them.",
                task_file.replace('`', "'")
            );
            put!(out);
            put!(
                out,
                "| task | metric | items | {} | this model | right → wrong | wrong → right | agree | McNemar p |",
                cell(reference)
            );
            put!(out, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
            for row in rows {
                put!(
                    out,
                    "| {} | {} | {} | {:.2} ± {:.2} % | {:.2} ± {:.2} % | {} | {} | {:.1} % | {:.3} |",
                    cell(&row.task),
                    cell(&row.metric),
                    row.items,
                    row.reference * 100.0,
                    row.reference_stderr * 100.0,
                    row.candidate * 100.0,
                    row.candidate_stderr * 100.0,
                    row.right_to_wrong,
                    row.wrong_to_right,
                    row.agreement * 100.0,
                    row.mcnemar_p
                );
            }
            put!(out);
            if !failed.is_empty() {
                put!(out, "Gates failed: {}.", failed.iter().map(|f| cell(f)).collect::<Vec<_>>().join("; "));
                put!(out);
            }
        }
    }
    let perplexities: Vec<&EvalRecord> =
        evals.iter().filter(|record| matches!(record.result, EvalResult::Perplexity { .. })).collect();
    if !perplexities.is_empty() {
        put!(out, "### Perplexity");
        put!(out);
        put!(out, "| model | report | chunks × ctx | tokens | PPL | mean NLL (nats) |");
        put!(out, "| --- | --- | --- | ---: | ---: | ---: |");
        for record in perplexities {
            if let EvalResult::Perplexity { model, chunks, ctx, tokens, ppl, ppl_stderr, mean_nll, mean_nll_stderr } =
                &record.result
            {
                put!(
                    out,
                    "| {} | `{}` | {chunks} × {ctx} | {tokens} | {ppl:.4} ± {ppl_stderr:.4} | {mean_nll:.5} ± \
                     {mean_nll_stderr:.5} |",
                    model.as_deref().map(cell).unwrap_or_else(|| "this model".into()),
                    record.report.replace('`', "'")
                );
            }
        }
        put!(out);
    }
}

fn made(out: &mut String, inputs: &Inputs) {
    let manifest = inputs.manifest;
    put!(out, "## How it was made");
    put!(out);
    put!(
        out,
        "squeeze {} converted the source tensor by tensor in bounded memory \
         (`squeeze quantize SOURCE OUT --recipe {}`); `squeeze-manifest.json` records every shard's SHA-256 and \
         every tensor's scheme, and `squeeze verify DIR` re-hashes the folder against it.",
        manifest.version,
        manifest.recipe.name
    );
    put!(out);
    put!(out, "Recipe `{}`:", manifest.recipe.name);
    put!(out);
    put!(out, "```toml");
    out.push_str(manifest.recipe.text.trim_end());
    put!(out);
    put!(out, "```");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantization_args_read_as_people_say_them() {
        let int4 = json!({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": true,
                          "dynamic": false, "observer": "mse"});
        assert_eq!(describe_args(Some(&int4)), "4-bit int, group 32, symmetric, observer `mse`");
        let fp8_tokens =
            json!({"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true, "symmetric": true});
        assert_eq!(describe_args(Some(&fp8_tokens)), "8-bit float, per token, dynamic, symmetric");
        let block = json!({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128],
                           "group_size": null, "dynamic": false});
        assert_eq!(describe_args(Some(&block)), "8-bit float, block 128×128");
        let nvfp4_inputs = json!({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                                  "dynamic": "local"});
        assert_eq!(describe_args(Some(&nvfp4_inputs)), "4-bit float, group 16, dynamic (local)");
        assert_eq!(describe_args(Some(&Value::Null)), "16-bit (not quantized)");
        assert_eq!(describe_args(None), "16-bit (not quantized)");
    }

    #[test]
    fn cells_escape_pipes_and_show_empty_as_a_dash() {
        assert_eq!(cell("re:.*(gate|up)"), "re:.*(gate\\|up)");
        assert_eq!(cell(""), "—");
    }
}
