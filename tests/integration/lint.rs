//! The engine load rules end to end: `verify --engine` on good and crafted outputs (exit 1 naming the rule),
//! `quantize` refusing with exit 2 before writing anything, and `quantize` adding the router keys.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::{path_str, read_json, rewrite_header, squeeze, synth, Run};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary folder")
}

fn write_json(path: &Path, value: &Value) {
    fs::write(path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
}

fn verify(out: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["verify", path_str(out), "--engine", "all", "--json"];
    args.extend_from_slice(extra);
    squeeze(&args)
}

/// Statuses of rule `id` (one per row: engines that agree share a row).
fn statuses(report: &Value, id: &str) -> Vec<String> {
    report["engine_rules"]["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("no engine_rules in {report}"))
        .iter()
        .filter(|r| r["rule"] == id)
        .map(|r| r["status"].as_str().unwrap().to_string())
        .fold(Vec::new(), |mut statuses, status| {
            // Engines that agree are one row; per-engine rows with the same status count once.
            if statuses.last() != Some(&status) {
                statuses.push(status);
            }
            statuses
        })
}

/// The findings of rule `id` as one text.
fn findings(report: &Value, id: &str) -> String {
    report["engine_rules"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["rule"] == id)
        .flat_map(|r| r["findings"].as_array().cloned().unwrap_or_default())
        .map(|finding| finding.to_string())
        .collect()
}

/// Asserts that verify exits 1 with rule `id` failed for both engines and `needle` in its findings.
fn expect_rule_failure(out: &Path, id: &str, needle: &str) {
    let run = verify(out, &[]);
    assert_eq!(run.code, 1, "{id}: expected exit 1\nstdout:{}\nstderr:{}", run.stdout, run.stderr);
    let report = run.json();
    assert_eq!(report["passed"], false);
    assert_eq!(statuses(&report, id), vec!["failed"], "{id}: {}", report["engine_rules"]);
    let text = findings(&report, id);
    assert!(text.contains(needle), "{id}: `{needle}` not in {text}");
    // The human table names the rule, its source and the remedy too.
    let human = squeeze(&["verify", path_str(out), "--engine", "all"]);
    assert_eq!(human.code, 1);
    assert!(human.stdout.contains(id) && human.stdout.contains("failed"), "{}", human.stdout);
}

/// Writes a safetensors file of F32 `[1]` tensors.
fn write_f32_scalars(file: &Path, tensors: &[(&str, f32)]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, value) in tensors {
        header.insert(
            name.to_string(),
            json!({"dtype": "F32", "shape": [1], "data_offsets": [data.len(), data.len() + 4]}),
        );
        data.extend_from_slice(&value.to_le_bytes());
    }
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    bytes.extend_from_slice(&data);
    fs::write(file, bytes).unwrap();
}

/// A GLM-5 output (MLA, indexer, MTP layer 3) quantized with the default recipe.
fn glm5_output(dir: &Path) -> PathBuf {
    let source = synth(dir, "fp8", "glm5", &[]);
    let out = dir.join("int4");
    squeeze(&["quantize", path_str(&source), path_str(&out)]).ok();
    out
}

#[test]
fn lint_a_good_output_passes_for_both_engines() {
    let dir = tmp();
    let source = synth(dir.path(), "fp8", "glm5", &[]);
    let out = dir.path().join("int4");
    let quantized = squeeze(&["quantize", path_str(&source), path_str(&out), "--json"]).ok().json();
    assert_eq!(quantized["engine_rules"]["passed"], true, "{}", quantized["engine_rules"]);
    assert_eq!(quantized["engine_rules"]["tp"], 1, "tiny models default to tp 1");
    let report = verify(&out, &[]).ok().json();
    assert_eq!(report["passed"], true);
    let rules = &report["engine_rules"];
    assert_eq!(rules["engines"], json!(["vllm", "sglang"]));
    assert_eq!(rules["failed"], 0);
    for id in ["quant-method", "linear-target", "weight-args", "ignore-coverage", "fused-pairs", "routed-experts"] {
        assert_eq!(statuses(&report, id), vec!["passed"], "{id}: {rules}");
    }
    // GLM-5 has an MTP layer: its eh_proj is ignored and its experts are INT4.
    assert_eq!(statuses(&report, "mtp-eh-proj"), vec!["passed"]);
    assert!(findings(&report, "routed-experts").is_empty());
    for rule in rules["rules"].as_array().unwrap() {
        assert!(!rule["source"].as_str().unwrap().is_empty(), "{rule}");
    }
    let human = squeeze(&["verify", path_str(&out), "--engine", "vllm"]).ok();
    assert!(human.stdout.contains("engine load rules (vllm; tp 1)"), "{}", human.stdout);
    assert!(human.stdout.contains("compressed_tensors_moe_wna16.py"), "{}", human.stdout);
    // Without --engine, verify checks what it always did.
    let plain = squeeze(&["verify", path_str(&out), "--json"]).ok().json();
    assert!(plain["engine_rules"].is_null());
}

#[test]
fn lint_crafted_config_failures_exit_1_naming_the_rule() {
    let dir = tmp();
    let out = glm5_output(dir.path());
    let config_path = out.join("config.json");
    let original = read_json(&config_path);
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut config = original.clone();
        edit(&mut config);
        write_json(&config_path, &config);
    };
    let remove_ignore = |config: &mut Value, entry: &str| {
        let ignore = config["quantization_config"]["ignore"].as_array_mut().unwrap();
        let before = ignore.len();
        ignore.retain(|e| e != entry);
        assert_eq!(ignore.len() + 1, before, "{entry} was in ignore");
    };

    with(&|c| remove_ignore(c, "re:.*self_attn.*"));
    expect_rule_failure(&out, "ignore-coverage", "re:.*self_attn.*");

    // Anchored at the start (re.match): `re:self_attn` covers nothing.
    with(&|c| {
        let ignore = c["quantization_config"]["ignore"].as_array_mut().unwrap();
        let index = ignore.iter().position(|e| e == "re:.*self_attn.*").unwrap();
        ignore[index] = json!("re:self_attn");
    });
    expect_rule_failure(&out, "ignore-coverage", "model.layers.0.self_attn");

    // q_a_proj quantized, kv_a_proj_with_mqa ignored.
    with(&|c| {
        let ignore = c["quantization_config"]["ignore"].as_array_mut().unwrap();
        let index = ignore.iter().position(|e| e == "re:.*self_attn.*").unwrap();
        ignore[index] = json!("re:.*self_attn\\.(?!q_a_proj).*");
    });
    expect_rule_failure(&out, "fused-pairs", "Found a different quantization schemes");

    with(&|c| {
        c.as_object_mut().unwrap().remove("topk_method");
    });
    expect_rule_failure(&out, "router-topk", "noaux_tc");

    with(&|c| remove_ignore(c, "model.layers.3.eh_proj"));
    expect_rule_failure(&out, "mtp-eh-proj", "model.layers.3.eh_proj");

    with(&|c| c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = json!(16));
    expect_rule_failure(&out, "weight-args", "group_size");

    // Awkward configs: a missing key fails the rule naming it, never a panic.
    with(&|c| {
        c.as_object_mut().unwrap().remove("moe_intermediate_size");
    });
    expect_rule_failure(&out, "group-size-tp", "moe_intermediate_size");
    with(&|c| {
        c.as_object_mut().unwrap().remove("quantization_config");
    });
    expect_rule_failure(&out, "quant-method", "quantization_config");
    with(&|c| c["quantization_config"] = json!({"config_groups": "group_0", "ignore": 7}));
    expect_rule_failure(&out, "quant-method", "quant_method");

    write_json(&config_path, &original);
    verify(&out, &[]).ok();
}

#[test]
fn lint_crafted_tensor_failures_exit_1_naming_the_rule() {
    let dir = tmp();
    let out = glm5_output(dir.path());

    // A KV-scale name no engine loads (what vLLM's double remapping of self_attn.k_scale produces).
    let mut config = read_json(&out.join("config.json"));
    config["quantization_config"]["kv_cache_scheme"] =
        json!({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false, "symmetric": true});
    write_json(&out.join("config.json"), &config);
    write_f32_scalars(
        &out.join("kv-scales.safetensors"),
        &[("model.layers.1.self_attn.attn.attn.k_scale", 0.05), ("model.layers.1.self_attn.v_scale", 0.05)],
    );
    let index_path = out.join("model.safetensors.index.json");
    let original_index = read_json(&index_path);
    let mut index = original_index.clone();
    for name in ["model.layers.1.self_attn.attn.attn.k_scale", "model.layers.1.self_attn.v_scale"] {
        index["weight_map"][name] = json!("kv-scales.safetensors");
    }
    write_json(&index_path, &index);
    expect_rule_failure(&out, "kv-scales", "model.layers.1.self_attn.attn.attn.k_scale");

    // With the names the engines load, the rule passes with each engine's MLA caveat, per engine.
    write_f32_scalars(
        &out.join("kv-scales.safetensors"),
        &[("model.layers.1.self_attn.k_scale", 0.05), ("model.layers.1.self_attn.v_scale", 0.05)],
    );
    let mut index = original_index.clone();
    for name in ["model.layers.1.self_attn.k_scale", "model.layers.1.self_attn.v_scale"] {
        index["weight_map"][name] = json!("kv-scales.safetensors");
    }
    write_json(&index_path, &index);
    let report = verify(&out, &[]).ok().json();
    assert_eq!(statuses(&report, "kv-scales"), vec!["warning"], "{}", report["engine_rules"]);
    assert_eq!(
        report["engine_rules"]["rules"].as_array().unwrap().iter().filter(|r| r["rule"] == "kv-scales").count(),
        2
    );
    write_json(&index_path, &original_index);
    fs::remove_file(out.join("kv-scales.safetensors")).unwrap();

    // A packed weight with the wrong shape (same bytes: [320, 20] → [640, 10]).
    let module = "model.layers.1.mlp.experts.3.down_proj";
    let shard = out.join(read_json(&index_path)["weight_map"][format!("{module}.weight_packed")].as_str().unwrap());
    rewrite_header(&shard, |header| {
        assert_eq!(header[format!("{module}.weight_packed")]["shape"], json!([320, 20]));
        header[format!("{module}.weight_packed")]["shape"] = json!([640, 10]);
    });
    expect_rule_failure(&out, "int4-tensors", &format!("{module}.weight_packed"));
}

#[test]
fn lint_quantize_refuses_before_writing_when_a_rule_fails() {
    let dir = tmp();
    // moe_intermediate 256: 256 / tp 8 = 32 is not a multiple of group 128 (hidden 384 is).
    let source = synth(dir.path(), "fp8", "kimi-k2", &["--hidden", "384", "--moe-intermediate", "256"]);
    let out = dir.path().join("int4");
    let args = |extra: &[&str]| {
        let mut args = vec!["quantize", path_str(&source), path_str(&out), "--group-size", "128"];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| squeeze(&args(extra).iter().map(String::as_str).collect::<Vec<_>>());
    let refused = run(&["--tp", "8"]);
    assert_eq!(refused.code, 2, "stdout:{}\nstderr:{}", refused.stdout, refused.stderr);
    for needle in ["group-size-tp", "256 / tp 8 = 32", "use --group-size 32 or --tp 2", "nothing was written"] {
        assert!(refused.stderr.contains(needle), "`{needle}` not in {}", refused.stderr);
    }
    assert!(!out.exists(), "a refused run must not create the output folder");

    // The dry run prints the rule results and exits 1; --json includes them.
    let dry = run(&["--tp", "8", "--dry-run"]);
    assert_eq!(dry.code, 1, "{}", dry.stderr);
    assert!(dry.stdout.contains("group-size-tp") && dry.stdout.contains("FAILED"), "{}", dry.stdout);
    let dry = run(&["--tp", "8", "--dry-run", "--json"]);
    assert_eq!(dry.code, 1);
    assert_eq!(statuses(&dry.json(), "group-size-tp"), vec!["failed"]);
    assert!(!out.exists());

    // At tp 2 it converts, and verify at tp 8 names the same rule.
    run(&["--tp", "2"]).ok();
    let at_8 = verify(&out, &["--tp", "8"]);
    assert_eq!(at_8.code, 1, "{}", at_8.stdout);
    assert_eq!(statuses(&at_8.json(), "group-size-tp"), vec!["failed"]);
    verify(&out, &["--tp", "2"]).ok();
}

#[test]
fn lint_quantize_adds_topk_method_when_the_source_lacks_it() {
    let dir = tmp();
    let source = synth(dir.path(), "fp8", "kimi-k2", &[]);
    let mut config = read_json(&source.join("config.json"));
    let object = config.as_object_mut().unwrap();
    object.remove("topk_method");
    object.remove("scoring_func");
    write_json(&source.join("config.json"), &config);
    let out = dir.path().join("int4");
    let run = squeeze(&["quantize", path_str(&source), path_str(&out), "--json"]).ok();
    assert!(run.stderr.contains("added \"topk_method\": \"noaux_tc\""), "{}", run.stderr);
    let report = run.json();
    let keys: Vec<&str> =
        report["config_fixes"].as_array().unwrap().iter().map(|f| f["key"].as_str().unwrap()).collect();
    assert_eq!(keys, vec!["topk_method", "scoring_func"]);
    let written = read_json(&out.join("config.json"));
    assert_eq!(written["topk_method"], "noaux_tc");
    assert_eq!(written["scoring_func"], "sigmoid");
    assert_eq!(verify(&out, &[]).ok().json()["passed"], true);
    // The synthetic source as written has both keys: nothing is added.
    let complete = synth(dir.path(), "complete", "kimi-k2", &[]);
    let dry = squeeze(&["quantize", path_str(&complete), path_str(&dir.path().join("x")), "--json", "--dry-run"]).ok();
    assert_eq!(dry.json()["config_fixes"], json!([]));
    assert!(!dry.stderr.contains("topk_method"), "{}", dry.stderr);
}

#[test]
fn lint_calibrated_kv_scales_pass_per_tensor_and_fail_per_head() {
    let dir = tmp();
    // GLM-4.5: GQA attention (q/k/v_proj with bias), no topk_method in the release config.
    let source = synth(dir.path(), "fp8", "glm45", &["--layers", "2"]);
    let out = dir.path().join("int4");
    let run = squeeze(&["quantize", path_str(&source), path_str(&out), "--json"]).ok();
    let fixes = run.json()["config_fixes"].clone();
    assert_eq!(fixes[0]["key"], "topk_method", "GLM-4.5's config has no topk_method: {fixes}");
    assert_eq!(fixes[1]["key"], "scoring_func", "{fixes}");
    let tokens = dir.path().join("tokens.safetensors");
    crate::calibrate::write_tokens(&tokens, 2, 32, 384);

    squeeze(&["calibrate-kv", path_str(&out), "--tokens", path_str(&tokens)]).ok();
    let report = verify(&out, &[]).ok().json();
    assert_eq!(statuses(&report, "kv-cache-scheme"), vec!["passed"], "{}", report["engine_rules"]);
    assert_eq!(statuses(&report, "kv-scales"), vec!["passed"], "GQA: no MLA caveat");

    squeeze(&["calibrate-kv", path_str(&out), "--tokens", path_str(&tokens), "--strategy", "head"]).ok();
    let run = verify(&out, &[]);
    assert_eq!(run.code, 1);
    let report = run.json();
    assert_eq!(statuses(&report, "kv-cache-scheme"), vec!["failed"]);
    assert!(findings(&report, "kv-cache-scheme").contains("attn_head"));
    assert_eq!(statuses(&report, "kv-scales"), vec!["failed"]);
    assert!(findings(&report, "kv-scales").contains("per-tensor scales only"));
}
