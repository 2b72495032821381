//! What a user reads (issue 47): every fact of an error chain said once, a corrupt header naming its tensor, a
//! refusal's remedy naming the folder's own recipes, and a top-level help that says what squeeze does today.

use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::common::{expect_exit_2, path_str, read_json, rewrite_header, squeeze, synth};

fn occurrences(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

/// Wraps `model`'s config.json as a vision-language wrapper whose text model has `model_type` `kimi_linear_v9` (no
/// architecture squeeze knows).
fn unknown_wrapped_architecture(model: &Path) {
    let path = model.join("config.json");
    let mut text = read_json(&path);
    text["model_type"] = Value::from("kimi_linear_v9");
    text["architectures"] = Value::Array(vec![]);
    let wrapper = serde_json::json!({ "model_type": "kimi_k9", "architectures": [], "text_config": text });
    fs::write(&path, serde_json::to_vec_pretty(&wrapper).unwrap()).unwrap();
}

#[test]
fn an_unknown_architecture_is_named_once_with_its_file_once_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "k9", "glm5", &[]);
    unknown_wrapped_architecture(&model);
    let m = path_str(&model);
    let out = dir.path().join("out");
    let config = model.join("config.json");
    let text = dir.path().join("text.txt");
    fs::write(&text, "Shall I compare thee to a summer's day? ".repeat(40)).unwrap();
    let t = path_str(&text);
    let errors = [
        squeeze(&["quantize", m, path_str(&out)]),
        squeeze(&["report", m]),
        squeeze(&["report", path_str(&config)]),
        squeeze(&["eval", m, "--data", t, "--ctx", "64"]),
        squeeze(&["calibrate-kv", m, "--data", t, "--dry-run"]),
        squeeze(&["serve-test", m, "--prompt", "hi"]),
    ];
    for run in &errors {
        expect_exit_2(run, &["text_config.model_type", "kimi_linear_v9"]);
        assert_eq!(occurrences(&run.stderr, "has an unsupported value"), 1, "the problem once:\n{}", run.stderr);
        assert_eq!(occurrences(&run.stderr, "squeeze supports"), 1, "the remedy once:\n{}", run.stderr);
        assert_eq!(occurrences(&run.stderr, "config.json"), 1, "the file once:\n{}", run.stderr);
        assert_eq!(occurrences(&run.stderr, m), 1, "the folder once:\n{}", run.stderr);
    }
    assert!(!out.exists(), "nothing written");
    // verify lists it among its problems, with the file named once.
    let run = squeeze(&["verify", m]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(occurrences(&run.stdout, "has an unsupported value"), 1, "{}", run.stdout);
    assert!(run.stdout.contains("mismatch: config.json: key `text_config.model_type`"), "{}", run.stdout);
}

#[test]
fn an_io_error_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm5", "glm5", &[]);
    let file = dir.path().join("a-file");
    fs::write(&file, b"not a folder").unwrap();
    let out = file.join("out");
    let run = squeeze(&["quantize", path_str(&model), path_str(&out)]);
    expect_exit_2(&run, &["Not a directory"]);
    assert_eq!(occurrences(&run.stderr, "Not a directory"), 1, "{}", run.stderr);
}

#[test]
fn a_tensor_whose_byte_range_runs_past_the_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm5", "glm5", &["--shards", "1"]);
    let shard = model.join("model-00001-of-00001.safetensors");
    let mut last = String::new();
    rewrite_header(&shard, |header| {
        let object = header.as_object_mut().unwrap();
        let (name, info) = object
            .iter_mut()
            .filter(|(name, _)| name.as_str() != "__metadata__")
            .max_by_key(|(_, info)| info["data_offsets"][1].as_u64().unwrap())
            .unwrap();
        let end = info["data_offsets"][1].as_u64().unwrap();
        info["data_offsets"][1] = Value::from(end + 4096);
        last = name.clone();
    });
    let shard_name = shard.file_name().unwrap().to_str().unwrap();
    for command in ["inspect", "verify"] {
        let run = squeeze(&[command, path_str(&model)]);
        expect_exit_2(&run, &[shard_name, &format!("tensor `{last}`"), "data_offsets", "past the"]);
    }
}

#[test]
fn a_folder_already_int4_is_pointed_at_its_own_architectures_recipes() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("glm5", "glm5-nvfp4 (Blackwell), glm5-mxfp4 (AMD) or glm5-w4a8 (Hopper prefill)", "--recipe glm5-int4"),
        ("glm45", "glm45-nvfp4 (Blackwell), glm45-mxfp4 (AMD) or glm45-w4a8 (Hopper prefill)", "--recipe glm45-int4"),
        ("kimi-k3", "kimi-k3-nvfp4 (Blackwell) or kimi-k3-mxfp4 (AMD)", "--recipe kimi-k3-int4"),
    ];
    for (arch, recipes, recipe) in cases {
        let source = synth(dir.path(), arch, arch, &[]);
        let int4 = dir.path().join(format!("{arch}-int4"));
        let recipe = recipe.split_once(' ').unwrap().1;
        squeeze(&["quantize", path_str(&source), path_str(&int4), "--recipe", recipe]).ok();
        let again = dir.path().join(format!("{arch}-again"));
        let run = squeeze(&["quantize", path_str(&int4), path_str(&again), "--recipe", recipe]);
        expect_exit_2(&run, &["already INT4", recipes]);
        assert!(!run.stderr.contains("kimi-k26") && !run.stderr.contains("Moonshot"), "{}", run.stderr);
    }
    let k26 = synth(dir.path(), "k26", "kimi-k2.6", &[]);
    let run = squeeze(&["quantize", path_str(&k26), path_str(&dir.path().join("k26-out"))]);
    expect_exit_2(
        &run,
        &["already INT4", "Moonshot", "kimi-k26-nvfp4 (Blackwell), kimi-k26-mxfp4 (AMD) or kimi-k26-w4a8"],
    );
}

#[test]
fn the_top_level_help_says_what_squeeze_does_today_in_one_line_and_version_once() {
    let run = squeeze(&["--help"]).ok();
    let mut lines = run.stdout.lines();
    let summary = lines.next().unwrap();
    assert_eq!(lines.next(), Some(""), "the summary is one line:\n{}", run.stdout);
    for needle in
        ["FP8", "INT4", "FP4", "Kimi K2", "K3", "GLM-4.5", "DeepSeek-V3/V4", "4-bit", "SGLang", "vLLM", "runtime"]
    {
        assert!(summary.contains(needle), "`{needle}` in {summary}");
    }
    assert!(!summary.contains("→ INT4"), "{summary}");
    assert_eq!(occurrences(&run.stdout, "Print the version"), 1, "--version's help once:\n{}", run.stdout);
}
