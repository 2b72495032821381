//! Kimi-Linear and GLM-5.3-Flash (KDA linear attention beside NoPE MLA; GLM-5.3-Flash with mHC and the k-pool
//! indexer) through the subcommands: bad layouts refused with the key or tensor named, `calibrate-kv` scaling only
//! the layers that cache keys and values, `report` counting the KDA state per request, `quantize` keeping the KDA
//! parameters as shipped.

use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::common::{expect_exit_2, path_str, read_json, rewrite_header, squeeze, synth};

const SMALL: [&str; 10] =
    ["--layers", "3", "--hidden", "96", "--experts", "4", "--moe-intermediate", "64", "--vocab", "260"];

fn edit_config(model: &Path, edit: impl FnOnce(&mut Value)) {
    let path = model.join("config.json");
    let mut config = read_json(&path);
    edit(&mut config);
    fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

#[test]
fn bad_kda_layouts_exit_2_naming_the_key_or_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    fs::write(&text, "Shall I compare thee to a summer's day? ".repeat(8)).unwrap();
    let eval = |model: &Path| squeeze(&["eval", path_str(model), "--data", path_str(&text), "--ctx", "32"]);
    // The lists name other layers than the tensors hold: the tensors' layout and the lists that match it.
    let swapped = synth(dir.path(), "swapped", "kimi-linear", &SMALL);
    edit_config(&swapped, |config| {
        config["linear_attn_config"]["kda_layers"] = Value::from(vec![1, 2]);
        config["linear_attn_config"]["full_attn_layers"] = Value::from(vec![3]);
    });
    expect_exit_2(&eval(&swapped), &["KDA layers (self_attn.q_conv1d) at [1, 3]", "set kda_layers [1, 3]"]);
    // Written 0-indexed.
    let zero = synth(dir.path(), "zero", "kimi-linear", &SMALL);
    edit_config(&zero, |config| {
        config["linear_attn_config"]["kda_layers"] = Value::from(vec![0, 2]);
        config["linear_attn_config"]["full_attn_layers"] = Value::from(vec![1]);
    });
    expect_exit_2(&eval(&zero), &["kda_layers", "1-indexed", "add 1 to each entry"]);
    // layer_types and mlp_layer_types of the wrong length or with an unknown value.
    let typed = synth(dir.path(), "typed", "kimi-linear", &SMALL);
    edit_config(&typed, |config| config["layer_types"] = serde_json::json!(["linear_attention", "full_attention"]));
    expect_exit_2(&eval(&typed), &["layer_types", "2 entries", "num_hidden_layers is 3"]);
    edit_config(&typed, |config| {
        config["layer_types"] = serde_json::json!(["linear_attention", "full_attention", "mamba"]);
    });
    expect_exit_2(&eval(&typed), &["layer_types", "mamba"]);
    edit_config(&typed, |config| {
        config.as_object_mut().unwrap().remove("layer_types");
        config["mlp_layer_types"] = serde_json::json!(["dense", "sparse", "moe"]);
    });
    expect_exit_2(&eval(&typed), &["mlp_layer_types", "\"moe\""]);
    // A KDA layer without its convolution (renamed away in its shard and the index): the tensor named.
    let model = synth(dir.path(), "model", "kimi-linear", &SMALL);
    let (name, other) = ("model.layers.2.self_attn.k_conv1d.weight", "model.layers.2.self_attn.k_convolution");
    let index = model.join("model.safetensors.index.json");
    let mut map = read_json(&index);
    let weights = map["weight_map"].as_object_mut().unwrap();
    let shard = weights.remove(name).unwrap();
    weights.insert(other.into(), shard.clone());
    fs::write(&index, serde_json::to_vec(&map).unwrap()).unwrap();
    rewrite_header(&model.join(shard.as_str().unwrap()), |header| {
        let entry = header.as_object_mut().unwrap().remove(name).unwrap();
        header[other] = entry;
    });
    expect_exit_2(&eval(&model), &["`model.layers.2.self_attn.k_conv1d.weight` is missing"]);
}

#[test]
fn calibrate_kv_scales_only_the_attention_layers_and_report_counts_the_kda_state() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "model", "kimi-linear", &SMALL);
    let int4 = dir.path().join("int4");
    let quantized = squeeze(&["quantize", path_str(&model), path_str(&int4), "--json"]).ok().json();
    assert_eq!(quantized["recipe"], "kimi-linear-int4", "{quantized}");
    let text = dir.path().join("text.txt");
    fs::write(&text, "Shall I compare thee to a summer's day? ".repeat(40)).unwrap();
    let report = squeeze(&["calibrate-kv", path_str(&int4), "--data", path_str(&text), "--json"]).ok().json();
    let layers: Vec<u64> = report["layers"].as_array().unwrap().iter().map(|l| l["layer"].as_u64().unwrap()).collect();
    assert_eq!(layers, [1], "{report}");
    assert_eq!(report["state_layers"], serde_json::json!([0, 2]));
    let names: Vec<String> = read_json(&int4.join("model.safetensors.index.json"))["weight_map"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|name| name.ends_with("k_scale"))
        .cloned()
        .collect();
    assert!(!names.is_empty() && names.iter().all(|name| name.starts_with("model.layers.1.")), "{names:?}");
    // The KDA projections stay as shipped (BF16), the routed experts INT4.
    let index = read_json(&int4.join("model.safetensors.index.json"));
    let map = index["weight_map"].as_object().unwrap();
    assert!(map.contains_key("model.layers.0.self_attn.q_proj.weight"));
    assert!(map.contains_key("model.layers.1.block_sparse_moe.experts.0.w1.weight_packed"));
    // report: 4 heads × 32² F32 recurrent + 3 × 128 × 3 BF16 conv inputs per KDA layer, two KDA layers, at tp 1.
    let sized = squeeze(&["report", path_str(&model), "--gpus", "1", "--tp", "1", "--json"]).ok().json();
    let state = sized["kv"]["bf16"]["state_bytes_per_request"].as_u64().unwrap();
    assert_eq!(state, 2 * (4 * 32 * 32 * 4 + 3 * 128 * 3 * 2), "{}", sized["kv"]);
    assert_eq!(sized["kv"]["bf16"]["layers"], 1);
}

/// GLM-5.3-Flash (`glm5_next`: KDA beside NoPE MLA with the k-pool indexer, mHC, FP8 as released) from `synth`
/// through every subcommand the runtime covers: INT4 with the KDA parameters and mHC kept, `verify --engine all`,
/// eval and parity, `calibrate-kv` on the attention layers only, `report` with the KDA state, `serve-test` of the
/// split deployment catching a corrupted state slot and a stale page; `--mtp` refused with why.
#[test]
fn glm53_flash_runs_from_fp8_to_int4() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "model", "glm5.3-flash", &SMALL);
    let int4 = dir.path().join("int4");
    let quantized = squeeze(&["quantize", path_str(&model), path_str(&int4), "--json"]).ok().json();
    assert_eq!(quantized["recipe"], "glm5.3-flash-int4", "{quantized}");
    let index = read_json(&int4.join("model.safetensors.index.json"));
    let map = index["weight_map"].as_object().unwrap();
    for kept in [
        "model.language_model.layers.0.self_attn.q_conv1d.weight",
        "model.language_model.layers.0.self_attn.A_log",
        "model.language_model.layers.0.hc_attn_fn",
        "model.language_model.layers.1.self_attn.indexer.index_kpool_compress_gate",
        "model.language_model.layers.1.mlp.experts.0.gate_proj.weight_packed",
    ] {
        assert!(map.contains_key(kept), "{kept} missing from the INT4 output");
    }
    let config = read_json(&int4.join("config.json"));
    assert_eq!(config["text_config"]["topk_method"], "noaux_tc", "the router keys go where the text model reads them");
    // vLLM's glm5next reads these three without a default; quantize adds them (the synthetic source lacks them).
    for (key, value) in [("mhc", true), ("mla_use_nope", true), ("indexer_rope_interleave", false)] {
        assert_eq!(config["text_config"][key], value, "{key}: {}", config["text_config"]);
    }
    assert!(quantized["config_fixes"].to_string().contains("mla_use_nope"), "{quantized}");
    squeeze(&["verify", path_str(&int4), "--engine", "all"]).ok();

    let text = dir.path().join("text.txt");
    fs::write(&text, "Shall I compare thee to a summer's day? ".repeat(40)).unwrap();
    let eval = squeeze(&["eval", path_str(&model), "--data", path_str(&text), "--ctx", "48", "--json"]).ok().json();
    assert!(eval["mean_nll"].as_f64().is_some_and(f64::is_finite), "{eval}");
    let same = [path_str(&model), path_str(&model)];
    let parity = squeeze(&[
        "eval",
        "--reference",
        same[0],
        "--candidate",
        same[1],
        "--data",
        path_str(&text),
        "--ctx",
        "48",
        "--json",
    ])
    .ok()
    .json();
    // The same weights on both nodes: the split hand-over (KDA conv inputs stored BF16) is the only difference.
    let split = &parity["modes"]["split"];
    assert!(split["mean_kld"].as_f64().is_some_and(|kld| kld < 1e-3), "{split}");

    let calibrated = squeeze(&["calibrate-kv", path_str(&int4), "--data", path_str(&text), "--json"]).ok().json();
    let layers: Vec<u64> =
        calibrated["layers"].as_array().unwrap().iter().map(|l| l["layer"].as_u64().unwrap()).collect();
    assert_eq!(layers, [1, 2], "{calibrated}");
    assert_eq!(calibrated["state_layers"], serde_json::json!([0]));
    let sized = squeeze(&["report", path_str(&model), "--gpus", "1", "--tp", "1", "--json"]).ok().json();
    assert_eq!(sized["kv"]["bf16"]["layers"], 2, "{}", sized["kv"]);
    // One KDA layer's state (F32 recurrent, BF16 conv tail) and the one full indexer layer's unfinished k-pool ring
    // (4 rows of BF16 key and gate score, 2 × 32 each).
    assert_eq!(sized["kv"]["bf16"]["state_bytes_per_request"], 4 * 32 * 32 * 4 + 3 * 128 * 3 * 2 + 4 * 2 * 32 * 2);
    assert_eq!(sized["kv"]["bf16"]["indexer_pool"], 4, "{}", sized["kv"]);

    // The split deployment in miniature: prompts prefilled on FP8, decoded on INT4 with an FP8 cache; the KDA
    // states in their slots, the attention layers' rows and k-pool keys in pages, all verified.
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve-test", path_str(&int4), "--prefill-model", path_str(&model), "--kv-dtype", "fp8"];
        args.extend(["--prompt", "Shall I compare thee", "--prompt", "to a summer's day?", "--max-new-tokens", "6"]);
        args.extend(extra);
        args.push("--json");
        squeeze(&args).ok().json()
    };
    let clean = serve(&[]);
    assert_eq!((clean["completed"].clone(), clean["aborted"].clone()), (2.into(), 0.into()), "{clean}");
    for fault in ["state-corrupt@2", "stale-page@2"] {
        let report = serve(&["--inject-fault", fault]);
        assert_eq!((report["faults_injected"].clone(), report["undetected"].clone()), (1.into(), 0.into()), "{fault}");
        assert_eq!((report["aborted"].clone(), report["false_positives"].clone()), (1.into(), 0.into()), "{fault}");
    }
    // The MTP layer as vLLM's glm5next drafter runs it (an MLA layer without mHC): drafts on FP8 and INT4.
    let drafts = |model: &Path| {
        let args = ["eval", path_str(model), "--data", path_str(&text), "--ctx", "48", "--mtp", "--json"];
        squeeze(&args).ok().json()["mtp"].clone()
    };
    let (fp8, int4_drafts) = (drafts(&model), drafts(&int4));
    assert!(fp8["positions"].as_u64().is_some_and(|p| p > 0), "{fp8}");
    assert_eq!(fp8["positions"], int4_drafts["positions"]);
    assert_ne!(fp8["mean_kld"], int4_drafts["mean_kld"], "INT4 experts move the drafts");
    let chained = squeeze(&["eval", path_str(&model), "--data", path_str(&text), "--mtp", "--mtp-depth", "2"]);
    expect_exit_2(&chained, &["--mtp-depth above 1 waits for GLM-5.3-Flash"]);
}

/// GLM-5.3-Flash's layout keys against its tensors: exit 2 naming the key and the value that matches.
#[test]
fn bad_glm53_flash_layouts_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    fs::write(&text, "Shall I compare thee to a summer's day? ".repeat(8)).unwrap();
    let eval = |model: &Path| squeeze(&["eval", path_str(model), "--data", path_str(&text), "--ctx", "32"]);
    let model = synth(dir.path(), "model", "glm5.3-flash", &SMALL);
    let text_config = |edit: &dyn Fn(&mut Value)| edit_config(&model, |config| edit(&mut config["text_config"]));
    text_config(&|t| t["hc_mult"] = Value::from(2));
    expect_exit_2(&eval(&model), &["4 mHC streams", "hc_mult is 2", "set hc_mult 4"]);
    text_config(&|t| {
        t["hc_mult"] = Value::from(4);
        t["layer_types"] = serde_json::json!(["indexed_attention", "indexed_attention", "linear_attention"]);
    });
    expect_exit_2(&eval(&model), &["KDA layers (self_attn.q_conv1d) at [0]", "set layer_types"]);
    text_config(&|t| t["layer_types"] = serde_json::json!(["linear_attention", "indexed_attention"]));
    expect_exit_2(&eval(&model), &["layer_types", "2 entries"]);
    text_config(&|t| t["layer_types"] = serde_json::json!(["linear_attention", "indexed_attention", "hybrid"]));
    expect_exit_2(&eval(&model), &["layer_types", "\"hybrid\""]);
    text_config(&|t| {
        t["layer_types"] = serde_json::json!(["linear_attention", "indexed_attention", "indexed_attention"]);
        t["indexer_types"] = serde_json::json!(["full", "shared", "shared"]);
    });
    expect_exit_2(&eval(&model), &["indexer_types", "first attention layer", "make it \"full\""]);
    text_config(&|t| t["indexer_types"] = serde_json::json!(["full", "full"]));
    expect_exit_2(&eval(&model), &["indexer_types", "2 entries"]);
}
