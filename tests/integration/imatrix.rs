//! `squeeze quantize --method imatrix` end to end: the output verifies, coverage counts sum to tokens × top_k per
//! MoE layer, an expert the router never picks falls back to mse and is listed, `--resume` keeps a finished run and
//! refuses other calibration options, `--method rtn` is the default byte for byte, a missing `--calibration` is
//! a usage error naming the flag, and an unusable output folder is refused before the calibration pass.

use std::fs;

use serde_json::Value;

use crate::calibrate::{never_routed_expert_source, write_tokens};
use crate::common::{files, path_str, read_json, squeeze, synth};

const TINY_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/tiny-shakespeare-fp8");
const SONNETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");

/// Per MoE layer of `coverage`: (layer, routed counts, fallback experts).
fn layers(coverage: &Value) -> Vec<(u64, Vec<u64>, Vec<u64>)> {
    let numbers =
        |value: &Value| -> Vec<u64> { value.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect() };
    coverage["layers"]
        .as_array()
        .expect("coverage layers")
        .iter()
        .map(|layer| (layer["layer"].as_u64().unwrap(), numbers(&layer["routed"]), numbers(&layer["fallback"])))
        .collect()
}

#[test]
fn imatrix_on_a_synth_model_verifies_counts_routed_tokens_and_lists_a_never_routed_expert() {
    let dir = tempfile::tempdir().unwrap();
    let (source, tokens) = never_routed_expert_source(dir.path());
    let (rows, ctx) = (3, 40);
    let out = dir.path().join("int4");
    let run = squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&out),
        "--method",
        "imatrix",
        "--calibration",
        path_str(&tokens),
        "--device",
        "cpu",
        "--json",
    ])
    .ok();
    let report = run.json();
    let coverage = &report["expert_coverage"];
    assert_eq!(coverage["tokens"], (rows * ctx) as u64);
    let top_k = coverage["top_k"].as_u64().unwrap();
    let per_layer = layers(coverage);
    assert_eq!(per_layer.iter().map(|(layer, _, _)| *layer).collect::<Vec<_>>(), [1, 2]);
    for (layer, routed, fallback) in &per_layer {
        assert_eq!(routed.iter().sum::<u64>(), (rows * ctx) as u64 * top_k, "layer {layer}: {routed:?}");
        assert_eq!(routed[0], 0, "layer {layer}: expert 0 is never routed");
        assert!(fallback.contains(&0), "layer {layer}: expert 0 falls back: {fallback:?}");
        for (expert, count) in routed.iter().enumerate() {
            assert_eq!(fallback.contains(&(expert as u64)), *count < 16, "layer {layer} expert {expert}: {count}");
        }
    }
    let fell_back: usize = per_layer.iter().map(|(_, _, fallback)| fallback.len()).sum();
    assert_eq!(coverage["fell_back"], fell_back as u64);
    assert_eq!(coverage["experts"], 16);
    assert_eq!(coverage["calibrated"], 16 - fell_back as u64);
    // Recorded in the manifest too, and the observer names the method.
    let manifest = read_json(&out.join("squeeze-manifest.json"));
    assert_eq!(&manifest["expert_coverage"], coverage);
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["quantization_config"]["config_groups"]["group_0"]["weights"]["observer"], "imatrix_mse");
    squeeze(&["verify", path_str(&out), "--source", path_str(&source)]).ok();

    // The human summary lists the fallback.
    let human = squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&dir.path().join("human")),
        "--method",
        "imatrix",
        "--calibration",
        path_str(&tokens),
        "--device",
        "cpu",
    ])
    .ok();
    let line = human.stdout.lines().find(|line| line.contains("experts calibrated")).expect("a coverage line");
    assert!(line.contains(&format!("{} of 16 experts calibrated", 16 - fell_back)), "{line}");
    assert!(line.contains("L1 e0") && line.contains("L2 e0"), "{line}");

    // Every token shown to every expert: nobody falls back; routed counts are still the router's.
    let all = squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&dir.path().join("all")),
        "--method",
        "imatrix",
        "--calibration",
        path_str(&tokens),
        "--force-route-all",
        "--device",
        "cpu",
        "--json",
    ])
    .ok()
    .json();
    assert_eq!(all["expert_coverage"]["fell_back"], 0);
    assert_eq!(all["expert_coverage"]["force_route_all"], true);
    for (layer, routed, fallback) in layers(&all["expert_coverage"]) {
        assert!(fallback.is_empty(), "layer {layer}: {fallback:?}");
        assert_eq!(routed[0], 0);
    }
    // Calibrated scales are not the rtn ones.
    let rtn = dir.path().join("rtn");
    squeeze(&["quantize", path_str(&source), path_str(&rtn), "--scale-rule", "mse", "--device", "cpu"]).ok();
    assert_ne!(files(&out), files(&rtn));
}

#[test]
fn imatrix_on_the_trained_tiny_model_with_text_calibration_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("int4");
    let report = squeeze(&[
        "quantize",
        TINY_MODEL,
        path_str(&out),
        "--method",
        "imatrix",
        "--calibration",
        SONNETS,
        "--seq-len",
        "128",
        "--device",
        "cpu",
        "--json",
    ])
    .ok()
    .json();
    let coverage = &report["expert_coverage"];
    let tokens = coverage["tokens"].as_u64().unwrap();
    assert_eq!(tokens % 128, 0);
    for (layer, routed, _) in layers(coverage) {
        assert_eq!(routed.iter().sum::<u64>(), tokens * coverage["top_k"].as_u64().unwrap(), "layer {layer}");
    }
    squeeze(&["verify", path_str(&out), "--source", TINY_MODEL]).ok();
}

#[test]
fn method_rtn_is_the_default_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "glm45", &["--layers", "2"]);
    let default = dir.path().join("default");
    let rtn = dir.path().join("rtn");
    squeeze(&["quantize", path_str(&source), path_str(&default), "--device", "cpu"]).ok();
    squeeze(&["quantize", path_str(&source), path_str(&rtn), "--method", "rtn", "--device", "cpu"]).ok();
    assert_eq!(files(&default), files(&rtn));
    assert!(read_json(&rtn.join("squeeze-manifest.json")).get("expert_coverage").is_none());
}

#[test]
fn imatrix_without_calibration_is_a_usage_error_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "kimi-k2", &["--layers", "2"]);
    let out = dir.path().join("int4");
    let run = squeeze(&["quantize", path_str(&source), path_str(&out), "--method", "imatrix"]);
    assert_eq!(run.code, 2, "stderr:\n{}", run.stderr);
    assert!(run.stderr.contains("--calibration"), "{}", run.stderr);
    assert!(!out.join("config.json").exists());
    // And calibration for rtn is refused, naming both flags.
    let tokens = dir.path().join("t.safetensors");
    write_tokens(&tokens, 1, 8, 384);
    let run = squeeze(&["quantize", path_str(&source), path_str(&out), "--calibration", path_str(&tokens)]);
    assert_eq!(run.code, 2, "stderr:\n{}", run.stderr);
    assert!(run.stderr.contains("--calibration") && run.stderr.contains("--method imatrix"), "{}", run.stderr);
}

#[test]
fn a_non_empty_output_folder_is_refused_before_the_calibration_pass() {
    // The calibration file does not exist: were the pass run first, the error would name it.
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "kimi-k2", &["--layers", "2"]);
    let out = dir.path().join("int4");
    fs::create_dir_all(&out).unwrap();
    fs::write(out.join("notes.txt"), "someone else's file").unwrap();
    let missing = dir.path().join("no-such-calibration.txt");
    let run = squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&out),
        "--method",
        "imatrix",
        "--calibration",
        path_str(&missing),
    ]);
    assert_eq!(run.code, 2, "stderr:\n{}", run.stderr);
    assert!(run.stderr.contains("is not empty"), "{}", run.stderr);
    assert!(!run.stderr.contains("no-such-calibration"), "{}", run.stderr);
    assert_eq!(fs::read_to_string(out.join("notes.txt")).unwrap(), "someone else's file");
}

#[test]
fn resume_keeps_an_imatrix_run_and_refuses_other_calibration() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "kimi-k2", &["--layers", "2", "--shards", "2"]);
    let tokens = dir.path().join("calibration.safetensors");
    write_tokens(&tokens, 2, 24, 384);
    let out = dir.path().join("int4");
    let args = |extra: &[&str]| {
        let mut args = vec!["quantize", path_str(&source), path_str(&out), "--method", "imatrix", "--device", "cpu"];
        args.extend_from_slice(&["--calibration", path_str(&tokens), "--max-shard-size", "64KB", "--json"]);
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| squeeze(&args(extra).iter().map(String::as_str).collect::<Vec<_>>());
    let first = run(&[]).ok().json();
    let before = files(&out);
    let resumed = run(&["--resume"]).ok().json();
    assert_eq!(resumed["shards_reused"], first["shards"]);
    assert_eq!(files(&out), before);
    // Other calibration options make another plan: --resume refuses to mix them.
    let other = run(&["--resume", "--min-expert-tokens", "1"]);
    assert_eq!(other.code, 2, "{}", other.stderr);
    assert!(other.stderr.contains("different source, recipe or options"), "{}", other.stderr);
}
