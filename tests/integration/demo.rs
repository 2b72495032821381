//! `squeeze demo`: on the embedded trained model every stage runs, every gate passes and the decoded text is
//! readable; `--json` carries every stage's report; `--arch` runs random weights and says so.

use serde_json::Value;

use super::common::{path_str, squeeze};

/// The stages, in the order they run and as `stage_seconds` names them.
const STAGES: [&str; 10] =
    ["model", "quantize", "verify", "inspect", "eval", "calibrate-kv", "parity", "tasks", "serve-test", "report"];

/// The trained model scores ≈ 2.2 nats/byte on the held-out play; random weights score ≈ ln(vocab) ≈ 5.6 or more.
const TRAINED_MAX_NATS_PER_BYTE: f64 = 3.0;

/// The report preset's sizes against the published ones (norms, partial-block scales, MTP: docs/report.md).
const PUBLISHED_SIZE_TOLERANCE: f64 = 0.01;

fn printable(text: &str) -> bool {
    !text.trim().is_empty() && text.chars().all(|c| c.is_ascii_graphic() || c.is_ascii_whitespace())
}

fn number(value: &Value, key: &str) -> f64 {
    value[key].as_f64().unwrap_or_else(|| panic!("`{key}` is not a number in {value}"))
}

#[test]
fn demo_json_reports_every_stage_of_the_trained_model_with_gates_passed_and_readable_text() {
    let report = squeeze(&["demo", "--json"]).ok().json();
    assert_eq!(report["weights"], "trained");
    assert_eq!(report["passed"], true);
    let stages: Vec<&str> =
        report["stage_seconds"].as_array().unwrap().iter().map(|s| s["stage"].as_str().unwrap()).collect();
    assert_eq!(stages, STAGES);
    let keys = ["source", "quantize", "verify", "inspect", "eval", "calibrate_kv", "parity", "tasks", "serve_test"];
    for key in keys.into_iter().chain(["report"]) {
        assert!(report[key].is_object(), "`{key}` missing: {report}");
    }
    assert_eq!(report["source"]["weights"], "trained");
    assert!(report["quantize"]["tensors_quantized"].as_u64().unwrap() > 0);
    assert_eq!(report["verify"]["passed"], true);
    assert!(report["verify"]["compared_tensors"].as_u64().unwrap() > 0);

    for model in ["fp8", "int4"] {
        let nll = number(&report["eval"][model], "mean_nll");
        assert!(nll < TRAINED_MAX_NATS_PER_BYTE, "{model}: {nll} nats/byte is not the trained model");
    }
    assert_eq!(report["calibrate_kv"]["layers"].as_array().unwrap().len(), 3);

    let parity = &report["parity"];
    assert_eq!(parity["failures"].as_array().unwrap().len(), 0, "{parity}");
    let gates = &parity["gates"];
    for mode in ["reference", "kv", "weights", "split"] {
        let summary = &parity["modes"][mode];
        assert!(number(summary, "mean_kld") <= number(gates, "max_mean_kld"), "{mode}: {summary}");
        assert!(number(summary, "same_top") >= number(gates, "min_same_top"), "{mode}: {summary}");
        assert!(number(summary, "ppl_ratio") <= number(gates, "max_ppl_ratio"), "{mode}: {summary}");
    }

    // One task of the held-out play on both models, paired per item (tests/integration/tasks.rs checks the scores).
    let tasks = &report["tasks"]["comparison"];
    assert_eq!(
        (tasks[0]["task"].clone(), tasks[0]["items"].clone()),
        ("tempest-next-word".into(), 38.into()),
        "{tasks}"
    );
    for deployment in ["fp8", "int4"] {
        let served = &report["serve_test"][deployment];
        assert_eq!(served["aborted"], 0, "{served}");
        assert!(served["mappings_verified"].as_u64().unwrap() > 0);
        let requests = served["requests"].as_array().unwrap();
        assert_eq!(requests.len(), 3);
        for request in requests {
            let text = request["text"].as_str().unwrap();
            assert!(printable(text), "{deployment}: {text:?} is not printable text");
        }
    }
    assert_eq!(report["serve_test"]["int4"]["kv_dtype"], "fp8");

    // The preset's computed sizes lie within 1 % of GLM-5's published 705 GiB FP8 and 421 GiB INT4 (docs/report.md).
    let budget = &report["report"];
    for (key, published) in [("source_gib", 705.0), ("output_gib", 421.0)] {
        let gib = number(budget, key);
        assert!((gib / published - 1.0).abs() < PUBLISHED_SIZE_TOLERANCE, "{key} {gib} vs published {published}");
    }
    assert!(number(&budget["decode"], "kv_capacity_tokens") > number(&budget["prefill"], "kv_capacity_tokens"));
}

#[test]
fn demo_prints_one_line_per_stage_and_the_commands_for_a_real_checkpoint_and_keeps_folders() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("kept");
    let run = squeeze(&["demo", "--keep", path_str(&keep)]).ok();
    let out = &run.stdout;
    for (index, stage) in ["model", "quantize", "verify --source", "inspect", "eval", "calibrate-kv"].iter().enumerate()
    {
        assert!(out.contains(&format!("[{}/10] {stage}: ", index + 1)), "{out}");
    }
    let needles = ["[7/10] eval --reference --candidate", "[8/10] eval --task: tempest-next-word", "[9/10] serve-test"];
    for needle in needles.into_iter().chain(["[10/10] report", "all 9 gates passed"]) {
        assert!(out.contains(needle), "`{needle}` missing:\n{out}");
    }
    assert!(out.contains("Shall I compare thee") && out.contains("INT4 →"), "{out}");
    assert!(!out.contains("RANDOM"), "{out}");
    let commands = ["squeeze quantize", "squeeze verify", "squeeze calibrate-kv", "squeeze eval --reference"];
    for command in commands.into_iter().chain(["--task tasks.jsonl"]) {
        assert!(out.contains(command), "`{command}` missing from the closing block:\n{out}");
    }
    assert!(keep.join("fp8/model.safetensors").is_file());
    assert!(keep.join("int4/kv-scales.safetensors").is_file());
}

#[test]
fn demo_on_random_glm5_weights_runs_every_stage_and_labels_them_random() {
    let run = squeeze(&["demo", "--arch", "glm5"]).ok();
    assert!(run.stdout.contains("RANDOM weights"), "{}", run.stdout);
    for stage in 1..=10 {
        assert!(run.stdout.contains(&format!("[{stage}/10]")), "{}", run.stdout);
    }
    assert!(run.stdout.contains("synth wrote a random GlmMoeDsaForCausalLM"), "{}", run.stdout);
}

/// Kimi K2.6 ships INT4: the demo copies it instead of quantizing, verifies the release without a source, and
/// compares the same weights with a BF16 and an FP8 KV cache (parity's `weights` mode is exactly zero).
#[test]
fn demo_on_kimi_k26_skips_quantize_and_compares_kv_caches_of_the_same_weights() {
    let report = squeeze(&["demo", "--arch", "kimi-k2.6", "--json"]).ok().json();
    let shipped = &report["quantize"]["already_int4"];
    assert_eq!(shipped["group_size"], 32, "{report:#}");
    assert!(shipped["modules"].as_u64().unwrap() > 0, "{report:#}");
    assert_eq!(report["verify"]["passed"], true, "{:#}", report["verify"]);
    assert_eq!(report["eval"]["ppl_ratio"], 1.0, "the copy has the source's weights");
    let modes = &report["parity"]["modes"];
    assert_eq!(modes["weights"]["mean_kld"], 0.0, "same weights, same KV: {:#}", modes["weights"]);
    assert!(modes["kv"]["mean_kld"].as_f64().unwrap() > 0.0, "FP8 KV must move the logits: {:#}", modes["kv"]);
    assert!(report["calibrate_kv"]["written"].as_array().is_some_and(|w| !w.is_empty()), "{report:#}");
    assert_eq!(report["passed"], true);
}
