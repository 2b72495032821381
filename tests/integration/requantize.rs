//! Requantizing a natively INT4 release (Kimi K2.6 as Moonshot ships it: routed experts `pack-quantized` g32 inside
//! the `kimi_k25` wrapper) into NVFP4, MXFP4 and W4A8 with the `kimi-k26-*` recipes: byte for byte what
//! compressed-tensors makes of the same dequantized weights (`tests/golden/ct_k26_requant.safetensors`,
//! `scripts/oracle/make-k26-requant-golden.py`), verified, evaluated and estimated by `report`; plans that would keep
//! INT4 modules INT4 are refused.

use std::fs;
use std::path::{Path, PathBuf};

use squeeze::format::row_reader::RowReader;
use squeeze::format::vendor_source::stored_item;
use squeeze::io::{Checkpoint, ShardFile};

use crate::common::{expect_exit_2, path_str, read_json, squeeze, synth, tensor_bytes, tensor_names};

const SONNETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");
/// The expert the golden holds.
const EXPERT: &str = "language_model.model.layers.1.mlp.experts.0";

/// The golden's source: `synth --arch kimi-k2.6 --hidden 256 --moe-intermediate 256` (seed 0); 256 meets W4A8's
/// `% 256` rules.
fn k26_source(dir: &Path) -> PathBuf {
    synth(dir, "k26", "kimi-k2.6", &["--hidden", "256", "--moe-intermediate", "256"])
}

fn golden() -> ShardFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/ct_k26_requant.safetensors");
    ShardFile::open(&path).expect("golden file")
}

#[test]
fn kimi_k26_int4_requantizes_byte_for_byte_as_compressed_tensors() {
    let temp = tempfile::tempdir().unwrap();
    let source = k26_source(temp.path());
    let golden = golden();
    let bytes = |name: &str| golden.get(name).unwrap_or_else(|| panic!("{name} missing")).bytes.to_vec();
    for projection in ["gate", "up", "down"] {
        let stored = tensor_bytes(&source, &format!("{EXPERT}.{projection}_proj.weight_packed"));
        assert_eq!(stored, bytes(&format!("{projection}.source_packed")), "synth made the golden's source");
    }
    // The source read exactly: code × BF16 scale in f32, as compressed-tensors decompresses it.
    let checkpoint = Checkpoint::open(&source).unwrap();
    let item = stored_item(&checkpoint, &format!("{EXPERT}.down_proj.weight"), [128, 128]).unwrap();
    let values = RowReader::new(&checkpoint, &item).unwrap().read_all();
    let want: Vec<u32> =
        bytes("down.dequantized").chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "dequantized source");

    for (format, suffixes) in [
        ("nvfp4", &["weight_packed", "weight_scale", "weight_global_scale"][..]),
        ("mxfp4", &["weight_packed", "weight_scale"][..]),
        ("w4a8", &["weight_packed", "weight_scale"][..]),
    ] {
        let out = temp.path().join(format);
        let recipe = format!("kimi-k26-{format}");
        squeeze(&["quantize", path_str(&source), path_str(&out), "--recipe", &recipe, "--engine", "vllm"]).ok();
        for projection in ["gate", "up", "down"] {
            for suffix in suffixes {
                let got = tensor_bytes(&out, &format!("{EXPERT}.{projection}_proj.{suffix}"));
                assert!(got == bytes(&format!("{projection}.{format}.{suffix}")), "{format} {projection} {suffix}");
            }
        }
    }
}

#[test]
fn kimi_k26_requantized_outputs_verify_evaluate_and_are_estimated_by_report() {
    let temp = tempfile::tempdir().unwrap();
    let source = k26_source(temp.path());
    for format in ["nvfp4", "mxfp4", "w4a8"] {
        let recipe = format!("kimi-k26-{format}");
        let report = squeeze(&["report", path_str(&source), "--recipe", &recipe, "--json"]).ok().json();
        let estimate = &report["requantization"];
        assert_eq!((&estimate["sampled"], &estimate["requantized"]), (&8.into(), &48.into()), "{format}: {estimate}");
        assert_eq!(estimate["source_group_size"], 32, "{format}");
        let mean = estimate["mean_relative_l2"].as_f64().unwrap();
        assert!(mean > 0.0 && mean < 0.25, "{format}: {mean}");

        let out = temp.path().join(format);
        // SGLang loads the NVFP4 and W4A8 outputs; it has no MXFP4 method for split experts (fp4-moe-engine).
        let engine = if format == "mxfp4" { "vllm" } else { "all" };
        squeeze(&["quantize", path_str(&source), path_str(&out), "--recipe", &recipe, "--engine", engine]).ok();
        let verify = squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--engine", engine, "--json"]);
        let verified = verify.ok().json();
        assert_eq!(verified["passed"], true, "{format}: {}", verified["problems"]);
        assert_eq!(verified["compared_tensors"], 48, "{format}: every requantized expert (carried tensors byte-equal)");
        let worst = verified["worst"][0]["relative_l2"].as_f64().unwrap();
        assert!(worst >= estimate["max_relative_l2"].as_f64().unwrap(), "{format}: the sample's max is a lower bound");

        // The new quantization_config replaces Moonshot's inside text_config; the wrapper and vision tower stay.
        let config = read_json(&out.join("config.json"));
        assert!(config.get("quantization_config").is_none(), "{format}: no top-level one hiding text_config's");
        let quantization = &config["text_config"]["quantization_config"];
        let group = &quantization["config_groups"]["group_0"];
        match format {
            "w4a8" => {
                assert_eq!(group["weights"]["group_size"], 128);
                assert_eq!(group["input_activations"]["num_bits"], 8, "{group}");
            }
            _ => assert_eq!(quantization["format"], format!("{format}-pack-quantized")),
        }
        assert!(quantization["ignore"].as_array().unwrap().contains(&"re:.*vision_tower.*".into()));
        assert_eq!(config["architectures"][0], "KimiK25ForConditionalGeneration");
        let names = tensor_names(&out);
        assert!(names.iter().any(|name| name.starts_with("vision_tower.")), "{format}: vision tower carried");
    }
    let parity = squeeze(&[
        "eval",
        "--reference",
        path_str(&source),
        "--candidate",
        path_str(&temp.path().join("nvfp4")),
        "--data",
        SONNETS,
        "--ctx",
        "32",
        "--chunks",
        "2",
        "--json",
    ]);
    let output = parity.stdout.clone();
    let json: serde_json::Value = serde_json::from_str(&output).unwrap_or_else(|_| panic!("{output}"));
    let kld = json["modes"]["weights"]["mean_kld"].as_f64().unwrap();
    assert!(kld > 0.0 && kld.is_finite(), "requantization changes the logits a little: {kld}");
}

#[test]
fn an_int4_source_kept_int4_or_partly_requantized_exits_2_and_gptq_calibrates_its_experts() {
    let temp = tempfile::tempdir().unwrap();
    let source = k26_source(temp.path());
    let out = temp.path().join("out");
    let kept = squeeze(&["quantize", path_str(&source), path_str(&out), "--recipe", "kimi-k2-int4"]);
    expect_exit_2(&kept, &["already INT4", "kimi-k26-nvfp4"]);
    let partial = temp.path().join("partial.toml");
    let recipe = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/kimi-k26-nvfp4.toml"))
        .unwrap()
        .replace(r"(gate|up|down)_proj\.weight$", r"(gate|up)_proj\.weight$");
    fs::write(&partial, recipe).unwrap();
    let run = squeeze(&["quantize", path_str(&source), path_str(&out), "--recipe", path_str(&partial)]);
    expect_exit_2(&run, &["down_proj", "select every INT4 module"]);
    assert!(!out.exists(), "nothing written");

    // GPTQ on the wrapper's names: every routed expert sees calibration tokens (W4A8 is INT4 to GPTQ).
    let run = squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&out),
        "--recipe",
        "kimi-k26-w4a8",
        "--method",
        "gptq",
        "--calibration",
        SONNETS,
        "--json",
    ]);
    let coverage = run.ok().json()["expert_coverage"].clone();
    assert_eq!(coverage["experts"], 16, "{coverage}");
    assert!(coverage["calibrated"].as_u64().unwrap() >= 12, "{coverage}");
    let verify = squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--json"]).ok().json();
    assert_eq!(verify["passed"], true, "{}", verify["problems"]);
}
