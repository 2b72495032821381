//! `squeeze calibrate-kv` end to end: a model whose V activations have a known amax (V = the bias after zeroing
//! v_proj) gives exactly that scale, per tensor and per head; the written shard, index and config load back
//! through `squeeze eval`; MLA writes v_scale = k_scale; --out and --sglang-json.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{path_str, squeeze, synth, write_input_ids};

/// Writes a safetensors file holding one I64 tensor `input_ids` `[rows, ctx]` of varied ids below `vocab`.
pub fn write_tokens(path: &Path, rows: usize, ctx: usize, vocab: u64) {
    let id = |i: usize| ((i as u64 * 2654435761 + 17) % vocab) as i64;
    let ids: Vec<Vec<i64>> = (0..rows).map(|row| (0..ctx).map(|column| id(row * ctx + column)).collect()).collect();
    write_input_ids(path, &ids);
}

/// Rewrites the bytes of tensor `name` of the model folder `dir` in place with `edit(bytes, dtype)`.
pub fn edit_tensor(dir: &Path, name: &str, edit: impl FnOnce(&mut [u8], &str)) {
    let index: Value = serde_json::from_slice(&fs::read(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    let file = dir.join(index["weight_map"][name].as_str().unwrap_or_else(|| panic!("{name} is not in the index")));
    let mut bytes = fs::read(&file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let entry = &header[name];
    let [start, end] = [0, 1].map(|i| entry["data_offsets"][i].as_u64().unwrap() as usize + 8 + header_len);
    edit(&mut bytes[start..end], entry["dtype"].as_str().unwrap());
    fs::write(&file, bytes).unwrap();
}

fn bf16(value: f32) -> [u8; 2] {
    let bits = value.to_bits();
    assert_eq!(bits & 0xffff, 0, "{value} is not exact in BF16");
    ((bits >> 16) as u16).to_le_bytes()
}

/// Head 0 of V peaks at |−5.5|, head 1 at 2.25 (values exact in BF16).
fn known_bias(head_dim: usize) -> Vec<f32> {
    (0..2 * head_dim)
        .map(|i| {
            if i == 5 {
                -5.5
            } else if i == head_dim + 9 {
                2.25
            } else {
                ((i % 7) as f32 - 3.0) * 0.5
            }
        })
        .collect()
}

fn read_f32_tensor(file: &Path, name: &str) -> (Vec<usize>, Vec<f32>) {
    let bytes = fs::read(file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let entry = &header[name];
    assert_eq!(entry["dtype"], "F32", "{name}: {entry}");
    let shape = entry["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let [start, end] = [0, 1].map(|i| entry["data_offsets"][i].as_u64().unwrap() as usize + 8 + header_len);
    (shape, bytes[start..end].chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
}

#[test]
fn known_amax_gives_its_scale_and_the_files_load_back() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm45", "glm45", &[]);
    let config: Value = serde_json::from_slice(&fs::read(model.join("config.json")).unwrap()).unwrap();
    let head_dim = config["head_dim"].as_u64().unwrap() as usize;
    assert_eq!(config["num_key_value_heads"], 2);
    // V of layer 0 = its bias for every token: zero the FP8 weight, set the bias.
    edit_tensor(&model, "model.layers.0.self_attn.v_proj.weight", |bytes, dtype| {
        assert_eq!(dtype, "F8_E4M3");
        bytes.fill(0);
    });
    let bias = known_bias(head_dim);
    edit_tensor(&model, "model.layers.0.self_attn.v_proj.bias", |bytes, dtype| {
        assert_eq!(dtype, "BF16");
        for (chunk, value) in bytes.chunks_mut(2).zip(&bias) {
            chunk.copy_from_slice(&bf16(*value));
        }
    });
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 3, 24, 384);

    // Per tensor, written into the model folder.
    let sglang = dir.path().join("sglang.json");
    let run = squeeze(&[
        "calibrate-kv",
        path_str(&model),
        "--tokens",
        path_str(&tokens),
        "--json",
        "--sglang-json",
        path_str(&sglang),
    ])
    .ok();
    let report = run.json();
    let layer0 = &report["layers"][0];
    assert_eq!(layer0["v_amax"].as_f64().unwrap(), 5.5, "{layer0}");
    assert_eq!(layer0["tokens"], 72);
    let (shape, values) = read_f32_tensor(&model.join("kv-scales.safetensors"), "model.layers.0.self_attn.v_scale");
    assert_eq!(shape, vec![1]);
    assert_eq!(values, vec![5.5f32 / 448.0]);
    assert_eq!(layer0["v_saturated"].as_f64().unwrap(), 0.0);
    let config: Value = serde_json::from_slice(&fs::read(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config["quantization_config"]["kv_cache_scheme"],
        serde_json::json!({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false, "symmetric": true})
    );
    let index: Value = serde_json::from_slice(&fs::read(model.join("model.safetensors.index.json")).unwrap()).unwrap();
    for layer in 0..3 {
        for which in ["k_scale", "v_scale"] {
            assert_eq!(index["weight_map"][format!("model.layers.{layer}.self_attn.{which}")], "kv-scales.safetensors");
        }
    }
    let sglang: Value = serde_json::from_slice(&fs::read(&sglang).unwrap()).unwrap();
    assert_eq!(sglang["kv_cache"]["dtype"], "float8_e4m3fn");
    assert!(sglang["kv_cache"]["scaling_factor"]["0"]["0"].as_f64().unwrap() >= 5.5 / 448.0 * 0.999);
    // The folder still opens (index + new shard) and the scales are found: no missing-scale warning.
    let parity = squeeze(&[
        "eval",
        "--reference",
        path_str(&model),
        "--candidate",
        path_str(&model),
        "--tokens",
        path_str(&tokens),
        "--modes",
        "kv",
        "--json",
        "--max-mean-kld",
        "100",
        "--min-same-top",
        "0",
        "--max-ppl-ratio",
        "100",
    ])
    .ok();
    assert!(!parity.stderr.contains("no FP8 KV-cache scales"), "{}", parity.stderr);
    assert_eq!(parity.json()["missing_kv_scales"], serde_json::json!([]));
    // Calibrating again replaces the shard rather than adding a second one.
    squeeze(&["calibrate-kv", path_str(&model), "--tokens", path_str(&tokens)]).ok();

    // Per head, into --out: head 0 peaks at 5.5, head 1 at 2.25.
    let out = dir.path().join("scales-only");
    squeeze(&[
        "calibrate-kv",
        path_str(&model),
        "--tokens",
        path_str(&tokens),
        "--strategy",
        "head",
        "--out",
        path_str(&out),
    ])
    .ok();
    let (shape, values) = read_f32_tensor(&out.join("kv-scales.safetensors"), "model.layers.0.self_attn.v_scale");
    assert_eq!(shape, vec![2, 1, 1]);
    assert_eq!(values, vec![5.5f32 / 448.0, 2.25 / 448.0]);
    let config: Value = serde_json::from_slice(&fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization_config"]["kv_cache_scheme"]["strategy"], "attn_head");
    assert!(out.join("model.safetensors.index.json").exists());
}

#[test]
fn mla_writes_one_latent_scale_and_percentile_reports_clipping() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "kimi", "kimi-k2", &[]);
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 2, 32, 384);
    let report = squeeze(&["calibrate-kv", path_str(&model), "--tokens", path_str(&tokens), "--json"]).ok().json();
    assert_eq!(report["cache"], "mla");
    for layer in report["layers"].as_array().unwrap() {
        assert_eq!(layer["k_scale"], layer["v_scale"]);
        let amax = layer["k_amax"].as_f64().unwrap();
        assert!((layer["k_scale"][0].as_f64().unwrap() - amax / 448.0).abs() < 1e-9 * amax.max(1.0));
        assert_eq!(layer["tokens"], 64);
    }
    let clipped = squeeze(&[
        "calibrate-kv",
        path_str(&model),
        "--tokens",
        path_str(&tokens),
        "--percentile",
        "99",
        "--dry-run",
        "--json",
    ])
    .ok()
    .json();
    for layer in clipped["layers"].as_array().unwrap() {
        let share = layer["k_saturated"].as_f64().unwrap();
        assert!(share > 0.0 && share < 0.05, "clip rate {share}: {layer}");
    }
    let bad = squeeze(&["calibrate-kv", path_str(&model), "--tokens", path_str(&tokens), "--percentile", "0"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("--percentile"), "{}", bad.stderr);
}

/// Sum of the data bytes of every tensor in the folder's `.safetensors` files (what `metadata.total_size` holds).
fn tensor_data_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = fs::read(&path).unwrap();
            let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
            for (name, info) in header.as_object().unwrap() {
                if name != "__metadata__" {
                    total += info["data_offsets"][1].as_u64().unwrap() - info["data_offsets"][0].as_u64().unwrap();
                }
            }
        }
    }
    total
}

fn index_of(dir: &Path) -> Value {
    serde_json::from_slice(&fs::read(dir.join("model.safetensors.index.json")).unwrap()).unwrap()
}

#[test]
fn names_follow_the_engines_and_total_size_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let gqa = synth(dir.path(), "glm45", "glm45", &[]);
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 2, 24, 384);
    let calibrate = |model: &Path, engine: &str| {
        squeeze(&["calibrate-kv", path_str(model), "--tokens", path_str(&tokens), "--engine", engine, "--json"])
            .ok()
            .json()
    };
    let report = calibrate(&gqa, "vllm");
    assert_eq!(report["tensor_names"], serde_json::json!([["self_attn.k_scale", "self_attn.v_scale"]]));
    assert_eq!(report["engines"][0]["uses"], "checkpoint");
    let index = index_of(&gqa);
    assert_eq!(index["weight_map"]["model.layers.1.self_attn.k_scale"], "kv-scales.safetensors");
    assert!(index["weight_map"].get("model.layers.1.self_attn.attn.k_scale").is_none());
    assert_eq!(index["metadata"]["total_size"].as_u64().unwrap(), tensor_data_bytes(&gqa));
    // SGLang loads only the exact parameter name self_attn.attn.k_scale: written as well, same values.
    calibrate(&gqa, "sglang");
    let index = index_of(&gqa);
    for layer in 0..3 {
        for (vllm, sglang) in [("k_scale", "attn.k_scale"), ("v_scale", "attn.v_scale")] {
            let shard = gqa.join("kv-scales.safetensors");
            let a = read_f32_tensor(&shard, &format!("model.layers.{layer}.self_attn.{vllm}"));
            let b = read_f32_tensor(&shard, &format!("model.layers.{layer}.self_attn.{sglang}"));
            assert_eq!(a, b, "layer {layer} {vllm}");
            assert_eq!(
                index["weight_map"][format!("model.layers.{layer}.self_attn.{sglang}")],
                "kv-scales.safetensors"
            );
        }
    }
    assert_eq!(index["metadata"]["total_size"].as_u64().unwrap(), tensor_data_bytes(&gqa));

    // MLA: the report says plainly that both engines ignore the scales, with the figures at 1.0 and calibrated.
    let mla = synth(dir.path(), "kimi", "kimi-k2", &[]);
    let run = squeeze(&["calibrate-kv", path_str(&mla), "--tokens", path_str(&tokens)]).ok();
    assert!(run.stdout.contains("vLLM 0.32: ignores these scales (caches with 1.0)"), "{}", run.stdout);
    assert!(run.stdout.contains("SGLang 0.5.23: ignores these scales (caches with 1.0)"), "{}", run.stdout);
    assert!(run.stdout.contains("@1.0 sub %"), "{}", run.stdout);
    let report =
        squeeze(&["calibrate-kv", path_str(&mla), "--tokens", path_str(&tokens), "--json", "--dry-run"]).ok().json();
    assert!(report["engines"].as_array().unwrap().iter().all(|e| e["uses"] == "unit"), "{}", report["engines"]);
    assert_eq!(
        report["tensor_names"][1],
        serde_json::json!(["self_attn.attn_mqa.k_scale", "self_attn.attn_mqa.v_scale"])
    );
    for layer in report["layers"].as_array().unwrap() {
        for key in ["k_saturated_at_one", "k_subnormal_at_one", "k_subnormal", "v_subnormal_at_one"] {
            let share = layer[key].as_f64().unwrap_or(-1.0);
            assert!((0.0..=1.0).contains(&share), "{key}: {layer}");
        }
        // A calibrated scale maps the amax to 448: nothing saturates, whatever happens at 1.0.
        assert_eq!(layer["k_saturated"].as_f64().unwrap(), 0.0, "{layer}");
    }
    // The GLM-5 sparse cache: dynamic tiles in both engines.
    let dsa = synth(dir.path(), "glm5", "glm5", &[]);
    let report =
        squeeze(&["calibrate-kv", path_str(&dsa), "--tokens", path_str(&tokens), "--json", "--dry-run"]).ok().json();
    assert!(
        report["engines"].as_array().unwrap().iter().all(|e| e["uses"] == "dynamic-tiles"),
        "{}",
        report["engines"]
    );
}

#[test]
fn kv_scales_one_equals_a_candidate_without_scales() {
    let dir = tempfile::tempdir().unwrap();
    let reference = synth(dir.path(), "ref", "glm45", &[]);
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 3, 32, 384);
    let bare = dir.path().join("int4");
    squeeze(&["quantize", path_str(&reference), path_str(&bare)]).ok();
    let scaled = dir.path().join("int4-scaled");
    squeeze(&["quantize", path_str(&reference), path_str(&scaled)]).ok();
    squeeze(&["calibrate-kv", path_str(&scaled), "--tokens", path_str(&tokens)]).ok();
    let parity = |candidate: &Path, choice: &str| {
        squeeze(&[
            "eval",
            "--reference",
            path_str(&reference),
            "--candidate",
            path_str(candidate),
            "--tokens",
            path_str(&tokens),
            "--modes",
            "kv,split",
            "--kv-scales",
            choice,
            "--json",
            "--max-mean-kld",
            "100",
            "--min-same-top",
            "0",
            "--max-ppl-ratio",
            "100",
        ])
        .ok()
        .json()
    };
    let one = parity(&scaled, "one");
    let without = parity(&bare, "calibrated");
    let calibrated = parity(&scaled, "calibrated");
    let engine = parity(&scaled, "engine");
    assert_eq!(one["kv_scales"]["applied"], "unit");
    assert_eq!(without["missing_kv_scales"].as_array().unwrap().len(), 3);
    for mode in ["kv", "split"] {
        let kld = |report: &Value| report["modes"][mode]["mean_kld"].as_f64().unwrap();
        assert_eq!(kld(&one), kld(&without), "{mode}: --kv-scales one is a candidate without scales");
        assert_ne!(kld(&one), kld(&calibrated), "{mode}: the calibrated scales change the FP8 cache");
        // GLM-4.5 is GQA: vLLM divides by the checkpoint's scales, so `engine` is `calibrated`.
        assert_eq!(kld(&engine), kld(&calibrated), "{mode}");
    }
    assert_eq!(engine["kv_scales"]["applied"], "checkpoint");
}

/// A synthetic kimi-k2 FP8 model in `dir` whose expert 0 of every MoE layer can never be selected (its correction
/// bias, used for selection only, is −10⁴), and 3 × 40 calibration token ids for it.
pub fn never_routed_expert_source(dir: &Path) -> (PathBuf, PathBuf) {
    let source = synth(dir, "fp8", "kimi-k2", &["--seed", "7"]);
    for layer in 1..3 {
        edit_tensor(&source, &format!("model.layers.{layer}.mlp.gate.e_score_correction_bias"), |bytes, dtype| {
            assert_eq!(dtype, "F32");
            bytes[..4].copy_from_slice(&(-1e4f32).to_le_bytes());
        });
    }
    let tokens = dir.join("calibration.safetensors");
    write_tokens(&tokens, 3, 40, 384);
    (source, tokens)
}
