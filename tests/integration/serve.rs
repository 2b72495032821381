//! `squeeze serve-test`: batching and page size do not change greedy output, every injected mapping fault is caught
//! before the victim's next decode step without touching the other requests, and bad input exits 2.

use std::path::Path;

use serde_json::Value;

use super::common::{path_str, squeeze, synth};

const PROMPTS: [&str; 8] = [
    "the cat sat",
    "hello world, again",
    "abc",
    "numbers 1 2 3 4",
    "a longer prompt with several words in it",
    "x",
    "paged caches",
    "zz top",
];

fn serve(model: &Path, extra: &[&str]) -> super::common::Run {
    let mut args = vec!["serve-test", path_str(model), "--json", "--max-new-tokens", "10"];
    args.extend_from_slice(extra);
    squeeze(&args)
}

fn outputs(report: &Value) -> Vec<(String, Value)> {
    report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["status"].as_str().unwrap().to_string(), r["token_ids"].clone()))
        .collect()
}

fn with_prompts<'a>(args: &mut Vec<&'a str>, prompts: &[&'a str]) {
    for prompt in prompts {
        args.push("--prompt");
        args.push(prompt);
    }
}

#[test]
fn greedy_output_is_independent_of_batching_and_page_size() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "m", "glm5", &[]);
    let mut all = vec!["--concurrency", "8", "--page-size", "16"];
    with_prompts(&mut all, &PROMPTS);
    let batched = serve(&model, &all).ok().json();
    let batched = outputs(&batched);
    let alone = serve(&model, &["--concurrency", "1", "--prompt", PROMPTS[4]]).ok().json();
    assert_eq!(outputs(&alone)[0], batched[4], "alone vs among 8");
    for page_size in ["1", "64"] {
        let mut args = vec!["--concurrency", "3", "--page-size", page_size];
        with_prompts(&mut args, &PROMPTS);
        let report = serve(&model, &args).ok().json();
        assert_eq!(outputs(&report), batched, "page size {page_size}");
    }
}

#[test]
fn every_fault_kind_is_caught_and_only_its_requests_abort() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "m", "kimi-k2", &[]);
    let base = ["--concurrency", "8", "--page-size", "2"];
    let mut clean_args = base.to_vec();
    with_prompts(&mut clean_args, &PROMPTS);
    let clean = serve(&model, &clean_args).ok().json();
    assert_eq!(clean["faults_detected"], 0);
    assert_eq!(clean["aborted"], 0);
    let clean = outputs(&clean);
    for (seed, kind) in ["stale-page", "swap", "out-of-range", "tag-corrupt", "double-map"].iter().enumerate() {
        // A step in 1..7 (every request is still decoding: prompts ≥ 1 token, 10 new tokens, no EOS forced).
        let step = 1 + (seed * 5 + 3) % 6;
        let fault = format!("{kind}@{step}");
        let seed = seed.to_string();
        let mut args = base.to_vec();
        args.extend(["--inject-fault", &fault, "--seed", &seed]);
        with_prompts(&mut args, &PROMPTS);
        let run = serve(&model, &args);
        assert_eq!(run.code, 0, "{kind}: {}", run.stderr);
        let report = run.json();
        assert_eq!(report["faults_injected"], 1, "{kind}");
        assert_eq!(report["false_positives"], 0, "{kind}");
        assert_eq!(report["undetected"], 0, "{kind}");
        let affected: Vec<u64> =
            report["injected"][0]["affected"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        let expected = if *kind == "swap" { 2 } else { 1 };
        assert_eq!(affected.len(), expected, "{kind}");
        for (id, (status, tokens)) in outputs(&report).into_iter().enumerate() {
            if affected.contains(&(id as u64)) {
                assert_eq!(status, "aborted", "{kind}: victim {id}");
                // Detected before its next decode step: it holds exactly the tokens made before the fault step.
                assert_eq!(tokens.as_array().unwrap().len(), step + 1, "{kind}: victim {id}");
                let error = report["requests"][id]["error"].as_str().unwrap();
                assert!(error.contains("page"), "{kind}: {error}");
            } else {
                assert_eq!((status, tokens), clean[id].clone(), "{kind}: request {id} changed");
            }
        }
    }
}

#[test]
fn split_prefill_and_fp8_cache_run_and_warn_without_scales() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "src", "glm45", &[]);
    let int4 = dir.path().join("int4");
    squeeze(&["quantize", path_str(&source), path_str(&int4)]).ok();
    let run = serve(
        &int4,
        &["--prefill-model", path_str(&source), "--kv-dtype", "fp8", "--prompt", "hello", "--prompt", "two words"],
    )
    .ok();
    assert!(run.stderr.contains("squeeze calibrate-kv"), "{}", run.stderr);
    let report = run.json();
    assert_eq!(report["completed"], 2);
    assert_eq!(report["faults_detected"], 0);
}

#[test]
fn bad_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "m", "glm45", &[]);
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "\n\n").unwrap();
    let run = squeeze(&["serve-test", path_str(&model), "--prompts", path_str(&empty)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("no prompts"), "{}", run.stderr);

    let long = "word ".repeat(40);
    let run = squeeze(&["serve-test", path_str(&model), "--prompt", &long, "--kv-pages", "2", "--page-size", "4"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("longer than the KV pool"), "{}", run.stderr);

    let run = squeeze(&["serve-test", path_str(&model), "--prompt", "hi", "--kv-pages", "1", "--page-size", "4"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("too small for one request"), "{}", run.stderr);

    for file in ["tokenizer.json", "tokenizer_config.json", "tiktoken.model"] {
        let _ = std::fs::remove_file(model.join(file));
    }
    let run = squeeze(&["serve-test", path_str(&model), "--prompt", "hi"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("tokenizer"), "{}", run.stderr);
}
