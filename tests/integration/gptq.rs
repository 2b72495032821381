//! `squeeze quantize --method gptq` end to end: the output verifies and declares the scale rule's observer,
//! coverage is in `--json` and the manifest with never-routed experts listed as mse fallbacks, `--sequential` and
//! `--no-sequential` calibrate differently, `--resume` keeps a finished run and finishes a killed one byte for
//! byte, and bad flag combinations are usage errors (exit 2) naming the flags.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::calibrate::{never_routed_expert_source, write_tokens};
use crate::common::{files, path_str, read_json, squeeze, synth};

const TINY_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/tiny-shakespeare-fp8");
const SONNETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");

fn gptq_args<'a>(source: &'a Path, out: &'a Path, tokens: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["quantize", path_str(source), path_str(out), "--method", "gptq", "--device", "cpu"];
    args.extend_from_slice(&["--calibration", path_str(tokens)]);
    args.extend_from_slice(extra);
    args
}

#[test]
fn gptq_on_a_synth_model_verifies_records_coverage_and_lists_a_never_routed_expert() {
    let dir = tempfile::tempdir().unwrap();
    let (source, tokens) = never_routed_expert_source(dir.path());
    let (rows, ctx) = (3, 40);
    let out = dir.path().join("gptq");
    let report = squeeze(&gptq_args(&source, &out, &tokens, &["--json"])).ok().json();
    assert_eq!(report["gptq_algebra"], "host");
    let coverage = &report["expert_coverage"];
    assert_eq!(coverage["method"], "gptq");
    assert_eq!(coverage["tokens"], (rows * ctx) as u64);
    let top_k = coverage["top_k"].as_u64().unwrap();
    for layer in coverage["layers"].as_array().unwrap() {
        let routed: Vec<u64> = layer["routed"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        let fallback: Vec<u64> = layer["fallback"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(routed.iter().sum::<u64>(), (rows * ctx) as u64 * top_k);
        assert_eq!(routed[0], 0);
        for (expert, count) in routed.iter().enumerate() {
            assert_eq!(fallback.contains(&(expert as u64)), *count < 16, "expert {expert}: {count}");
        }
    }
    assert!(coverage["fell_back"].as_u64().unwrap() >= 2);
    assert!(coverage["calibrated"].as_u64().unwrap() > 0);
    let manifest = read_json(&out.join("squeeze-manifest.json"));
    assert_eq!(&manifest["expert_coverage"], coverage);
    // Plain pack-quantized, no act-order; the observer is the scale rule's (llm-compressor's GPTQ keeps the
    // scheme's observer too).
    let config = read_json(&out.join("config.json"));
    let weights = &config["quantization_config"]["config_groups"]["group_0"]["weights"];
    assert_eq!(weights["actorder"], Value::Null);
    assert_eq!(weights["observer"], "minmax");
    assert!(!files(&out).iter().any(|(name, _)| name.ends_with(".squeeze-tmp")), "temporaries are removed");
    squeeze(&["verify", path_str(&out), "--source", path_str(&source)]).ok();

    // Not the rtn output; and the two calibration orders differ (layer 2's inputs pass layer 1's experts).
    let rtn = dir.path().join("rtn");
    squeeze(&["quantize", path_str(&source), path_str(&rtn), "--device", "cpu"]).ok();
    assert_ne!(files(&out), files(&rtn));
    let parallel = dir.path().join("parallel");
    squeeze(&gptq_args(&source, &parallel, &tokens, &["--no-sequential"])).ok();
    assert_ne!(files(&out), files(&parallel));
    squeeze(&["verify", path_str(&parallel), "--source", path_str(&source)]).ok();
    // --sequential is the default.
    let explicit = dir.path().join("explicit");
    squeeze(&gptq_args(&source, &explicit, &tokens, &["--sequential", "--json"])).ok();
    assert_eq!(files(&out), files(&explicit));

    // Every token shown to every expert for the statistics: nobody falls back; routed counts stay the router's.
    let all = dir.path().join("all");
    let report = squeeze(&gptq_args(&source, &all, &tokens, &["--force-route-all", "--json"])).ok().json();
    assert_eq!(report["expert_coverage"]["fell_back"], 0);
    assert_eq!(report["expert_coverage"]["layers"][0]["routed"][0], 0);
}

#[test]
fn gptq_on_the_trained_tiny_model_with_text_calibration_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("int4");
    let text = Path::new(SONNETS);
    let report = squeeze(&gptq_args(Path::new(TINY_MODEL), &out, text, &["--seq-len", "128", "--json"])).ok().json();
    assert_eq!(report["expert_coverage"]["tokens"].as_u64().unwrap() % 128, 0);
    squeeze(&["verify", path_str(&out), "--source", TINY_MODEL]).ok();
}

#[test]
fn resume_keeps_a_gptq_run_and_refuses_another_calibration_order() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "kimi-k2", &["--layers", "2", "--shards", "2"]);
    let tokens = dir.path().join("calibration.safetensors");
    write_tokens(&tokens, 2, 24, 384);
    let out = dir.path().join("int4");
    let run = |extra: &[&str]| {
        let mut all = vec!["--max-shard-size", "64KB", "--json"];
        all.extend_from_slice(extra);
        squeeze(&gptq_args(&source, &out, &tokens, &all))
    };
    let first = run(&[]).ok().json();
    let before = files(&out);
    let resumed = run(&["--resume"]).ok().json();
    assert_eq!(resumed["shards_reused"], first["shards"]);
    assert_eq!(files(&out), before);
    let other = run(&["--resume", "--no-sequential"]);
    assert_eq!(other.code, 2, "{}", other.stderr);
    assert!(other.stderr.contains("different source, recipe or options"), "{}", other.stderr);
}

#[test]
fn a_gptq_run_killed_after_its_first_layer_resumes_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "glm5", &["--layers", "4", "--experts", "16"]);
    let tokens = dir.path().join("calibration.safetensors");
    write_tokens(&tokens, 4, 64, 384);
    for (name, order) in [("parallel", "--no-sequential"), ("sequential", "--sequential")] {
        let clean = dir.path().join(format!("{name}-clean"));
        squeeze(&gptq_args(&source, &clean, &tokens, &[order])).ok();
        let killed = dir.path().join(format!("{name}-killed"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_squeeze"))
            .args(gptq_args(&source, &killed, &tokens, &[order]))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Kill it as soon as one MoE layer's quantized experts are on disk.
        let deadline = Instant::now() + Duration::from_secs(120);
        let finished_layer = || {
            fs::read_dir(&killed).is_ok_and(|entries| {
                entries.flatten().any(|entry| entry.file_name().to_string_lossy().contains(".index.squeeze-tmp"))
            })
        };
        while Instant::now() < deadline && !finished_layer() {
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(!killed.join("config.json").exists(), "{name}: the run finished before it could be killed");
        let resumed = squeeze(&gptq_args(&source, &killed, &tokens, &[order, "--resume", "--json"])).ok().json();
        assert!(resumed["calibration_layers_reused"].as_u64().unwrap() >= 1, "{name}: {resumed}");
        assert_eq!(files(&clean), files(&killed), "{name}");
    }
}

#[test]
fn bad_flag_combinations_are_usage_errors_naming_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "kimi-k2", &["--layers", "2"]);
    let tokens = dir.path().join("t.safetensors");
    write_tokens(&tokens, 1, 8, 384);
    let out = dir.path().join("int4");
    let cases: [(&[&str], &[&str]); 5] = [
        (&["--method", "gptq"], &["--method gptq", "--calibration"]),
        (&["--sequential"], &["--sequential", "--method gptq"]),
        (&["--method", "imatrix", "--calibration", path_str(&tokens), "--no-sequential"], &["--no-sequential"]),
        (&["--force-route-all"], &["--force-route-all", "--method"]),
        (&["--method", "gptq", "--calibration", path_str(&tokens), "--samples", "0"], &["--samples"]),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["quantize", path_str(&source), path_str(&out)];
        args.extend_from_slice(flags);
        let run = squeeze(&args);
        assert_eq!(run.code, 2, "{flags:?}: stderr:\n{}", run.stderr);
        for text in expected {
            assert!(run.stderr.contains(text), "{flags:?}: {}", run.stderr);
        }
        assert!(!out.join("config.json").exists());
    }
}
