//! Bad input, second pass (issue 33): context beyond the model's window, one-token calibration rows, a group size
//! for a folder that is already INT4, a malformed packed weight, a source whose config lies about its tensors,
//! negative numbers to numeric flags, token-file errors, a non-finite logit and a finished folder's stale lock.
//! Each refusal exits 2 (inspect: 1) with a message naming the flag, file or tensor; none exits 0 on bad input.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::calibrate::{edit_tensor, write_tokens};
use crate::common::{expect_exit_2, path_str, read_json, rewrite_header, squeeze, synth, write_input_ids, Run};

/// A glm45 synthetic model whose config.json declares `max_position_embeddings` 64 (no RoPE scaling).
fn model_with_window_64(dir: &Path) -> PathBuf {
    let model = synth(dir, "glm45-64", "glm45", &[]);
    edit_config(&model, |config| config["max_position_embeddings"] = Value::from(64));
    model
}

fn edit_config(model: &Path, edit: impl FnOnce(&mut Value)) {
    let path = model.join("config.json");
    let mut config = read_json(&path);
    edit(&mut config);
    fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

/// A text of about `bytes` tokens for the synthetic byte-level tokenizer.
fn write_text(path: &Path, bytes: usize) {
    let text: String = "Shall I compare thee to a summer's day? ".chars().cycle().take(bytes).collect();
    fs::write(path, text).unwrap();
}

fn no_panic(run: &Run) {
    assert!(!run.stderr.contains("panicked") && run.code != 101, "panic: {}", run.stderr);
}

fn args<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

#[test]
fn context_beyond_the_model_window_is_refused_by_eval_parity_calibrate_kv_serve_test_and_quantize() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_with_window_64(dir.path());
    let m = path_str(&model);
    let text = dir.path().join("text.txt");
    write_text(&text, 400);
    let t = path_str(&text);
    let tokens = dir.path().join("long.safetensors");
    write_tokens(&tokens, 2, 100, 384);
    let long_prompt: String = "a".repeat(200);
    let out = dir.path().join("int4");
    let window = ["64 positions", "max_position_embeddings", "--allow-long-context"];
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["eval", m, "--data", t, "--ctx", "100"], vec!["--ctx 100", "100 positions"]),
        (vec!["eval", m, "--tokens", path_str(&tokens)], vec!["--tokens", path_str(&tokens), "rows of 100 tokens"]),
        (vec!["eval", "--reference", m, "--candidate", m, "--data", t, "--ctx", "100"], vec!["--ctx 100"]),
        (vec!["calibrate-kv", m, "--data", t, "--seq-len", "100", "--dry-run"], vec!["--seq-len 100"]),
        (
            vec!["serve-test", m, "--prompt", &long_prompt, "--max-new-tokens", "2"],
            vec!["prompt 0", "--max-new-tokens 2"],
        ),
        (vec!["serve-test", m, "--prompt", "hi", "--max-new-tokens", "100"], vec!["prompt 0", "--max-new-tokens 100"]),
        (
            vec!["quantize", m, path_str(&out), "--method", "imatrix", "--calibration", t, "--seq-len", "100"],
            vec!["--seq-len 100"],
        ),
    ];
    for (command, needles) in cases {
        let run = squeeze(&command);
        no_panic(&run);
        expect_exit_2(&run, &[needles.as_slice(), window.as_slice()].concat());
        assert!(run.stderr.contains("window of 64"), "{command:?}: {}", run.stderr);
    }
    assert!(!out.join("config.json").exists(), "quantize wrote before refusing");

    // At the window it runs; past it with --allow-long-context it runs with a warning in the report.
    squeeze(&["eval", m, "--data", t, "--ctx", "64", "--chunks", "1"]).ok();
    let eval = squeeze(&["eval", m, "--data", t, "--ctx", "100", "--chunks", "1", "--allow-long-context", "--json"]);
    let warnings = eval.ok().json()["warnings"].to_string();
    assert!(warnings.contains("--ctx 100") && warnings.contains("window of 64"), "{warnings}");
    let human = squeeze(&["eval", m, "--tokens", path_str(&tokens), "--allow-long-context"]).ok();
    assert!(human.stdout.contains("warning: --tokens") && human.stdout.contains("window of 64"), "{}", human.stdout);
    let calibration = squeeze(&[
        "calibrate-kv",
        m,
        "--data",
        t,
        "--seq-len",
        "100",
        "--samples",
        "1",
        "--dry-run",
        "--json",
        "--allow-long-context",
    ]);
    assert!(calibration.ok().json()["warnings"][0].as_str().unwrap().contains("window of 64"));
    let serve =
        squeeze(&["serve-test", m, "--prompt", "hi", "--max-new-tokens", "70", "--allow-long-context", "--json"]);
    let report = serve.ok().json();
    assert!(report["warnings"][0].as_str().unwrap().contains("--max-new-tokens 70"), "{report}");
    // Within the window nothing is said.
    let quiet = squeeze(&["serve-test", m, "--prompt", "hi", "--max-new-tokens", "4", "--json"]).ok().json();
    assert!(quiet.get("warnings").is_none(), "{quiet}");
}

#[test]
fn the_yarn_window_binds_where_it_is_below_max_position_embeddings() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "kimi", "kimi-k2", &[]);
    // 128 original positions × factor 1 = 128, below max_position_embeddings 4096.
    edit_config(&model, |config| config["rope_scaling"]["factor"] = Value::from(1.0));
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 1, 200, 384);
    let run = squeeze(&["eval", path_str(&model), "--tokens", path_str(&tokens)]);
    expect_exit_2(
        &run,
        &[
            "rows of 200 tokens",
            "window of 128",
            "original_max_position_embeddings 128 × factor 1",
            "below max_position_embeddings 4096",
        ],
    );
}

#[test]
fn calibrate_kv_refuses_one_token_rows_as_eval_does() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm45", "glm45", &[]);
    let m = path_str(&model);
    let tokens = dir.path().join("one.safetensors");
    write_tokens(&tokens, 4, 1, 384);
    let t = path_str(&tokens);
    for command in [vec!["calibrate-kv", m, "--tokens", t, "--dry-run"], vec!["eval", m, "--tokens", t]] {
        let run = squeeze(&command);
        no_panic(&run);
        expect_exit_2(&run, &["--tokens", t, "rows of 1 token(s) are too short", "at least 2 per chunk"]);
    }
    let text = dir.path().join("text.txt");
    write_text(&text, 100);
    let run = squeeze(&["calibrate-kv", m, "--data", path_str(&text), "--seq-len", "1", "--dry-run"]);
    expect_exit_2(&run, &["--seq-len", "must be at least 2, got 1"]);
}

#[test]
fn report_refuses_a_group_size_for_a_folder_already_int4_as_quantize_does() {
    let dir = tempfile::tempdir().unwrap();
    let int4 = synth(dir.path(), "k26", "kimi-k2.6", &[]);
    // A group size its rows take: the folder stays INT4, which quantize refuses as nothing to do.
    let run = squeeze(&["report", path_str(&int4), "--group-size", "16"]);
    expect_exit_2(&run, &["--group-size 16", "already INT4", "group size 32"]);
    assert!(run.stdout.is_empty(), "a budget was printed: {}", run.stdout);
    let quantize = squeeze(&["quantize", path_str(&int4), path_str(&dir.path().join("out")), "--group-size", "16"]);
    expect_exit_2(&quantize, &["already INT4", "group size 32"]);
    // One its rows do not take: the plan's check, naming the flag.
    let run = squeeze(&["report", path_str(&int4), "--group-size", "7"]);
    expect_exit_2(&run, &["group size 7 does not divide", "--group-size"]);
    assert!(run.stdout.is_empty(), "a budget was printed: {}", run.stdout);
    squeeze(&["report", path_str(&int4)]).ok();
    // An FP8 folder whose rows 7 does not divide: the plan's check, as quantize's.
    let fp8 = synth(dir.path(), "kimi", "kimi-k2", &[]);
    expect_exit_2(&squeeze(&["report", path_str(&fp8), "--group-size", "7"]), &["group size 7 does not divide"]);
}

#[test]
fn a_malformed_weight_packed_makes_inspect_warn_with_exit_1_and_report_refuse_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "k26", "kimi-k2.6", &[]);
    let index = read_json(&model.join("model.safetensors.index.json"));
    let packed = index["weight_map"]
        .as_object()
        .unwrap()
        .keys()
        .find(|name| name.ends_with("mlp.experts.1.down_proj.weight_packed"))
        .expect("an INT4 expert")
        .clone();
    let shard = model.join(index["weight_map"][&packed].as_str().unwrap());
    // Messages name the text model's tensor (`model.layers.…`, as the engines do), inside the wrapper too.
    let named = packed.strip_prefix("language_model.").expect("Kimi K2.6 keeps the text model under language_model.");
    rewrite_header(&shard, |header| {
        let shape = header[&packed]["shape"].as_array().unwrap().clone();
        let [rows, words] = [0, 1].map(|i| shape[i].as_u64().unwrap());
        // The same bytes under a wrong shape.
        header[&packed]["shape"] = serde_json::json!([rows * 2, words / 2]);
    });
    let inspect = squeeze(&["inspect", path_str(&model)]);
    no_panic(&inspect);
    assert_eq!(inspect.code, 1, "{}{}", inspect.stdout, inspect.stderr);
    assert!(inspect.stdout.contains("tensors in"), "the tables still print: {}", inspect.stdout);
    assert!(
        inspect.stderr.contains("warning:") && inspect.stderr.contains(named) && inspect.stderr.contains("malformed"),
        "{}",
        inspect.stderr
    );
    let json = squeeze(&["inspect", path_str(&model), "--json"]);
    assert_eq!(json.code, 1);
    assert!(json.json()["problems"][0].as_str().unwrap().contains(named));
    let report = squeeze(&["report", path_str(&model)]);
    expect_exit_2(&report, &[named, "malformed checkpoint", "squeeze verify"]);
    assert!(report.stdout.is_empty(), "{}", report.stdout);
    let verify = squeeze(&["verify", path_str(&model)]);
    assert_eq!(verify.code, 1, "{}", verify.stdout);
    assert!(verify.stdout.contains(named), "{}", verify.stdout);
}

#[test]
fn verify_refuses_a_source_whose_config_disagrees_with_its_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "glm45", "glm45", &[]);
    let out = dir.path().join("int4");
    squeeze(&["quantize", path_str(&source), path_str(&out)]).ok();
    squeeze(&["verify", path_str(&out), "--source", path_str(&source)]).ok();
    edit_config(&source, |config| config["hidden_size"] = Value::from(384));
    let run = squeeze(&["verify", path_str(&out), "--source", path_str(&source)]);
    no_panic(&run);
    expect_exit_2(&run, &["--source", path_str(&source), "config.json implies", "model.embed_tokens.weight"]);
    // The output alone is still what it is.
    squeeze(&["verify", path_str(&out)]).ok();
}

#[test]
fn negative_numbers_reach_the_flag_parsers_that_name_the_flag_and_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm45", "glm45", &[]);
    let m = path_str(&model);
    let o = path_str(dir.path());
    let n = dir.path().join("new");
    let new = path_str(&n);
    let eval = ["eval", m, "--data", m];
    let parity = ["eval", "--reference", m, "--candidate", m, "--data", m];
    let calibrate = ["calibrate-kv", m, "--data", m];
    let serve = ["serve-test", m, "--prompt", "a"];
    let report = ["report", "glm-5"];
    let verify = ["verify", m];
    let quantize = ["quantize", m, o];
    let synth_ = ["synth", "--arch", "glm45", new];
    let selftest = ["selftest", "--device", "emulated"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (args(&eval, &["--ctx", "-1"]), "must be at least 2, got -1"),
        (args(&eval, &["--chunks", "-1"]), "must be at least 1, got -1"),
        (args(&eval, &["--mtp", "--mtp-depth", "-1"]), "--mtp-depth"),
        (args(&eval, &["--mtp", "--max-mtp-drop", "-1"]), "must be at least 0, got -1"),
        (args(&eval, &["--part", "-1/4", "--save-stats", o]), "got `-1/4`"),
        (args(&parity, &["--max-mean-kld", "-1"]), "must be at least 0, got -1"),
        (args(&parity, &["--min-same-top", "-1"]), "must be between 0 and 100, got -1"),
        (args(&parity, &["--max-ppl-ratio", "-1"]), "must be greater than 0, got -1"),
        (args(&calibrate, &["--samples", "-1"]), "must be at least 1, got -1"),
        (args(&calibrate, &["--seq-len", "-1"]), "must be at least 2, got -1"),
        (args(&calibrate, &["--percentile", "-5"]), "must be greater than 0, got -5"),
        (args(&serve, &["--top-p", "-0.5"]), "must be in (0, 1], got -0.5"),
        (args(&serve, &["--kv-pages", "-1"]), "must be at least 1, got -1"),
        (args(&serve, &["--page-size", "-1"]), "must be at least 1, got -1"),
        (args(&serve, &["--concurrency", "-1"]), "must be at least 1, got -1"),
        (args(&serve, &["--temperature", "-1"]), "must be at least 0, got -1"),
        (args(&serve, &["--max-new-tokens", "-1"]), "must be at least 1, got -1"),
        (args(&serve, &["--seed", "-1"]), "must be at least 0, got -1"),
        (args(&report, &["--gpus", "-1"]), "must be at least 1, got -1"),
        (args(&report, &["--tp", "-1"]), "must be at least 1, got -1"),
        (args(&report, &["--group-size", "-1"]), "must be at least 1, got -1"),
        (args(&report, &["--context", "-1"]), "must be at least 0, got -1"),
        (args(&report, &["--mem-fraction", "-1"]), "must be in (0, 1]"),
        (args(&report, &["--cores", "-1"]), "must be at least 1, got -1"),
        (args(&report, &["--parts", "-1"]), "must be at least 1, got -1"),
        (args(&report, &["--max-shard-size", "-1"]), "at least one byte, got -1"),
        (args(&report, &["--reserve", "-1"]), "at least one byte, got -1"),
        (args(&report, &["--kv-pool", "-1"]), "at least one byte, got -1"),
        (args(&report, &["--read-speed", "-1"]), "at least one byte, got -1"),
        (args(&report, &["--write-speed", "-1"]), "at least one byte, got -1"),
        (args(&verify, &["--max-int4-error", "-1"]), "must be greater than 0, got -1"),
        (args(&verify, &["--worst", "-1"]), "must be at least 0, got -1"),
        (args(&verify, &["--tp", "-1"]), "`-1` is not a positive integer"),
        (args(&quantize, &["--group-size", "-1"]), "must be at least 1, got -1"),
        (args(&quantize, &["--samples", "-1"]), "must be at least 1, got -1"),
        (args(&quantize, &["--seq-len", "-1"]), "must be at least 2, got -1"),
        (args(&quantize, &["--min-expert-tokens", "-1"]), "must be at least 0, got -1"),
        (args(&quantize, &["--tp", "-1"]), "`-1` is not a positive integer"),
        (args(&quantize, &["--max-shard-size", "-1"]), "at least one byte, got -1"),
        (args(&synth_, &["--layers", "-1"]), "must be at least 1, got -1"),
        (args(&synth_, &["--hidden", "-1"]), "must be at least 1, got -1"),
        (args(&synth_, &["--experts", "-1"]), "must be at least 1, got -1"),
        (args(&synth_, &["--moe-intermediate", "-1"]), "must be at least 1, got -1"),
        (args(&synth_, &["--vocab", "-1"]), "must be at least 1, got -1"),
        (args(&synth_, &["--shards", "-1"]), "must be at least 1, got -1"),
        (args(&synth_, &["--seed", "-1"]), "must be at least 0, got -1"),
        (args(&selftest, &["--seed", "-1"]), "must be at least 0, got -1"),
        (args(&selftest, &["--bench-rows", "-1"]), "must be at least 1, got -1"),
    ];
    for (command, rule) in cases {
        // The flag given the negative number: the one before the first argument that starts with `-` and a digit.
        let value = command.iter().position(|arg| arg.starts_with('-') && !arg.starts_with("--")).unwrap();
        let flag = command[value - 1];
        let run = squeeze(&command);
        no_panic(&run);
        assert_eq!(run.code, 2, "{command:?}: {}", run.stderr);
        assert!(!run.stderr.contains("unexpected argument"), "{command:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(flag) && run.stderr.contains(rule),
            "{command:?}: want {flag}, {rule}: {}",
            run.stderr
        );
    }
    assert!(!n.exists(), "synth wrote on a negative number");
}

#[test]
fn token_file_errors_name_the_flag_the_file_and_the_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm45", "glm45", &[]);
    let m = path_str(&model);
    let file = |name: &str, rows: &[Vec<i64>]| {
        let path = dir.path().join(name);
        write_input_ids(&path, rows);
        path
    };
    let outside = file("outside.safetensors", &[vec![1, 2, 3, 4], vec![5, 6, 7, 384]]);
    let negative = file("negative.safetensors", &[vec![1, 2, -5, 4]]);
    let empty = file("empty.safetensors", &[]);
    let out = dir.path().join("int4");
    let o = path_str(&out);
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["eval", m, "--tokens", path_str(&outside)],
            vec!["--tokens", path_str(&outside), "input_ids[1, 3] is 384", "vocabulary of 384"],
        ),
        (
            vec!["calibrate-kv", m, "--tokens", path_str(&outside), "--dry-run"],
            vec!["--tokens", path_str(&outside), "input_ids[1, 3] is 384"],
        ),
        (
            vec!["quantize", m, o, "--method", "imatrix", "--calibration", path_str(&outside)],
            vec!["--calibration", path_str(&outside), "input_ids[1, 3] is 384"],
        ),
        (
            vec!["eval", m, "--tokens", path_str(&negative)],
            vec!["--tokens", path_str(&negative), "input_ids[0, 2] is -5"],
        ),
        (vec!["eval", m, "--tokens", path_str(&empty)], vec!["--tokens", path_str(&empty), "no chunks to evaluate"]),
    ];
    for (command, needles) in cases {
        let run = squeeze(&command);
        no_panic(&run);
        expect_exit_2(&run, &needles);
    }
}

#[test]
fn a_non_finite_logit_names_the_tensor_or_layer_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.safetensors");
    write_input_ids(&tokens, &[vec![10, 11, 12, 13, 14, 15, 16, 17]]);
    let eval = |model: &Path| squeeze(&["eval", path_str(model), "--tokens", path_str(&tokens)]);

    // A NaN in the embedding row of token 12 (BF16 0x7FC0).
    let model = synth(dir.path(), "nan-row", "glm45", &[]);
    edit_tensor(&model, "model.embed_tokens.weight", |bytes, dtype| {
        assert_eq!(dtype, "BF16");
        let offset = 12 * 320 * 2 + 6;
        bytes[offset..offset + 2].copy_from_slice(&[0xC0, 0x7F]);
    });
    let run = eval(&model);
    no_panic(&run);
    expect_exit_2(&run, &["non-finite logit", "row 12 of `model.embed_tokens.weight`", "position 2"]);

    // Finite weights whose activations overflow: layer 0's input norm at the largest BF16 (3.39e38).
    let model = synth(dir.path(), "overflow", "glm45", &[]);
    edit_tensor(&model, "model.layers.0.input_layernorm.weight", |bytes, _| {
        bytes.chunks_mut(2).for_each(|pair| pair.copy_from_slice(&[0x7F, 0x7F]))
    });
    let run = eval(&model);
    no_panic(&run);
    expect_exit_2(&run, &["non-finite logit", "model.layers.0.self_attn", "overflow"]);
    assert!(!run.stderr.contains("a weight or scale of the model is NaN"), "{}", run.stderr);
}

#[test]
fn a_finished_folder_left_locked_by_a_dead_run_is_unlocked_and_merge_never_copies_a_lock() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "kimi-k2", &[]);
    let out = dir.path().join("int4");
    squeeze(&["quantize", path_str(&source), path_str(&out)]).ok();
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let dead = format!("{}\n{}\nquantize\n", (1u32 << 22) + 1, host.trim());
    // Killed after the manifest's rename, before the lock's removal: the next command that opens the folder
    // finds the holder gone and removes the lock.
    for command in ["verify", "inspect"] {
        fs::write(out.join(".squeeze.lock"), &dead).unwrap();
        let run = squeeze(&[command, path_str(&out)]).ok();
        assert!(!out.join(".squeeze.lock").exists(), "{command} left the dead run's lock");
        // verify says it found one (a copy uploaded as it was carries it).
        if command == "verify" {
            assert!(
                run.stdout.contains("held .squeeze.lock of a run that is gone") && run.stdout.contains("removed now"),
                "{}",
                run.stdout
            );
        }
    }
    let clean = squeeze(&["verify", path_str(&out)]).ok();
    assert!(!clean.stdout.contains(".squeeze.lock"), "{}", clean.stdout);
    // A live holder's lock (this test) is not the reader's to remove; verify fails on it: the folder is being
    // written, not ready to upload.
    let live = format!("{}\n{}\nquantize\n", std::process::id(), host.trim());
    fs::write(out.join(".squeeze.lock"), &live).unwrap();
    squeeze(&["inspect", path_str(&out)]).ok();
    assert!(out.join(".squeeze.lock").exists());
    let run = squeeze(&["verify", path_str(&out)]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains(".squeeze.lock is held by a squeeze run (quantize, pid"), "{}", run.stdout);
    assert!(out.join(".squeeze.lock").exists());
    fs::remove_file(out.join(".squeeze.lock")).unwrap();

    // Parts: part 1's run died after finishing (its lock stays in the shared folder), and the source carries
    // another host's part lock, which no command may take for a companion file.
    let elsewhere = format!("{}\nother-host\nquantize --part 1/9\n", (1u32 << 22) + 1);
    fs::write(source.join(".squeeze-part-00001-of-00009.lock"), elsewhere).unwrap();
    let parts = dir.path().join("parts");
    for part in ["1/2", "2/2"] {
        squeeze(&["quantize", path_str(&source), path_str(&parts), "--part", part, "--max-shard-size", "1MB"]).ok();
    }
    fs::write(parts.join(".squeeze-part-00001-of-00002.lock"), &dead).unwrap();
    squeeze(&["merge", path_str(&parts)]).ok();
    let locks: Vec<String> = fs::read_dir(&parts)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".lock"))
        .collect();
    assert!(locks.is_empty(), "the merged folder holds {locks:?}");
    squeeze(&["verify", path_str(&parts)]).ok();
}
