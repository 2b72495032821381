//! The FP4-native releases as sources (Kimi K3: compressed-tensors MXFP4 experts inside the `kimi_k3` wrapper;
//! DeepSeek-V4: DeepSeek's own names, MXFP4 experts as `weight` I8 + `scale` E8M0, FP8 with E8M0 block scales):
//! the lossless cast to NVFP4 judged by compressed-tensors (`tests/golden/ct_fp4_cast.safetensors`,
//! `scripts/oracle/make-fp4-cast-golden.py`), MXFP4 kept byte for byte, INT4 with its error measured, `inspect`,
//! `report` and `verify --engine vllm` on them, and the bad inputs each is refused for.

use std::path::{Path, PathBuf};

use squeeze::format::row_reader::RowReader;
use squeeze::format::vendor_source::stored_item;
use squeeze::io::{Checkpoint, ShardFile};

use crate::common::{expect_exit_2, path_str, read_json, rewrite_header, squeeze, synth, tensor_bytes, tensor_names};

/// Each release: synth name, recipe prefix, the golden's expert, the codes' and the scales' suffixes.
const RELEASES: [(&str, &str, &str, &str, &str); 2] = [
    ("kimi-k3", "kimi-k3", "language_model.model.layers.1.block_sparse_moe.experts.0", "weight_packed", "weight_scale"),
    ("deepseek-v4", "deepseek-v4", "layers.1.ffn.experts.0", "weight", "scale"),
];

const SONNETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");

fn golden() -> ShardFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/ct_fp4_cast.safetensors");
    ShardFile::open(&path).expect("golden file")
}

fn golden_key(arch: &str) -> &'static str {
    if arch == "kimi-k3" {
        "k3"
    } else {
        "dsv4"
    }
}

fn quantize(source: &Path, out: &Path, recipe: &str) {
    squeeze(&["quantize", path_str(source), path_str(out), "--recipe", recipe, "--engine", "vllm"]).ok();
}

/// Every stored tensor of `dir` whose name ends with one of `suffixes` and holds a routed expert.
fn expert_tensors(dir: &Path, suffixes: &[&str]) -> Vec<String> {
    let experts = |name: &str| name.contains(".experts.") && !name.contains("shared");
    tensor_names(dir).into_iter().filter(|n| experts(n) && suffixes.iter().any(|s| n.ends_with(s))).collect()
}

#[test]
fn mxfp4_cast_to_nvfp4_is_what_compressed_tensors_decodes_to_the_source_values() {
    let temp = tempfile::tempdir().unwrap();
    let golden = golden();
    let bytes = |name: &str| golden.get(name).unwrap_or_else(|| panic!("{name} missing")).bytes.to_vec();
    for (arch, recipe, expert, packed_suffix, scale_suffix) in RELEASES {
        let key = golden_key(arch);
        let source = synth(temp.path(), arch, arch, &[]);
        if arch == "deepseek-v4" {
            // transformers reads `intermediate_size` as V4's `moe_intermediate_size` (its config's attribute map),
            // so a stray one resizes its experts; the release ships none.
            assert!(read_json(&source.join("config.json")).get("intermediate_size").is_none());
        }
        let out = temp.path().join(format!("{arch}-nvfp4"));
        quantize(&source, &out, &format!("{recipe}-nvfp4"));
        let checkpoint = Checkpoint::open(&source).unwrap();
        for projection in ["w1", "w2", "w3"] {
            let module = format!("{expert}.{projection}");
            let stored = tensor_bytes(&source, &format!("{module}.{packed_suffix}"));
            assert_eq!(stored, bytes(&format!("{key}.{projection}.source_packed")), "synth made {arch}'s golden");
            let scales = tensor_bytes(&source, &format!("{module}.{scale_suffix}"));
            assert_eq!(scales, bytes(&format!("{key}.{projection}.source_scale")), "{arch} {projection} scales");
            // squeeze reads the MXFP4 source as compressed-tensors decompresses it.
            let item = stored_item(&checkpoint, &format!("{module}.weight"), [128, 128]).unwrap();
            let values = RowReader::new(&checkpoint, &item).unwrap().read_all();
            let want: Vec<u32> = bytes(&format!("{key}.{projection}.decoded"))
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert_eq!(values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "{arch} {projection} read");
            // The cast: the bytes compressed-tensors decoded to those same values, bit for bit.
            for suffix in ["weight_packed", "weight_scale", "weight_global_scale"] {
                let got = tensor_bytes(&out, &format!("{module}.{suffix}"));
                assert!(got == bytes(&format!("{key}.{projection}.nvfp4.{suffix}")), "{arch} {projection} {suffix}");
            }
        }
        // Gate and up of every expert share one global scale (vLLM's fused w13).
        for w1 in expert_tensors(&out, &[".w1.weight_global_scale"]) {
            let w3 = w1.replace(".w1.", ".w3.");
            assert_eq!(tensor_bytes(&out, &w1), tensor_bytes(&out, &w3), "{w1}");
        }
        let verify = squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--engine", "vllm", "--json"]);
        let verify = verify.ok().json();
        assert_eq!(verify["passed"], true, "{arch}: {verify}");
        let worst = verify["worst"].as_array().unwrap();
        assert!(!worst.is_empty() && worst.iter().all(|w| w["relative_l2"] == 0.0), "{arch}: {worst:?}");
    }
}

#[test]
fn mxfp4_is_kept_byte_for_byte_and_int4_reports_and_verifies_its_error() {
    let temp = tempfile::tempdir().unwrap();
    for (arch, recipe, _, packed_suffix, scale_suffix) in RELEASES {
        let source = synth(temp.path(), arch, arch, &[]);
        let mxfp4 = temp.path().join(format!("{arch}-mxfp4"));
        quantize(&source, &mxfp4, &format!("{recipe}-mxfp4"));
        let packed = expert_tensors(&source, &[&format!(".{packed_suffix}")]);
        assert_eq!(packed.len(), if arch == "kimi-k3" { 48 } else { 96 }, "{arch}");
        for name in packed {
            let module = name.rsplit_once('.').unwrap().0;
            let out_packed = tensor_bytes(&mxfp4, &format!("{module}.weight_packed"));
            assert!(out_packed == tensor_bytes(&source, &name), "{name}");
            let out_scale = tensor_bytes(&mxfp4, &format!("{module}.weight_scale"));
            assert!(out_scale == tensor_bytes(&source, &format!("{module}.{scale_suffix}")), "{module} scales");
        }
        let config = read_json(&mxfp4.join("config.json"));
        let text = if arch == "kimi-k3" { &config["text_config"] } else { &config };
        assert_eq!(text["quantization_config"]["format"], "mxfp4-pack-quantized", "{arch}");

        let report = squeeze(&["report", path_str(&source), "--recipe", &format!("{recipe}-int4"), "--json"]).ok();
        let estimate = &report.json()["requantization"];
        assert_eq!((&estimate["source_group_size"], &estimate["scheme"]), (&32.into(), &"int4".into()), "{estimate}");
        let predicted = estimate["mean_relative_l2"].as_f64().unwrap();
        assert!(predicted > 0.01 && predicted < 0.2, "{arch}: {predicted}");
        let int4 = temp.path().join(format!("{arch}-int4"));
        quantize(&source, &int4, &format!("{recipe}-int4"));
        let verify = squeeze(&["verify", path_str(&int4), "--source", path_str(&source), "--engine", "vllm", "--json"]);
        let verify = verify.ok().json();
        let worst = verify["worst"][0]["relative_l2"].as_f64().unwrap();
        assert!(worst > 0.01 && worst < 0.2 && verify["passed"] == true, "{arch}: {verify}");
    }
}

#[test]
fn inspect_and_report_read_the_fp4_native_layouts() {
    let temp = tempfile::tempdir().unwrap();
    for (arch, ..) in RELEASES {
        let source = synth(temp.path(), arch, arch, &[]);
        let inspect = squeeze(&["inspect", path_str(&source), "--json"]).ok().json();
        let classes = inspect["classes"].to_string();
        for class in ["routed_experts", "shared_experts", "attention", "embeddings", "norms_router"] {
            assert!(classes.contains(class), "{arch}: {class} in {classes}");
        }
        let report = squeeze(&["report", path_str(&source), "--json"]).ok().json();
        assert!(report["sizes"]["output_tensors"]["bytes"].as_u64().unwrap() > 0, "{arch}: {report}");
        // The runtime does not run K3's layers yet: the measuring commands refuse, naming what does work (DeepSeek-V4
        // runs: tests/integration/deepseek_v4.rs).
        if arch == "kimi-k3" {
            let eval = squeeze(&["eval", path_str(&source), "--data", path_str(Path::new(SONNETS)), "--ctx", "16"]);
            expect_exit_2(&eval, &["does not run its layers yet", "squeeze verify OUT --source"]);
        }
    }
    // The presets as shipped: K3 needs more than one 8 x H200 node (the answer says by how much and what would
    // fit); DeepSeek-V4-Flash fits with room for its compressed KV cache.
    let k3 = squeeze(&["report", "kimi-k3", "--gpu-memory", "h200-141g", "--gpus", "8"]);
    expect_exit_2(&k3, &["weights do not fit", "short by", "routed experts would fit at", "bits per weight"]);
    let flash = squeeze(&["report", "deepseek-v4-flash", "--gpu-memory", "h200-141g", "--gpus", "8", "--json"]).ok();
    let flash = flash.json();
    assert_eq!(flash["sizes"]["source"]["bytes"].as_u64().unwrap() / 100_000_000, 1596, "V4-Flash ships 159.6 GB");
    let kv = &flash["kv"]["fp8"];
    assert!(kv["state_bytes_per_request"].as_u64().unwrap() > 0 && kv["layers"] == 41, "{kv}");
}

/// Rewrites the bytes of tensor `name` of a folder in place.
fn patch_tensor(dir: &Path, name: &str, edit: impl FnOnce(&mut [u8])) {
    let index = read_json(&dir.join("model.safetensors.index.json"));
    let file = dir.join(index["weight_map"][name].as_str().unwrap());
    let mut bytes = std::fs::read(&file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let offsets = &header[name]["data_offsets"];
    let (start, end) = (offsets[0].as_u64().unwrap() as usize, offsets[1].as_u64().unwrap() as usize);
    edit(&mut bytes[8 + header_len + start..8 + header_len + end]);
    std::fs::write(&file, bytes).unwrap();
}

fn shard_of(dir: &Path, name: &str) -> PathBuf {
    let index = read_json(&dir.join("model.safetensors.index.json"));
    dir.join(index["weight_map"][name].as_str().unwrap())
}

#[test]
fn bad_fp4_sources_are_refused_naming_the_tensor_or_key_and_nothing_is_written() {
    let temp = tempfile::tempdir().unwrap();
    let fresh = |name: &str, arch: &str| synth(temp.path(), name, arch, &[]);
    let refused = |source: &Path, recipe: &str, mentions: &[&str]| {
        let out = source.with_extension("out");
        let run = squeeze(&["quantize", path_str(source), path_str(&out), "--recipe", recipe, "--engine", "vllm"]);
        expect_exit_2(&run, mentions);
        assert!(!out.join("config.json").exists(), "{recipe}: nothing may be written");
    };
    // An E8M0 NaN (255) in DeepSeek-V4's expert scales and in an FP8 linear's block scales.
    let scale = "layers.1.ffn.experts.3.w2.scale";
    let source = fresh("nan-expert", "deepseek-v4");
    patch_tensor(&source, scale, |bytes| bytes[7] = 255);
    refused(&source, "deepseek-v4-nvfp4", &[scale, "255", "NaN"]);
    let source = fresh("nan-fp8", "deepseek-v4");
    patch_tensor(&source, "layers.0.attn.wq_b.scale", |bytes| bytes[0] = 255);
    refused(&source, "deepseek-v4-int4", &["layers.0.attn.wq_b.scale", "NaN"]);
    // Scales that do not match the block size: K3's [160, 5] E8M0 scales relabelled [80, 10].
    let source = fresh("scale-shape", "kimi-k3");
    let name = "language_model.model.layers.1.block_sparse_moe.experts.2.w1.weight_scale";
    rewrite_header(&shard_of(&source, name), |header| header[name]["shape"] = serde_json::json!([80, 10]));
    refused(&source, "kimi-k3-nvfp4", &[name, "[80, 10]", "one per 32"]);
    // An odd row length of F4 codes (DeepSeek's packed weight relabelled as F4 [2048, 25]: the same bytes).
    let source = fresh("odd-f4", "deepseek-v4");
    let name = "layers.2.ffn.experts.0.w3.weight";
    rewrite_header(&shard_of(&source, name), |header| {
        header[name]["dtype"] = "F4".into();
        header[name]["shape"] = serde_json::json!([2048, 25]);
    });
    refused(&source, "deepseek-v4-nvfp4", &[name, "odd row length 25"]);
    // Layer lists written 0-indexed although the config says 1-indexed.
    let source = fresh("zero-indexed", "kimi-k3");
    let mut config = read_json(&source.join("config.json"));
    let linear = &mut config["text_config"]["linear_attn_config"];
    linear["kda_layers"] = serde_json::json!([0, 1]);
    linear["full_attn_layers"] = serde_json::json!([2]);
    std::fs::write(source.join("config.json"), config.to_string()).unwrap();
    refused(&source, "kimi-k3-nvfp4", &["kda_layers", "1-indexed", "add 1"]);
}

#[test]
fn fused_groups_must_share_a_scheme_and_vllm_s_unquantized_modules_stay_so() {
    let temp = tempfile::tempdir().unwrap();
    let cases = [
        // K3's KDA projections fuse into vLLM's in_proj_qkvgfab: q alone quantized is refused.
        ("kimi-k3", r"\.self_attn\.q_proj\.weight$", "self_attn.b_proj + "),
        // DeepSeek-V4's compressor projections must stay BF16 in vLLM's compressed-tensors path (#41276).
        ("deepseek-v4", r"\.attn\.compressor\.w(kv|gate)\.weight$", "NotImplementedError"),
    ];
    for (arch, pattern, mention) in cases {
        let source = synth(temp.path(), arch, arch, &[]);
        let recipe = temp.path().join(format!("{arch}.toml"));
        let text = format!(
            "name = \"bad\"\nunselected = \"bf16\"\n[[rules]]\nname = \"r\"\nmatch = '{pattern}'\nscheme = \"nvfp4\"\n\
             group_size = 16\nscale_rule = \"ct-minmax\"\n"
        );
        std::fs::write(&recipe, text).unwrap();
        let out = temp.path().join(format!("{arch}-out"));
        let run = squeeze(&[
            "quantize",
            path_str(&source),
            path_str(&out),
            "--recipe",
            path_str(&recipe),
            "--engine",
            "vllm",
        ]);
        expect_exit_2(&run, &["fused-pairs", mention]);
    }
}

#[test]
fn groups_nvfp4_cannot_hold_are_refused_and_cast_by_the_stated_rule_when_allowed() {
    let temp = tempfile::tempdir().unwrap();
    let source = synth(temp.path(), "k3", "kimi-k3", &[]);
    let module = "language_model.model.layers.1.block_sparse_moe.experts.4.w3";
    // Group 1 of row 0 of up: 20 exponents below the largest, out of E4M3's reach (17).
    patch_tensor(&source, &format!("{module}.weight_scale"), |bytes| {
        let largest = *bytes.iter().max().unwrap();
        bytes[1] = largest - 20;
    });
    let out = temp.path().join("out");
    let run =
        squeeze(&["quantize", path_str(&source), path_str(&out), "--recipe", "kimi-k3-nvfp4", "--engine", "vllm"]);
    expect_exit_2(&run, &[module, "row 0, columns 32..64", "--allow-inexact-cast", "gate/up"]);
    assert!(!out.join("config.json").exists());
    squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&out),
        "--recipe",
        "kimi-k3-nvfp4",
        "--engine",
        "vllm",
        "--allow-inexact-cast",
    ])
    .ok();
    let verify = squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--json"]).ok().json();
    let errors: Vec<(String, f64)> = verify["worst"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["name"].as_str().unwrap().to_string(), w["relative_l2"].as_f64().unwrap()))
        .collect();
    // Only the re-encoded group moved, and by little: every other tensor is exact.
    assert_eq!(errors[0].0, module, "{errors:?}");
    assert!(errors[0].1 > 0.0 && errors[0].1 < 1e-2, "{errors:?}");
    assert!(errors[1..].iter().all(|(_, e)| *e == 0.0), "{errors:?}");
}
