//! Other tools' INT4 compressed-tensors folders (`tests/golden/peers/`, written by llm-compressor 0.14.0.1 and
//! compressed-tensors 0.19.0 themselves: `scripts/oracle/peers/make-corpus.py`): `eval`, `verify` and `inspect`
//! read each, and the weights squeeze's runtime reads equal the peer's own decompression exactly; edited copies
//! (a quantization field compressed-tensors does not define, a scale dtype none writes, asymmetric without zero
//! points) exit 2 naming the field or tensor.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use squeeze::io::{Checkpoint, Dtype, ShardFile};
use squeeze::load::weights::WeightReader;

use crate::common::{expect_exit_2, path_str, read_json, rewrite_header, squeeze};

/// The corpus: folder name and what it exercises.
const PEERS: [(&str, &str); 5] = [
    ("llmc-gptq-w4a16", "GPTQ, BF16 scales, group 32"),
    ("llmc-gptq-actorder", "GPTQ with actorder weight"),
    ("ct-int4-f32-scales", "F32 scales"),
    ("llmc-asym-g64", "zero points, group 64"),
    ("llmc-channel", "strategy channel"),
];

fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/peers")
}

/// The values of a BF16, F16 or F32 tensor.
fn floats(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::BF16 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        other => panic!("{other} is not a float dtype"),
    }
}

/// `value` rounded once to `dtype` (nearest even), back as f32.
fn rounded(value: f32, dtype: Dtype) -> f32 {
    match dtype {
        Dtype::BF16 => bf16::from_f32(value).to_f32(),
        Dtype::F16 => f16::from_f32(value).to_f32(),
        _ => value,
    }
}

#[test]
fn squeeze_reads_each_peer_folder_as_the_peer_decompresses_it() {
    for (name, what) in PEERS {
        let folder = peers_dir().join(name);
        let golden = ShardFile::open(&peers_dir().join(format!("{name}.dequantized.safetensors"))).unwrap();
        let checkpoint = Checkpoint::open(&folder).unwrap();
        let reader = WeightReader::new(&checkpoint);
        let modules: Vec<&str> = golden.entries().keys().filter_map(|n| n.strip_suffix(".weight_f32")).collect();
        assert_eq!(modules.len(), 3, "{name}: the golden holds three modules");
        for module in modules {
            let exact = golden.get(&format!("{module}.weight_f32")).unwrap();
            let native = golden.get(&format!("{module}.weight")).unwrap();
            let shape = [exact.shape[0], exact.shape[1]];
            let matrix = reader.matrix(&format!("{module}.weight"), shape).unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = matrix.values();
            let (want, peer) = (floats(exact.dtype, exact.bytes), floats(native.dtype, native.bytes));
            let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{name} ({what}) {module}: {differ} of {} values differ from (q - z) * s", got.len());
            // Rounded once to the scale's dtype, squeeze's values are the peer's own decompressed weights.
            let differ = got.iter().zip(&peer).filter(|(a, b)| rounded(**a, native.dtype) != **b).count();
            assert_eq!(
                differ, 0,
                "{name} ({what}) {module}: {differ} values differ from compressed-tensors' {}",
                native.dtype
            );
            assert!(got.iter().any(|v| *v != 0.0), "{name} {module}: all zero");
        }
    }
}

#[test]
fn eval_verify_and_inspect_read_each_peer_folder() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog. ".repeat(12)).unwrap();
    for (name, what) in PEERS {
        let folder = peers_dir().join(name);
        let folder = path_str(&folder);
        let eval = squeeze(&["eval", folder, "--data", path_str(&text), "--ctx", "32", "--json"]).ok();
        let nll = eval.json()["mean_nll"].as_f64().unwrap_or_else(|| panic!("{name}: no mean_nll in {}", eval.stdout));
        // A random tiny model over 258 byte tokens: near ln(258) = 5.55, far from a broken read's.
        assert!((5.0..6.2).contains(&nll), "{name} ({what}): mean NLL {nll}");
        let verify = squeeze(&["verify", folder, "--json"]);
        assert_eq!(verify.code, 0, "{name} ({what}): verify\n{}\n{}", verify.stdout, verify.stderr);
        assert_eq!(verify.json()["quantized_tensors"], 12, "{name}");
        let inspect = squeeze(&["inspect", folder, "--json"]).ok();
        assert!(inspect.json().get("problems").is_none(), "{name}: {}", inspect.stdout);
        assert_eq!(inspect.json()["model_type"], "deepseek_v3", "{name}");
    }
}

/// A copy of peer folder `name` in `dir`.
fn copy_peer(dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(peers_dir().join(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    to
}

fn edit_weights_args(folder: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut config = read_json(&folder.join("config.json"));
    edit(&mut config["quantization_config"]["config_groups"]["group_0"]["weights"]);
    std::fs::write(folder.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

#[test]
fn peer_folders_edited_into_what_no_writer_writes_exit_2_naming_the_field_or_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog. ".repeat(4)).unwrap();
    let eval = |folder: &Path| squeeze(&["eval", path_str(folder), "--data", path_str(&text), "--ctx", "32"]);

    let unknown = copy_peer(dir.path(), "llmc-gptq-w4a16");
    edit_weights_args(&unknown, |weights| weights["zero_point_bits"] = 4.into());
    expect_exit_2(&eval(&unknown), &["quantization_config.config_groups.group_0.weights.zero_point_bits", "is not"]);
    let verify = squeeze(&["verify", path_str(&unknown)]);
    assert_eq!(verify.code, 1, "verify reports it as a problem:\n{}", verify.stdout);
    assert!(verify.stdout.contains("weights.zero_point_bits"), "{}", verify.stdout);

    let asymmetric = copy_peer(dir.path(), "llmc-channel");
    edit_weights_args(&asymmetric, |weights| weights["symmetric"] = false.into());
    expect_exit_2(&eval(&asymmetric), &[".weight_zero_point: missing", "symmetric: false"]);

    // F32 scales relabelled I32 (same bytes): no writer stores INT4 scales as integers.
    let integer_scales = copy_peer(dir.path(), "ct-int4-f32-scales");
    rewrite_header(&integer_scales.join("model.safetensors"), |header| {
        for (name, entry) in header.as_object_mut().unwrap() {
            if name.ends_with(".weight_scale") {
                entry["dtype"] = "I32".into();
            }
        }
    });
    expect_exit_2(&eval(&integer_scales), &[".weight_scale: dtype I32 is not an INT4 scale dtype"]);
    let inspect = squeeze(&["inspect", path_str(&integer_scales), "--json"]);
    assert_eq!(inspect.code, 1, "inspect warns:\n{}", inspect.stdout);
    assert!(inspect.stdout.contains("weight_scale: dtype I32"), "{}", inspect.stdout);
}

/// Where vLLM 0.32 refuses what squeeze reads, `verify --engine vllm` still says so: `actorder: group`
/// (a `weight_g_idx` layout) fails weight-args, while the peers' own folders pass it and int4-tensors.
#[test]
fn verify_engine_vllm_passes_peer_layouts_it_loads_and_fails_group_activation_order() {
    for (name, _) in PEERS {
        let run = squeeze(&["verify", path_str(&peers_dir().join(name)), "--engine", "vllm", "--json"]);
        let rules = run.json()["engine_rules"]["rules"].as_array().cloned().unwrap_or_default();
        for id in ["weight-args", "int4-tensors"] {
            let rule =
                rules.iter().find(|r| r["rule"] == id).unwrap_or_else(|| panic!("{name}: no {id} in {}", run.stdout));
            assert_ne!(rule["status"], "failed", "{name}: {id} {rule}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let grouped = copy_peer(dir.path(), "llmc-gptq-actorder");
    edit_weights_args(&grouped, |weights| weights["actorder"] = "group".into());
    let run = squeeze(&["verify", path_str(&grouped), "--engine", "vllm"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stdout.contains("weights.actorder: is \"group\": vLLM 0.32 no longer loads"), "{}", run.stdout);
    // And squeeze itself asks for the g_idx that layout needs.
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "The quick brown fox. ".repeat(8)).unwrap();
    let eval = squeeze(&["eval", path_str(&grouped), "--data", path_str(&text), "--ctx", "32"]);
    expect_exit_2(&eval, &[".weight_g_idx: missing", "actorder group"]);
}

/// `verify --engine sglang` says what SGLang 0.5.23 loads of each peer folder: F32 scales, channel, GPTQ with
/// actorder weight (at tp 1) and the regex targets llm-compressor writes pass; the asymmetric folder fails
/// weight-args and int4-tensors (SGLang copies compressed-tensors' zero points untransposed); actorder weight fails
/// at --tp 2 (down_proj's scales sized unsplit, loaded split) and passes as its alias "static".
#[test]
fn verify_engine_sglang_passes_peer_layouts_it_loads_and_fails_zero_points_and_split_activation_order() {
    let rule = |run: &crate::common::Run, id: &str| -> serde_json::Value {
        let rules = run.json()["engine_rules"]["rules"].as_array().cloned().unwrap_or_default();
        rules.into_iter().find(|r| r["rule"] == id).unwrap_or_else(|| panic!("no {id} in {}", run.stdout))
    };
    for (name, what) in PEERS {
        let run = squeeze(&["verify", path_str(&peers_dir().join(name)), "--engine", "sglang", "--json"]);
        let asymmetric = name == "llmc-asym-g64";
        for id in ["weight-args", "int4-tensors", "linear-target", "group-size-tp"] {
            let got = rule(&run, id);
            let refused = asymmetric && matches!(id, "weight-args" | "int4-tensors");
            assert_eq!(got["status"] == "failed", refused, "{name} ({what}): {id} {got}");
        }
        assert_eq!(run.code, if asymmetric { 1 } else { 0 }, "{name}: {}", run.stdout);
        if name == "llmc-channel" {
            assert_eq!(rule(&run, "group-size-tp")["status"], "skipped", "{name}");
        }
        if asymmetric {
            let text = rule(&run, "int4-tensors").to_string();
            assert!(text.contains("untransposed") && text.contains("[8, 1]"), "{text}");
            assert!(rule(&run, "weight-args").to_string().contains("without the transpose"), "{}", run.stdout);
        }
    }
    let args = |folder: &Path, tp: &str| {
        let run = squeeze(&["verify", path_str(folder), "--engine", "sglang", "--tp", tp, "--json"]);
        rule(&run, "weight-args")
    };
    let actorder = peers_dir().join("llmc-gptq-actorder");
    let split = args(&actorder, "2");
    assert_eq!(split["status"], "failed", "{split}");
    assert!(split.to_string().contains("load_full_w2"), "{split}");
    assert_ne!(args(&peers_dir().join("llmc-gptq-w4a16"), "2")["status"], "failed");
    let dir = tempfile::tempdir().unwrap();
    let alias = copy_peer(dir.path(), "llmc-gptq-actorder");
    edit_weights_args(&alias, |weights| weights["actorder"] = "static".into());
    assert_ne!(args(&alias, "2")["status"], "failed");
}
