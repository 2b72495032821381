//! Hostile inputs and situations: a closed stdout, non-finite weights, a config that lies about the weights,
//! flags that make no sense, a folder another run holds, calibrate-kv killed at every rename of its commit,
//! SIGINT during quantize, fault injection that could not happen. Each ends with exit 2 (or a quiet 0 for a
//! closed pipe) and a message naming the file, tensor or flag — never a panic, never a silent success.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::calibrate::{edit_tensor, write_tokens};
use crate::common::{path_str, squeeze, synth};

fn no_panic(run: &crate::common::Run) {
    assert!(!run.stderr.contains("panicked"), "panic: {}", run.stderr);
    assert_ne!(run.code, 101, "panic exit: {}", run.stderr);
}

#[test]
fn a_closed_stdout_is_a_quiet_exit() {
    for args in [&["report", "glm-5"][..], &["report", "glm-5", "--json"], &["--version"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_squeeze"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before the first line.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
    }
}

#[test]
fn non_finite_weights_are_refused_named_or_reported() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "fp8", "glm45", &[]);
    let expert = "model.layers.1.mlp.experts.0.up_proj.weight";
    edit_tensor(&model, expert, |bytes, dtype| {
        assert_eq!(dtype, "F8_E4M3");
        bytes[37] = 0x7F; // e4m3fn NaN
    });
    let out = dir.path().join("int4");
    let run = squeeze(&["quantize", path_str(&model), path_str(&out)]);
    no_panic(&run);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains(expert) && run.stderr.contains("element 37"), "{}", run.stderr);
    assert!(run.stderr.contains("--allow-nonfinite"), "{}", run.stderr);
    assert!(!out.join("config.json").exists());

    // A non-expert FP8 weight with NaN, carried into BF16 on request: verify then says it is there.
    let attention = "model.layers.0.self_attn.o_proj.weight";
    let model2 = synth(dir.path(), "fp8b", "glm45", &[]);
    edit_tensor(&model2, attention, |bytes, _| bytes[5] = 0xFF);
    let out2 = dir.path().join("int4b");
    squeeze(&["quantize", path_str(&model2), path_str(&out2), "--allow-nonfinite"]).ok();
    let verify = squeeze(&["verify", path_str(&out2)]);
    assert_eq!(verify.code, 1, "{}", verify.stdout);
    assert!(verify.stdout.contains(attention) && verify.stdout.contains("NaN or infinite"), "{}", verify.stdout);
    // eval never reports a NaN perplexity as a result: the runtime refuses the weight, naming it.
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 2, 16, 384);
    let eval = squeeze(&["eval", path_str(&out2), "--tokens", path_str(&tokens)]);
    no_panic(&eval);
    assert_eq!(eval.code, 2, "{}{}", eval.stdout, eval.stderr);
    assert!(eval.stderr.contains(attention) && eval.stderr.contains("NaN"), "{}", eval.stderr);
}

#[test]
fn a_config_that_disagrees_with_the_weights_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm5", "glm5", &[]);
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 1, 16, 384);
    let config_path = model.join("config.json");
    let original: Value = serde_json::from_slice(&fs::read(&config_path).unwrap()).unwrap();
    assert!(original["num_nextn_predict_layers"].as_u64().unwrap() >= 1, "glm5 synth has an MTP layer");
    type Edit = fn(&mut Value);
    let edits: [(&str, Edit, &str); 3] = [
        (
            "one more layer",
            |c| c["num_hidden_layers"] = Value::from(c["num_hidden_layers"].as_u64().unwrap() + 1),
            "multi-token-prediction",
        ),
        (
            "one layer fewer",
            |c| c["num_hidden_layers"] = Value::from(c["num_hidden_layers"].as_u64().unwrap() - 1),
            "beyond num_hidden_layers",
        ),
        (
            "another expert width",
            |c| c["moe_intermediate_size"] = Value::from(c["moe_intermediate_size"].as_u64().unwrap() + 8),
            "the config implies",
        ),
    ];
    for (what, edit, expected) in edits {
        let mut config = original.clone();
        edit(&mut config);
        fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();
        for args in [
            vec!["eval", path_str(&model), "--tokens", path_str(&tokens)],
            vec!["calibrate-kv", path_str(&model), "--tokens", path_str(&tokens), "--dry-run"],
            vec!["serve-test", path_str(&model), "--prompt", "hi", "--max-new-tokens", "2"],
        ] {
            let run = squeeze(&args);
            no_panic(&run);
            assert_eq!(run.code, 2, "{what}: {args:?}: {}", run.stderr);
            assert!(
                run.stderr.contains("disagrees with the weights") && run.stderr.contains(expected),
                "{what}: {}",
                run.stderr
            );
        }
    }
    fs::write(&config_path, serde_json::to_vec(&original).unwrap()).unwrap();
    squeeze(&["eval", path_str(&model), "--tokens", path_str(&tokens)]).ok();
}

#[test]
fn flags_that_make_no_sense_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "kimi", "kimi-k2", &[]);
    let m = path_str(&model);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["eval", m, "--data", m, "--chunks", "0"], "--chunks"),
        (vec!["eval", m, "--data", m, "--ctx", "0"], "--ctx"),
        (vec!["calibrate-kv", m, "--data", m, "--samples", "0"], "--samples"),
        (vec!["serve-test", m, "--prompt", "a", "--temperature", "nan"], "--temperature"),
        (vec!["serve-test", m, "--prompt", "a", "--top-p", "0"], "--top-p"),
        (vec!["serve-test", m, "--prompt", "a", "--top-p", "1.5"], "--top-p"),
        (vec!["serve-test", m, "--prompt", "a", "--page-size", "100000000"], "--page-size"),
        (vec!["verify", m, "--max-int4-error", "nan"], "--max-int4-error"),
        (vec!["eval", "--reference", m, "--candidate", m, "--data", m, "--max-ppl-ratio", "nan"], "--max-ppl-ratio"),
        (vec!["eval", "--reference", m, "--candidate", m, "--data", m, "--min-same-top", "101"], "--min-same-top"),
        (vec!["report", "glm-5", "--group-size", "7"], "group size 7"),
    ];
    for (args, flag) in cases {
        let run = squeeze(&args);
        no_panic(&run);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(flag), "{args:?} should name {flag}: {}", run.stderr);
    }
    // A KV pool that cannot fit in memory is refused before it is allocated.
    let run = squeeze(&["serve-test", m, "--prompt", "a", "--page-size", "1000000", "--kv-pages", "100000000"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("lower --page-size or --kv-pages"), "{}", run.stderr);
}

#[test]
fn fault_injection_that_cannot_happen_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm45", "glm45", &[]);
    let m = path_str(&model);
    let base = ["serve-test", m, "--prompt", "abc", "--max-new-tokens", "4"];
    let run = squeeze(&[&base[..], &["--inject-fault", "stale-page@3"]].concat());
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("at most 3 steps"), "{}", run.stderr);
    let run = squeeze(&[&base[..], &["--inject-fault", "swap@1"]].concat());
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("two requests"), "{}", run.stderr);
    // A cache kind's pages exist on DeepSeek-V4 only; a fault that does not apply to pages cannot name one.
    let run = squeeze(&[&base[..], &["--inject-fault", "tag-corrupt:window@1"]].concat());
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("keeps no DeepSeek-V4 cache pages"), "{}", run.stderr);
    let run = squeeze(&[&base[..], &["--inject-fault", "rollback-stale:entries"]].concat());
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("does not apply to a cache kind's pages"), "{}", run.stderr);
    // Without verification an out-of-range page is stopped by a bounds check: counted as stopped, not lost.
    let run = squeeze(&[&base[..], &["--inject-fault", "out-of-range@1", "--no-verify", "--json"]].concat());
    let report = run.json();
    assert_eq!(report["faults_injected"], 1, "{report}");
    assert_eq!(
        report["faults_stopped"].as_u64().unwrap() + report["undetected"].as_u64().unwrap(),
        1,
        "every injected fault is counted: {report}"
    );
}

#[test]
fn one_writer_per_folder() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "fp8", "kimi-k2", &[]);
    let out = dir.path().join("int4");
    fs::create_dir_all(&out).unwrap();
    // A live holder (this test process) on this host.
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    fs::write(out.join(".squeeze.lock"), format!("{}\n{}\nquantize\n", std::process::id(), host.trim())).unwrap();
    let run = squeeze(&["quantize", path_str(&model), path_str(&out), "--force"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("in use by another squeeze run") && run.stderr.contains(&std::process::id().to_string()),
        "{}",
        run.stderr
    );
    assert!(!out.join("config.json").exists());
    // A dead holder's lock is reclaimed, and released at the end.
    fs::write(out.join(".squeeze.lock"), format!("{}\n{}\nquantize\n", (1u32 << 22) + 1, host.trim())).unwrap();
    squeeze(&["quantize", path_str(&model), path_str(&out), "--force"]).ok();
    assert!(!out.join(".squeeze.lock").exists());
    squeeze(&["verify", path_str(&out)]).ok();
    // --force removes the shards of an earlier run with another layout: no stray shard survives.
    let stray = out.join("model-00009-of-00009.safetensors");
    fs::copy(
        out.join(
            fs::read_dir(&out)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .find(|n| n.to_string_lossy().ends_with(".safetensors"))
                .unwrap(),
        ),
        &stray,
    )
    .unwrap();
    squeeze(&["quantize", path_str(&model), path_str(&out), "--force", "--scale-rule", "absmax7"]).ok();
    assert!(!stray.exists(), "a stray shard of another run survived --force");
    // --resume on a folder holding only a temporary file starts fresh.
    let fresh = dir.path().join("fresh");
    fs::create_dir_all(&fresh).unwrap();
    fs::write(fresh.join("squeeze-manifest.json.squeeze-tmp"), b"{").unwrap();
    squeeze(&["quantize", path_str(&model), path_str(&fresh), "--resume"]).ok();
    assert!(!fresh.join("squeeze-manifest.json.squeeze-tmp").exists());
}

fn index_and_config(dir: &Path) -> (bool, bool) {
    let index: Value = serde_json::from_slice(&fs::read(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    let config: Value = serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap();
    let listed = index["weight_map"].get("model.layers.0.self_attn.k_scale").is_some();
    let scheme = !config["quantization_config"]["kv_cache_scheme"].is_null();
    (listed, scheme)
}

#[test]
fn calibrate_kv_killed_at_every_rename_is_completed_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "glm45", &[]);
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 2, 16, 384);
    for renames in 0..3 {
        let model = dir.path().join(format!("int4-{renames}"));
        squeeze(&["quantize", path_str(&source), path_str(&model)]).ok();
        let output = Command::new(env!("CARGO_BIN_EXE_squeeze"))
            .args(["calibrate-kv", path_str(&model), "--tokens", path_str(&tokens)])
            .env("SQUEEZE_FAIL_AFTER_RENAMES", renames.to_string())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(3), "the failpoint stops the commit after {renames} renames");
        // Readers refuse the half-committed folder and say how to finish it.
        let eval = squeeze(&["eval", path_str(&model), "--tokens", path_str(&tokens)]);
        assert_eq!(eval.code, 2, "{}", eval.stderr);
        assert!(eval.stderr.contains("rerun it on this folder"), "{}", eval.stderr);
        // The next run completes the commit first, then writes its own.
        squeeze(&["calibrate-kv", path_str(&model), "--tokens", path_str(&tokens)]).ok();
        assert_eq!(index_and_config(&model), (true, true), "after {renames} renames");
        assert!(!model.join(".squeeze-journal.json").exists() && !model.join(".squeeze.lock").exists());
        let leftovers: Vec<String> = fs::read_dir(&model)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".squeeze-staged") || n.ends_with(".squeeze-tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        squeeze(&["eval", path_str(&model), "--tokens", path_str(&tokens)]).ok();
    }
}

/// Starts `squeeze args` (stderr captured) and returns once `reached()` holds, or after 60 s.
fn spawn_until(args: &[&str], reached: impl Fn() -> bool) -> std::process::Child {
    let child = Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline && !reached() {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child
}

#[test]
fn sigint_during_quantize_leaves_nothing_complete_looking_and_resume_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "glm5", &["--layers", "4", "--experts", "16"]);
    let out = dir.path().join("int4");
    let args = ["quantize", path_str(&source), path_str(&out), "--max-shard-size", "500kB", "--scale-rule", "mse"];
    let child = spawn_until(&args, || {
        fs::read_dir(&out)
            .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".safetensors")))
            .unwrap_or(false)
    });
    // The shell's builtin `kill` (no procps needed).
    Command::new("sh").args(["-c", &format!("kill -INT {}", child.id())]).status().unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!out.join("config.json").exists(), "the run finished before SIGINT; make the model larger");
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    let names: Vec<String> =
        fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(
        names
            .iter()
            .all(|n| !n.ends_with(".squeeze-tmp") && n != ".squeeze.lock" && n != "model.safetensors.index.json"),
        "{names:?}"
    );
    squeeze(&[&args[..], &["--resume"]].concat()).ok();
    squeeze(&["verify", path_str(&out)]).ok();
}

#[test]
fn two_concurrent_quantize_runs_into_one_folder_cannot_mix() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "glm5", &["--layers", "4", "--experts", "16"]);
    let out = dir.path().join("int4");
    let slow = ["quantize", path_str(&source), path_str(&out), "--max-shard-size", "500kB", "--scale-rule", "mse"];
    let first = spawn_until(&slow, || out.join(".squeeze.lock").exists());
    // The second run, with --force and another scale rule, is refused while the first holds the folder.
    let second = squeeze(&["quantize", path_str(&source), path_str(&out), "--force", "--scale-rule", "absmax7"]);
    let output = first.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(second.code, 2, "the second run must not write into a folder in use: {}", second.stderr);
    assert!(second.stderr.contains("in use by another squeeze run (quantize"), "{}", second.stderr);
    let verify = squeeze(&["verify", path_str(&out), "--source", path_str(&source)]).ok();
    assert!(verify.stdout.contains("verify: OK"), "{}", verify.stdout);
}
