//! The releases as they ship today through every subcommand: GLM-5.2 (a shared DSA indexer: no indexer tensors in
//! `shared` layers) and Kimi K2.6 (natively INT4 inside the `kimi_k25` vision-language wrapper), and the bad input
//! of their layouts.

use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::common::{expect_exit_2, path_str, squeeze, synth, tensor_names, Run};

const SONNETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

/// `eval --reference REFERENCE --candidate CANDIDATE` on two short chunks of the sonnets, as JSON.
fn parity(reference: &Path, candidate: &Path) -> Run {
    squeeze(&[
        "eval",
        "--reference",
        path_str(reference),
        "--candidate",
        path_str(candidate),
        "--data",
        SONNETS,
        "--ctx",
        "32",
        "--chunks",
        "2",
        "--json",
    ])
}

#[test]
fn glm52_with_shared_indexers_runs_every_subcommand() {
    let temp = tempfile::tempdir().unwrap();
    let source = synth(temp.path(), "glm52", "glm5.2", &["--layers", "4"]);
    let names = tensor_names(&source);
    assert!(names.iter().any(|n| n.starts_with("model.layers.2.self_attn.indexer.")), "layer 2 is full");
    assert!(!names.iter().any(|n| n.starts_with("model.layers.1.self_attn.indexer.")), "layer 1 is shared");

    let out = temp.path().join("int4");
    squeeze(&["quantize", path_str(&source), path_str(&out)]).ok();
    assert!(!tensor_names(&out).iter().any(|n| n.starts_with("model.layers.3.self_attn.indexer.")));
    let verify = squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--engine", "vllm"]).ok();
    assert!(
        verify.stdout.contains("indexer-schedule") && verify.stdout.contains("2 full, 2 shared"),
        "{}",
        verify.stdout
    );

    let eval = squeeze(&["eval", path_str(&out), "--data", SONNETS, "--ctx", "32", "--chunks", "2", "--json"]).ok();
    assert!(eval.json()["mean_nll"].as_f64().is_some_and(f64::is_finite), "{}", eval.stdout);
    squeeze(&["calibrate-kv", path_str(&out), "--data", SONNETS, "--seq-len", "32", "--samples", "2"]).ok();
    squeeze(&["serve-test", path_str(&out), "--prompt", "Shall I compare thee", "--max-new-tokens", "4"]).ok();
    let parity = parity(&source, &out);
    assert!(parity.code == 0 || parity.code == 1, "parity ran (gates may fail on random weights): {}", parity.stderr);

    let report = squeeze(&["report", path_str(&source), "--json"]).ok().json();
    assert_eq!(report["kv"]["fp8"]["indexer_layers"], 2, "{}", report["kv"]);
}

#[test]
fn glm52_report_preset_caches_indexer_keys_in_21_of_78_layers() {
    let report = squeeze(&["report", "glm-5.2", "--json", "--context", "1048576"]).ok().json();
    assert_eq!(report["kv"]["fp8"]["indexer_layers"], 21);
    assert_eq!(report["kv"]["fp8"]["bytes_per_token"], 78 * 576 + 21 * 132);
    let gib = |key: &str| report[key].as_f64().unwrap();
    assert!((700.0..715.0).contains(&gib("source_gib")), "{}", gib("source_gib"));
    assert!((415.0..430.0).contains(&gib("output_gib")), "{}", gib("output_gib"));
}

#[test]
fn glm52_bad_indexer_schedules_exit_2_naming_the_key() {
    let temp = tempfile::tempdir().unwrap();
    let source = synth(temp.path(), "glm52", "glm5.2", &["--layers", "4"]);
    edit_config(&source, |c| c["indexer_types"] = serde_json::json!(["full", "shared", "full"]));
    let run = squeeze(&["eval", path_str(&source), "--data", SONNETS, "--ctx", "16", "--chunks", "1"]);
    expect_exit_2(&run, &["indexer_types", "num_hidden_layers is 4"]);

    edit_config(&source, |c| c["indexer_types"] = serde_json::json!(["shared", "full", "full", "shared"]));
    let run = squeeze(&["quantize", path_str(&source), path_str(&temp.path().join("out"))]);
    expect_exit_2(&run, &["indexer_types", "layer 0"]);
    assert!(!temp.path().join("out").join("config.json").exists(), "nothing written");

    // A full layer without its indexer: the tensor is named.
    edit_config(&source, |c| c["indexer_types"] = serde_json::json!(["full", "full", "full", "shared"]));
    let run = squeeze(&["eval", path_str(&source), "--data", SONNETS, "--ctx", "16", "--chunks", "1"]);
    expect_exit_2(&run, &["model.layers.1.self_attn.indexer.wq_b.weight", "is missing"]);
}

#[test]
fn kimi_k26_as_shipped_runs_every_subcommand_but_quantize() {
    let temp = tempfile::tempdir().unwrap();
    let model = synth(temp.path(), "k26", "kimi-k2.6", &[]);
    let inspect = squeeze(&["inspect", path_str(&model), "--json"]).ok().json();
    assert_eq!(inspect["wrapper"]["architecture"], "KimiK25ForConditionalGeneration");
    assert_eq!(inspect["quantization_config"]["format"], "pack-quantized", "read from text_config");
    assert!(inspect["classes"]["vision"]["tensors"].as_u64().unwrap() > 0);
    // report counts a packed INT4 weight's codes (8 per I32 word), not its words, scales or weight_shape: the same
    // parameters synth made.
    let made = squeeze(&["synth", "--arch", "kimi-k2.6", path_str(&temp.path().join("again")), "--json"]).ok().json();
    let report = squeeze(&["report", path_str(&model), "--json"]).ok().json();
    assert_eq!(report["parameters"], made["parameters"], "{report}");

    let verify = squeeze(&["verify", path_str(&model), "--engine", "all"]).ok();
    assert!(verify.stdout.contains("no squeeze-manifest.json"), "{}", verify.stdout);

    let eval = squeeze(&["eval", path_str(&model), "--data", SONNETS, "--ctx", "32", "--chunks", "2", "--json"]).ok();
    assert!(eval.json()["mean_nll"].as_f64().is_some_and(f64::is_finite));
    // Parity of the same INT4 weights with a BF16 and an FP8 KV cache: the weights mode is exact.
    let parity = parity(&model, &model);
    let json = parity.json();
    assert_eq!(json["modes"]["weights"]["mean_kld"].as_f64(), Some(0.0), "{}", json["modes"]["weights"]);
    assert!(json["modes"]["kv"]["mean_kld"].as_f64().is_some_and(|kld| kld > 0.0), "FP8 KV changes something");

    squeeze(&["calibrate-kv", path_str(&model), "--data", SONNETS, "--seq-len", "32", "--samples", "2"]).ok();
    let names = tensor_names(&model);
    assert!(names.contains(&"language_model.model.layers.0.self_attn.k_scale".to_string()), "{names:?}");
    let config: Value = serde_json::from_str(&fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization_config").is_none(), "no top-level quantization_config hides text_config's");
    assert_eq!(config["text_config"]["quantization_config"]["kv_cache_scheme"]["num_bits"], 8);
    squeeze(&["verify", path_str(&model), "--engine", "all"]).ok();
    squeeze(&["serve-test", path_str(&model), "--prompt", "Shall I", "--max-new-tokens", "4", "--kv-dtype", "fp8"])
        .ok();

    let image = squeeze(&["serve-test", path_str(&model), "--prompt", "what is <|media_pad|>?"]);
    expect_exit_2(&image, &["<|media_pad|>", "text model only"]);
    let quantize = squeeze(&["quantize", path_str(&model), path_str(&temp.path().join("out"))]);
    expect_exit_2(&quantize, &["already INT4", "group size 32", "squeeze eval"]);
    assert!(!temp.path().join("out").exists(), "nothing written");
}

#[test]
fn kimi_k26_report_preset_doubles_kv_capacity_with_fp8() {
    let run = squeeze(&["report", "kimi-k2.6", "--kv-pool", "48.2GB", "--context", "21400", "--json"]).ok();
    let json = run.json();
    assert_eq!(json["prefill"]["kv_capacity_tokens"], 685_906);
    assert_eq!(json["decode"]["kv_capacity_tokens"], 1_371_812);
    assert_eq!(json["prefill"]["max_concurrency"], 32);
    assert_eq!(json["decode"]["max_concurrency"], 64);
    assert_eq!(json["source_bytes"], json["sizes"]["output_tensors"]["bytes"], "natively INT4: source = output");
}

#[test]
fn a_wrapper_without_the_text_keys_names_them() {
    let temp = tempfile::tempdir().unwrap();
    let model = synth(temp.path(), "k26", "kimi-k2.6", &[]);
    edit_config(&model, |c| {
        c["text_config"].as_object_mut().unwrap().remove("kv_lora_rank");
    });
    let run = squeeze(&["eval", path_str(&model), "--data", SONNETS, "--ctx", "16", "--chunks", "1"]);
    expect_exit_2(&run, &["text_config.kv_lora_rank"]);
}
