//! `serve-test` with the decode step's cache write, mapping verification and attention on the device (`--device
//! emulated`: kernels/kv_write.cu and kernels/paged_attention.cu compiled for the host, the pool resident across
//! steps, MLA in the absorbed form, GLM-5's DSA selection over the cached indexer keys by kernels/indexer.cu) against
//! `--device cpu`: the same greedy tokens and statuses on the three architectures with BF16 and FP8 caches while
//! requests join mid-run, two activation copies per decode step (tokens in, logits out), and every injected mapping
//! fault detected by the fused check with only its requests aborted.

use std::path::Path;

use serde_json::Value;

use crate::common::{path_str, squeeze, synth, Run};

/// A small model: emulation runs every CUDA thread as a fiber.
const SMALL: [&str; 10] =
    ["--layers", "2", "--hidden", "96", "--experts", "4", "--moe-intermediate", "64", "--vocab", "260"];

/// Four prompts, two at a time: requests finish and others join while the batch runs (GLM-5's `index_topk` is 8,
/// so the longer contexts select keys).
const PROMPTS: [&str; 4] = ["the cat sat on the mat", "hi", "paged caches on a device", "x y"];
const NEW_TOKENS: &str = "5";

fn serve(model: &Path, device: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "serve-test",
        path_str(model),
        "--json",
        "--device",
        device,
        "--max-new-tokens",
        NEW_TOKENS,
        "--concurrency",
        "2",
        "--page-size",
        "3",
    ];
    for prompt in PROMPTS {
        args.extend(["--prompt", prompt]);
    }
    args.extend_from_slice(extra);
    squeeze(&args)
}

/// Per request: status, generated token ids, error.
fn outcomes(report: &Value) -> Vec<(String, Value, Value)> {
    report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["status"].as_str().unwrap().to_string(), r["token_ids"].clone(), r["error"].clone()))
        .collect()
}

fn check_same(cpu: &Value, gpu: &Value, what: &str) {
    assert_eq!(outcomes(cpu), outcomes(gpu), "{what}: requests differ between cpu and emulated");
    for counter in ["mappings_verified", "faults_detected", "requests_aborted", "decode_steps", "pages_peak"] {
        assert_eq!(cpu[counter], gpu[counter], "{what}: {counter}");
    }
}

#[test]
fn device_decode_matches_the_cpu_on_every_architecture_and_cache_dtype() {
    let dir = tempfile::tempdir().unwrap();
    // Each architecture once, both cache dtypes covered (every emulated run costs about a minute on 2 cores).
    for (arch, dtype) in [("kimi-k2", "fp8"), ("glm45", "bf16"), ("glm5", "fp8")] {
        let model = synth(dir.path(), arch, arch, &SMALL);
        {
            let extra = ["--kv-dtype", dtype];
            let cpu = serve(&model, "cpu", &extra).ok().json();
            let gpu = serve(&model, "emulated", &extra).ok().json();
            let what = format!("{arch} {dtype}");
            check_same(&cpu, &gpu, &what);
            assert_eq!(gpu["completed"], PROMPTS.len(), "{what}");
            assert_eq!(gpu["faults_detected"], 0, "{what}");
            assert!(gpu["mappings_verified"].as_u64().unwrap() > 0, "{what}");
            // The residual stream, cache rows, queries and DSA keys stay on the device: per step the embeddings go
            // up once and the logits come back once.
            let activations = &gpu["decode_device"]["transfers"]["activations"];
            let steps = gpu["decode_steps"].as_u64().unwrap();
            let count = |key: &str| activations[key].as_u64().unwrap();
            assert_eq!((count("h2d_count"), count("d2h_count")), (steps, steps), "{what}: {activations}");
            // Each decision download is a wait for the device: per layer and step at most the fault flags and the
            // routes (the routing kernel's three outputs joined on the device, one download).
            let downloads = gpu["decode_device"]["transfers"]["decisions"]["d2h_count"].as_u64().unwrap();
            let layers = 2; // SMALL
            assert!(downloads <= 2 * layers * steps, "{what}: {downloads} decision downloads in {steps} steps");
        }
    }
}

#[test]
fn the_fused_check_catches_every_fault_kind_and_aborts_only_its_requests() {
    let dir = tempfile::tempdir().unwrap();
    // Every kind on Kimi (absorbed MLA on the device); one on GLM-5, whose selecting layers verify on the host.
    let kinds = ["stale-page", "swap", "out-of-range", "tag-corrupt", "double-map"];
    for (arch, kinds) in [("kimi-k2", &kinds[..]), ("glm5", &kinds[..1])] {
        let model = synth(dir.path(), arch, arch, &SMALL);
        // The clean run on the CPU: the first test shows the emulated device gives the same.
        let clean = serve(&model, "cpu", &[]).ok().json();
        assert_eq!(clean["aborted"], 0, "{arch}");
        let clean = outcomes(&clean);
        for (seed, kind) in kinds.iter().enumerate() {
            // Steps 1..=3: both requests of the first pair are still decoding (5 new tokens, no EOS in this vocab).
            let step = 1 + (seed * 2 + 1) % 3;
            let (fault, seed) = (format!("{kind}@{step}"), seed.to_string());
            let extra = ["--inject-fault", fault.as_str(), "--seed", seed.as_str()];
            let run = serve(&model, "emulated", &extra);
            assert_eq!(run.code, 0, "{arch} {kind}: {}", run.stderr);
            let report = run.json();
            let what = format!("{arch} {kind}@{step}");
            assert_eq!(report["faults_injected"], 1, "{what}");
            assert_eq!(report["false_positives"], 0, "{what}");
            assert_eq!(report["undetected"], 0, "{what}");
            let affected: Vec<u64> =
                report["injected"][0]["affected"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            assert_eq!(affected.len(), if *kind == "swap" { 2 } else { 1 }, "{what}");
            for (id, (status, tokens, error)) in outcomes(&report).into_iter().enumerate() {
                if affected.contains(&(id as u64)) {
                    assert_eq!(status, "aborted", "{what}: victim {id}");
                    // Caught in the step it was injected before: the tokens made in the steps before it.
                    assert_eq!(tokens.as_array().unwrap().len(), step + 1, "{what}: victim {id}");
                    let error = error.as_str().unwrap();
                    assert!(error.contains("logical page"), "{what}: {error}");
                } else {
                    assert_eq!((status, tokens, error), clean[id].clone(), "{what}: request {id} changed");
                }
            }
            // The host verification finds the same faults, aborts the same requests, with the same messages.
            let cpu = serve(&model, "cpu", &extra).ok().json();
            check_same(&cpu, &report, &what);
        }
    }
}

#[test]
fn speculative_decoding_on_the_device_matches_the_cpu_and_catches_a_rollback_left_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm45", "glm45", &SMALL);
    // Several tokens of one request verified in one device step and rejected drafts rolled back (untrained MTP: most
    // drafts are rejected, so every step rolls back), with one rolled-back page left mapped (one emulated run, with
    // its plain greedy check, costs about three minutes on 2 cores).
    let cpu = serve(&model, "cpu", &["--speculative", "mtp=2"]).ok().json();
    assert!(cpu["speculative"]["pages_rolled_back"].as_u64().unwrap() > 0, "{}", cpu["speculative"]);
    let faulty = ["--speculative", "mtp=2", "--inject-fault", "rollback-stale@1"];
    let report = serve(&model, "emulated", &faulty).ok().json();
    assert_eq!((report["faults_injected"].as_u64(), report["undetected"].as_u64()), (Some(1), Some(0)), "{report}");
    assert_eq!((report["false_positives"].as_u64(), report["aborted"].as_u64()), (Some(0), Some(1)));
    assert_eq!(report["speculative"]["identical_to_greedy"], true, "{}", report["speculative"]);
    let victim = report["injected"][0]["victim"].as_u64().unwrap() as usize;
    for (id, (cpu, gpu)) in outcomes(&cpu).into_iter().zip(outcomes(&report)).enumerate() {
        if id != victim {
            assert_eq!(cpu, gpu, "request {id}: the device's speculative tokens are the CPU's");
        }
    }
}

/// Kimi-Linear (a KDA layer, then a NoPE MLA layer): the KDA states live in the pool's state slots on either
/// backend, so the device run decodes the CPU's tokens; every state fault aborts exactly its victims at the step it
/// was injected before, the other requests decode as in the clean run, and the device run catches one as the CPU does.
#[test]
fn kda_state_slots_decode_on_the_device_as_on_the_cpu_and_catch_every_state_fault() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "kimi-linear", "kimi-linear", &SMALL);
    let extra = ["--kv-dtype", "fp8"];
    let cpu = serve(&model, "cpu", &extra).ok().json();
    let gpu = serve(&model, "emulated", &extra).ok().json();
    check_same(&cpu, &gpu, "kimi-linear fp8");
    assert_eq!(gpu["completed"], PROMPTS.len());
    let clean = outcomes(&cpu);
    for (seed, kind) in ["state-swap", "state-stale", "state-corrupt", "state-size"].into_iter().enumerate() {
        let step = 1 + seed % 3;
        let (fault, seed) = (format!("{kind}@{step}"), seed.to_string());
        let extra = ["--kv-dtype", "fp8", "--inject-fault", fault.as_str(), "--seed", seed.as_str()];
        let report = serve(&model, "cpu", &extra).ok().json();
        let what = format!("kimi-linear {kind}@{step}");
        assert_eq!((report["faults_injected"].clone(), report["undetected"].clone()), (1.into(), 0.into()), "{what}");
        assert_eq!(report["false_positives"], 0, "{what}");
        let affected: Vec<u64> =
            report["injected"][0]["affected"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(affected.len(), if kind == "state-swap" { 2 } else { 1 }, "{what}");
        for (id, (status, tokens, error)) in outcomes(&report).into_iter().enumerate() {
            if affected.contains(&(id as u64)) {
                assert_eq!(status, "aborted", "{what}: victim {id}");
                assert_eq!(tokens.as_array().unwrap().len(), step + 1, "{what}: victim {id}");
                assert!(error.as_str().unwrap().contains("state slot"), "{what}: {error}");
            } else {
                assert_eq!((status, tokens, error), clean[id].clone(), "{what}: request {id} changed");
            }
        }
        if kind == "state-swap" {
            check_same(&report, &serve(&model, "emulated", &extra).ok().json(), &what);
        }
    }
}
