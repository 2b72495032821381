//! `squeeze quantize`, `verify`, `inspect` and `synth` end to end, and every bad input the issue lists.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{path_str, read_json, squeeze, synth};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary folder")
}

fn quantize(input: &Path, output: &Path, extra: &[&str]) -> crate::common::Run {
    let mut args = vec!["quantize", path_str(input), path_str(output), "--json"];
    args.extend_from_slice(extra);
    squeeze(&args)
}

/// Absolute byte range of a tensor's data in a safetensors file.
fn tensor_range(file: &Path, name: &str) -> (usize, usize) {
    let bytes = fs::read(file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let offsets = &header[name]["data_offsets"];
    (8 + header_len + offsets[0].as_u64().unwrap() as usize, 8 + header_len + offsets[1].as_u64().unwrap() as usize)
}

/// The shard file of a tensor, from the index.
fn shard_of(dir: &Path, name: &str) -> PathBuf {
    let index = read_json(&dir.join("model.safetensors.index.json"));
    dir.join(index["weight_map"][name].as_str().unwrap_or_else(|| panic!("{name} not in index")))
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

const EXPERT: &str = "model.layers.1.mlp.experts.3.down_proj";

#[test]
fn kimi_k2_converts_to_the_kimi_layout_and_verifies() {
    let dir = tmp();
    let source = synth(dir.path(), "fp8", "kimi-k2", &["--shards", "3"]);
    let out = dir.path().join("int4");
    let report = quantize(&source, &out, &[]).ok().json();
    for key in [
        "input_bytes",
        "output_bytes",
        "tensors_quantized",
        "tensors_converted",
        "tensors_copied",
        "seconds",
        "peak_rss_bytes",
    ] {
        assert!(report.get(key).is_some(), "report lacks {key}: {report}");
    }
    // 2 MoE layers × 8 experts × 3 projections.
    assert_eq!(report["tensors_quantized"], 48);
    let config = read_json(&out.join("config.json"));
    let quantization = &config["quantization_config"];
    assert_eq!(quantization["quant_method"], "compressed-tensors");
    assert_eq!(quantization["format"], "pack-quantized");
    let weights = &quantization["config_groups"]["group_0"]["weights"];
    assert_eq!(weights["num_bits"], 4);
    assert_eq!(weights["group_size"], 32);
    assert_eq!(weights["symmetric"], true);
    assert_eq!(weights["strategy"], "group");
    assert!(quantization["ignore"].as_array().unwrap().contains(&Value::from("lm_head")));
    assert!(config.get("model_type").is_some(), "other config keys survive");
    // Companion files are copied.
    for name in ["tokenizer.json", "tokenizer_config.json", "tiktoken.model", "generation_config.json"] {
        assert_eq!(fs::read(source.join(name)).unwrap(), fs::read(out.join(name)).unwrap(), "{name}");
    }
    // Output sizes in the report are the real file sizes; no temporary files are left.
    let shard_bytes: u64 = files_in(&out)
        .iter()
        .filter(|n| n.ends_with(".safetensors"))
        .map(|n| fs::metadata(out.join(n)).unwrap().len())
        .sum();
    assert_eq!(report["output_bytes"].as_u64().unwrap(), shard_bytes);
    assert!(files_in(&out).iter().all(|n| !n.contains("tmp")), "{:?}", files_in(&out));
    // Quantized tensor layout.
    let packed = shard_of(&out, &format!("{EXPERT}.weight_packed"));
    let (start, end) = tensor_range(&packed, &format!("{EXPERT}.weight_packed"));
    assert_eq!(end - start, 320 * (160 / 8) * 4, "down_proj [320,160] packs to [320,20] i32");
    let manifest = read_json(&out.join("squeeze-manifest.json"));
    assert_eq!(manifest["complete"], true);
    assert_eq!(manifest["recipe"]["name"], "kimi-k2-int4");
    let verified = squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--json"]).ok().json();
    assert_eq!(verified["passed"], true);
    assert!(verified["compared_tensors"].as_u64().unwrap() > 48);
    let inspected = squeeze(&["inspect", path_str(&out), "--json"]).ok().json();
    assert_eq!(inspected["dtypes"]["I32"]["tensors"], 48);
    assert_eq!(inspected["architecture"], "DeepseekV3ForCausalLM");
}

#[test]
fn every_scale_rule_and_the_glm45_compressed_tensors_source_verify() {
    let dir = tmp();
    let source = synth(dir.path(), "fp8", "glm45", &["--layers", "2", "--moe-intermediate", "192"]);
    for rule in ["ct-minmax", "absmax7", "mse"] {
        let out = dir.path().join(rule);
        let report = quantize(&source, &out, &["--scale-rule", rule, "--group-size", "64"]).ok().json();
        assert!(report["tensors_quantized"].as_u64().unwrap() > 0);
        let config = read_json(&out.join("config.json"));
        assert_eq!(config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"], 64);
        let verified = squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--json"]).json();
        assert_eq!(verified["passed"], true, "{rule}: {verified}");
    }
}

#[test]
fn mse_error_is_not_larger_than_minmax_error() {
    let dir = tmp();
    let source = synth(dir.path(), "fp8", "glm5", &["--layers", "2"]);
    let mean_error = |rule: &str| {
        let out = dir.path().join(rule);
        quantize(&source, &out, &["--scale-rule", rule]).ok();
        let verified = squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--json", "--worst", "1000"])
            .ok()
            .json();
        let int4: Vec<f64> = verified["worst"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["scheme"] == "int4")
            .map(|e| e["relative_l2"].as_f64().unwrap())
            .collect();
        int4.iter().sum::<f64>() / int4.len() as f64
    };
    let (minmax, mse) = (mean_error("ct-minmax"), mean_error("mse"));
    assert!(mse <= minmax, "mse {mse} vs ct-minmax {minmax}");
}

#[test]
fn dry_run_predicts_the_output_size_and_writes_nothing() {
    let dir = tmp();
    let source = synth(dir.path(), "fp8", "glm5", &[]);
    let out = dir.path().join("int4");
    let planned = quantize(&source, &out, &["--dry-run", "--max-shard-size", "2MB"]).ok().json();
    assert!(!out.exists(), "dry run must not create the output folder");
    assert!(planned["classes"]["routed_experts"]["schemes"]["int4"].as_u64().unwrap() > 0);
    let written = quantize(&source, &out, &["--max-shard-size", "2MB"]).ok().json();
    assert_eq!(planned["output_bytes"], written["output_bytes"]);
    assert!(written["shards"].as_u64().unwrap() > 1, "2MB shards split the model");
    let human = squeeze(&["quantize", path_str(&source), path_str(&dir.path().join("x")), "--dry-run"]).ok();
    assert!(human.stdout.contains("routed_experts") && human.stdout.contains("would write"), "{}", human.stdout);
}

#[test]
fn resume_reuses_verified_shards_and_matches_an_uninterrupted_run() {
    let dir = tmp();
    let source = synth(dir.path(), "fp8", "kimi-k2", &[]);
    let clean = dir.path().join("clean");
    quantize(&source, &clean, &["--max-shard-size", "1MB"]).ok();
    let shards: Vec<String> = files_in(&clean).into_iter().filter(|n| n.ends_with(".safetensors")).collect();
    assert!(shards.len() >= 3, "{shards:?}");

    // Simulate a crash: one shard missing, one damaged, one half-written temporary, no config or index yet.
    let broken = dir.path().join("broken");
    fs::create_dir(&broken).unwrap();
    for name in files_in(&clean) {
        fs::copy(clean.join(&name), broken.join(&name)).unwrap();
    }
    fs::remove_file(broken.join(&shards[0])).unwrap();
    let mut damaged = fs::read(broken.join(&shards[1])).unwrap();
    let last = damaged.len() - 1;
    damaged[last] ^= 0xFF;
    fs::write(broken.join(&shards[1]), damaged).unwrap();
    fs::write(broken.join(format!("{}.squeeze-tmp", shards[0])), b"partial").unwrap();
    fs::remove_file(broken.join("config.json")).unwrap();
    fs::remove_file(broken.join("model.safetensors.index.json")).unwrap();
    let mut manifest = read_json(&broken.join("squeeze-manifest.json"));
    manifest["complete"] = Value::Bool(false);
    fs::write(broken.join("squeeze-manifest.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();

    let refused = quantize(&source, &broken, &[]);
    assert_eq!(refused.code, 2, "a non-empty output needs --resume or --force");
    assert!(refused.stderr.contains("--resume"), "{}", refused.stderr);

    let resumed = quantize(&source, &broken, &["--max-shard-size", "1MB", "--resume"]).ok().json();
    assert_eq!(resumed["shards_reused"].as_u64().unwrap() as usize, shards.len() - 2);
    let _ = fs::remove_file(broken.join(format!("{}.squeeze-tmp", shards[0])));
    assert_eq!(files_in(&clean), files_in(&broken));
    for name in files_in(&clean) {
        assert!(
            fs::read(clean.join(&name)).unwrap() == fs::read(broken.join(&name)).unwrap(),
            "{name} differs after resume"
        );
    }
}

#[test]
fn a_killed_run_resumed_is_byte_identical() {
    let dir = tmp();
    let source = synth(dir.path(), "fp8", "glm5", &["--layers", "4", "--experts", "16"]);
    let clean = dir.path().join("clean");
    quantize(&source, &clean, &["--max-shard-size", "500kB", "--scale-rule", "mse"]).ok();
    let killed = dir.path().join("killed");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args(["quantize", path_str(&source), path_str(&killed), "--max-shard-size", "500kB", "--scale-rule", "mse"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it as soon as the first shard is finished.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline
        && !files_in_or_empty(&killed).iter().any(|n| n.starts_with("model-00001") && n.ends_with(".safetensors"))
    {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(!killed.join("config.json").exists(), "the run finished before it could be killed; make the model larger");
    quantize(&source, &killed, &["--max-shard-size", "500kB", "--scale-rule", "mse", "--resume"]).ok();
    let leftovers: Vec<String> = files_in(&killed).into_iter().filter(|n| n.ends_with(".squeeze-tmp")).collect();
    for name in &leftovers {
        fs::remove_file(killed.join(name)).unwrap();
    }
    assert_eq!(files_in(&clean), files_in(&killed));
    for name in files_in(&clean) {
        assert!(fs::read(clean.join(&name)).unwrap() == fs::read(killed.join(&name)).unwrap(), "{name} differs");
    }
}

fn files_in_or_empty(dir: &Path) -> Vec<String> {
    if dir.exists() {
        files_in(dir)
    } else {
        Vec::new()
    }
}

#[test]
fn bf16_sources_and_fp8_block_recipes_work() {
    let dir = tmp();
    let source = synth(dir.path(), "fp8", "glm5", &[]);
    // A recipe with no rules dequantizes everything: a BF16 checkpoint.
    let all_bf16 = dir.path().join("bf16.toml");
    fs::write(&all_bf16, "name = \"all-bf16\"\nunselected = \"bf16\"\n").unwrap();
    let bf16 = dir.path().join("bf16");
    let report = quantize(&source, &bf16, &["--recipe", path_str(&all_bf16)]).ok().json();
    assert_eq!(report["tensors_quantized"], 0);
    let inspected = squeeze(&["inspect", path_str(&bf16), "--json"]).ok().json();
    assert!(inspected["dtypes"].get("F8_E4M3").is_none());
    // The BF16 checkpoint quantizes with the default recipe.
    let from_bf16 = dir.path().join("from-bf16");
    let report = quantize(&bf16, &from_bf16, &[]).ok().json();
    assert!(report["tensors_quantized"].as_u64().unwrap() > 0);
    squeeze(&["verify", path_str(&from_bf16), "--source", path_str(&bf16)]).ok();

    // Unselected FP8 tensors kept as compressed-tensors float-quantized in a second group.
    let mixed = dir.path().join("mixed.toml");
    let text = fs::read_to_string("recipes/glm5-int4.toml")
        .unwrap()
        .replace("unselected = \"bf16\"", "unselected = \"fp8-block\"");
    fs::write(&mixed, text).unwrap();
    let out = dir.path().join("mixed");
    // Two groups and a mixed-precision format are outside the engine load rules: refused unless skipped.
    let refused = quantize(&source, &out, &["--recipe", path_str(&mixed)]);
    assert_eq!(refused.code, 2);
    assert!(refused.stderr.contains("linear-target") && refused.stderr.contains("quant-method"), "{}", refused.stderr);
    quantize(&source, &out, &["--recipe", path_str(&mixed), "--engine", "none"]).ok();
    let config = read_json(&out.join("config.json"));
    let groups = config["quantization_config"]["config_groups"].as_object().unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups["group_1"]["weights"]["num_bits"], 8);
    let inspected = squeeze(&["inspect", path_str(&out), "--json"]).ok().json();
    assert!(inspected["dtypes"]["F8_E4M3"]["tensors"].as_u64().unwrap() > 0);
    squeeze(&["verify", path_str(&out), "--source", path_str(&source)]).ok();
}

// ---- bad input: exit 2, an error naming the file and tensor, nothing that looks complete ----

/// Runs quantize on a damaged source and checks the error and that no output looks complete.
fn expect_failure(source: &Path, out: &Path, extra: &[&str], must_mention: &[&str]) -> String {
    let run = quantize(source, out, extra);
    assert_eq!(run.code, 2, "expected exit 2\nstdout:{}\nstderr:{}", run.stdout, run.stderr);
    for needle in must_mention {
        assert!(run.stderr.contains(needle), "stderr should mention `{needle}`:\n{}", run.stderr);
    }
    assert!(!out.join("config.json").exists(), "a failed run left config.json");
    assert!(!out.join("model.safetensors.index.json").exists(), "a failed run left the index");
    if out.join("squeeze-manifest.json").exists() {
        assert_eq!(read_json(&out.join("squeeze-manifest.json"))["complete"], false);
    }
    run.stderr
}

fn fresh_source(dir: &Path) -> PathBuf {
    synth(dir, "fp8", "kimi-k2", &["--shards", "2"])
}

#[test]
fn truncated_shard_is_named() {
    let dir = tmp();
    let source = fresh_source(dir.path());
    let shard = source.join("model-00002-of-00002.safetensors");
    let bytes = fs::read(&shard).unwrap();
    fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    expect_failure(&source, &dir.path().join("out"), &[], &["model-00002-of-00002.safetensors", "truncated"]);
}

#[test]
fn corrupt_and_oversized_headers_are_named() {
    let dir = tmp();
    let source = fresh_source(dir.path());
    let shard = source.join("model-00001-of-00002.safetensors");
    let original = fs::read(&shard).unwrap();
    let mut corrupt = original.clone();
    corrupt[12] = b'#';
    fs::write(&shard, &corrupt).unwrap();
    expect_failure(
        &source,
        &dir.path().join("a"),
        &[],
        &["model-00001-of-00002.safetensors", "invalid safetensors header"],
    );
    let mut oversized = original.clone();
    oversized[..8].copy_from_slice(&(200u64 << 20).to_le_bytes());
    fs::write(&shard, &oversized).unwrap();
    expect_failure(&source, &dir.path().join("b"), &[], &["model-00001-of-00002.safetensors", "100 MB"]);
    let mut tiny = original[..5].to_vec();
    tiny.truncate(5);
    fs::write(&shard, &tiny).unwrap();
    expect_failure(&source, &dir.path().join("c"), &[], &["model-00001-of-00002.safetensors"]);
}

#[test]
fn offsets_out_of_bounds_are_named() {
    let dir = tmp();
    let source = fresh_source(dir.path());
    let shard = source.join("model-00001-of-00002.safetensors");
    let bytes = fs::read(&shard).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    // Push the last tensor's end past the end of the file.
    let (name, end) = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| (k.clone(), v["data_offsets"][1].as_u64().unwrap()))
        .max_by_key(|(_, end)| *end)
        .unwrap();
    header[&name]["data_offsets"][1] = Value::from(end + 4096);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut rebuilt = (text.len() as u64).to_le_bytes().to_vec();
    rebuilt.extend_from_slice(&text);
    rebuilt.extend_from_slice(&bytes[8 + header_len..]);
    fs::write(&shard, rebuilt).unwrap();
    expect_failure(&source, &dir.path().join("out"), &[], &["model-00001-of-00002.safetensors"]);
}

#[test]
fn shape_not_as_config_implies_is_named() {
    let dir = tmp();
    let source = fresh_source(dir.path());
    let mut config = read_json(&source.join("config.json"));
    config["moe_intermediate_size"] = Value::from(192);
    fs::write(source.join("config.json"), serde_json::to_vec(&config).unwrap()).unwrap();
    expect_failure(
        &source,
        &dir.path().join("out"),
        &[],
        &["model.layers.1.mlp.experts.0.gate_proj.weight", "config.json implies"],
    );
}

/// Rewrites a safetensors file without tensor `name`.
fn drop_tensor(file: &Path, name: &str) {
    let bytes = fs::read(file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let data = &bytes[8 + header_len..];
    let mut entries: Vec<(String, Value)> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__" && *k != name)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    entries.sort_by_key(|(_, v)| v["data_offsets"][0].as_u64().unwrap());
    let mut new_header = serde_json::Map::new();
    let mut new_data = Vec::new();
    for (key, mut value) in entries {
        let (start, end) =
            (value["data_offsets"][0].as_u64().unwrap() as usize, value["data_offsets"][1].as_u64().unwrap() as usize);
        let offset = new_data.len();
        new_data.extend_from_slice(&data[start..end]);
        value["data_offsets"] = serde_json::json!([offset, new_data.len()]);
        new_header.insert(key, value);
    }
    let mut text = serde_json::to_vec(&new_header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut rebuilt = (text.len() as u64).to_le_bytes().to_vec();
    rebuilt.extend_from_slice(&text);
    rebuilt.extend_from_slice(&new_data);
    fs::write(file, rebuilt).unwrap();
}

#[test]
fn missing_weight_scale_inv_is_named() {
    let dir = tmp();
    let source = fresh_source(dir.path());
    let scale = format!("{EXPERT}.weight_scale_inv");
    let shard = shard_of(&source, &scale);
    drop_tensor(&shard, &scale);
    // Keep the index consistent so that the missing scale itself is what is reported.
    let mut index = read_json(&source.join("model.safetensors.index.json"));
    index["weight_map"].as_object_mut().unwrap().remove(&scale);
    fs::write(source.join("model.safetensors.index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    expect_failure(
        &source,
        &dir.path().join("out"),
        &[],
        &[&format!("{EXPERT}.weight"), "weight_scale_inv", "missing"],
    );
}

#[test]
fn bad_scales_are_named() {
    for (label, value) in [("nan", f32::NAN), ("inf", f32::INFINITY), ("zero", 0.0), ("negative", -0.5)] {
        let dir = tmp();
        let source = fresh_source(dir.path());
        let scale = format!("{EXPERT}.weight_scale_inv");
        let shard = shard_of(&source, &scale);
        let (start, _) = tensor_range(&shard, &scale);
        let mut bytes = fs::read(&shard).unwrap();
        bytes[start..start + 4].copy_from_slice(&value.to_le_bytes());
        fs::write(&shard, bytes).unwrap();
        let stderr = expect_failure(&source, &dir.path().join("out"), &[], &[&scale, "finite and positive"]);
        assert!(stderr.contains(shard.file_name().unwrap().to_str().unwrap()), "{label}: {stderr}");
    }
}

#[test]
fn index_naming_a_missing_file_or_tensor_is_named() {
    let dir = tmp();
    let source = fresh_source(dir.path());
    let mut index = read_json(&source.join("model.safetensors.index.json"));
    index["weight_map"]["model.layers.9.mlp.gate.weight"] = Value::from("model-00001-of-00002.safetensors");
    fs::write(source.join("model.safetensors.index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    expect_failure(&source, &dir.path().join("a"), &[], &["model.layers.9.mlp.gate.weight", "not present"]);
    index["weight_map"].as_object_mut().unwrap().remove("model.layers.9.mlp.gate.weight");
    index["weight_map"]["model.norm.weight"] = Value::from("model-00009-of-00009.safetensors");
    fs::write(source.join("model.safetensors.index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    expect_failure(&source, &dir.path().join("b"), &[], &["model-00009-of-00009.safetensors", "does not exist"]);
}

#[test]
fn unknown_architecture_is_named() {
    let dir = tmp();
    let source = fresh_source(dir.path());
    let mut config = read_json(&source.join("config.json"));
    config["model_type"] = Value::from("llama");
    config["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    fs::write(source.join("config.json"), serde_json::to_vec(&config).unwrap()).unwrap();
    expect_failure(&source, &dir.path().join("out"), &[], &["config.json", "model_type", "llama"]);
}

#[test]
fn non_empty_output_and_bad_group_size_are_refused() {
    let dir = tmp();
    let source = fresh_source(dir.path());
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("notes.txt"), b"mine").unwrap();
    expect_failure(&source, &out, &[], &["not empty", "--force"]);
    assert_eq!(fs::read(out.join("notes.txt")).unwrap(), b"mine");
    expect_failure(&source, &dir.path().join("g"), &["--group-size", "48"], &["group size 48", "--group-size"]);
    let unknown = quantize(&source, &dir.path().join("r"), &["--recipe", "no-such-recipe"]);
    assert_eq!(unknown.code, 2);
    assert!(unknown.stderr.contains("kimi-k2-int4"), "{}", unknown.stderr);
}

#[test]
fn disk_full_is_reported_and_leaves_nothing_complete() {
    if !Path::new("/dev/full").exists() {
        eprintln!("skipped: /dev/full is not available on this platform");
        return;
    }
    let dir = tmp();
    let source = fresh_source(dir.path());
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    // Every write to the first shard's temporary file fails with ENOSPC.
    std::os::unix::fs::symlink("/dev/full", out.join("model-00001-of-00001.safetensors.squeeze-tmp")).unwrap();
    let stderr =
        expect_failure(&source, &out, &["--force"], &["model-00001-of-00001.safetensors", "No space left on device"]);
    assert!(!out.join("model-00001-of-00001.safetensors").exists(), "{stderr}");
}

/// `--device emulated` runs the quantize command's device path (src/runtime/cuda/int4_quantize.rs, the kernels of
/// kernels/int4_quantize.cu on the emulated device); every file it writes is byte-identical to `--device cpu`'s, for
/// every scale rule. Group 32 (registers) and group 48 (`gany`, re-read) both go through the kernels.
#[test]
fn quantize_on_the_emulated_device_is_byte_identical_to_the_cpu() {
    let dir = tmp();
    let small = ["--layers", "2", "--hidden", "96", "--experts", "4", "--moe-intermediate", "96", "--vocab", "260"];
    let source = synth(dir.path(), "fp8", "kimi-k2", &small);
    for (rule, group) in [("ct-minmax", "32"), ("absmax7", "48"), ("mse", "32")] {
        let (cpu, emulated) = (dir.path().join(format!("cpu-{rule}")), dir.path().join(format!("emulated-{rule}")));
        let options = ["--scale-rule", rule, "--group-size", group, "--engine", "none"];
        quantize(&source, &cpu, &[&options[..], &["--device", "cpu"]].concat()).ok();
        quantize(&source, &emulated, &[&options[..], &["--device", "emulated"]].concat()).ok();
        let mut files: Vec<_> = fs::read_dir(&cpu).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        files.sort();
        assert!(files.iter().any(|name| name.to_string_lossy().ends_with(".safetensors")), "{files:?}");
        for name in files {
            let (want, got) = (fs::read(cpu.join(&name)).unwrap(), fs::read(emulated.join(&name)).unwrap());
            assert!(
                want == got,
                "{rule} group {group}: {} differs between --device cpu and emulated",
                name.to_string_lossy()
            );
        }
    }
}
