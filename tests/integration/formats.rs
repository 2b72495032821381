//! The formats beside INT4 W4A16. NVFP4 and MXFP4 outputs (the `-nvfp4`/`-mxfp4` built-in recipes): written in
//! compressed-tensors' layout, read by the runtime, `verify` and the linter for both engines on every architecture;
//! gate/up global scales shared and a folder whose scales disagree caught. W4A8 (`-w4a8`): INT4 g128 declared with
//! FP8 per-token activations, evaluated as vLLM computes it, refused on shapes the engines refuse. The bad input around them exits 2.

use std::fs;
use std::path::Path;

use crate::common::{expect_exit_2, path_str, read_json, squeeze, synth, tensor_bytes, tensor_names};

const SONNETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");

/// Overwrites the bytes of tensor `name` in its shard (same length), as a damaged or peer-written folder would hold.
fn overwrite(dir: &Path, name: &str, bytes: &[u8]) {
    let index = read_json(&dir.join("model.safetensors.index.json"));
    let path = dir.join(index["weight_map"][name].as_str().unwrap());
    let mut file = fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..8 + header_len]).unwrap();
    let [start, end] = [0, 1].map(|i| header[name]["data_offsets"][i].as_u64().unwrap() as usize + 8 + header_len);
    assert_eq!(end - start, bytes.len(), "{name}: same length");
    file[start..end].copy_from_slice(bytes);
    fs::write(&path, file).unwrap();
}

/// Mean KLD of `candidate` against `source` (`eval --modes weights` on two 32-token sonnet chunks).
fn weights_kld(source: &Path, candidate: &Path) -> f64 {
    let (source, candidate) = (path_str(source), path_str(candidate));
    let args = ["eval", "--reference", source, "--candidate", candidate, "--data", SONNETS, "--ctx", "32"];
    let run = squeeze(&[&args[..], &["--chunks", "2", "--modes", "weights", "--json"]].concat());
    run.json()["modes"]["weights"]["mean_kld"].as_f64().unwrap()
}

#[test]
fn fp4_outputs_verify_for_both_engines_and_evaluate_on_every_architecture() {
    let temp = tempfile::tempdir().unwrap();
    for (arch, recipe_arch) in [("kimi-k2", "kimi-k2"), ("glm5", "glm5"), ("glm45", "glm45")] {
        let source = synth(temp.path(), arch, arch, &[]);
        for kind in ["nvfp4", "mxfp4"] {
            let out = temp.path().join(format!("{arch}-{kind}"));
            let recipe = format!("{recipe_arch}-{kind}");
            // vLLM's rules: SGLang refuses MXFP4 experts and these tiny NVFP4 shapes (the test below).
            squeeze(&["quantize", path_str(&source), path_str(&out), "--recipe", &recipe, "--engine", "vllm"]).ok();
            let verify =
                squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--engine", "vllm", "--json"]);
            let report = verify.ok().json();
            assert_eq!(report["passed"], true, "{arch} {kind}: {}", report["problems"]);
            assert!(report["compared_tensors"].as_u64().unwrap() > 0, "{arch} {kind}");

            let config = read_json(&out.join("config.json"));
            let quantization = &config["quantization_config"];
            assert_eq!(quantization["format"], format!("{kind}-pack-quantized"), "{arch}");
            let weights = &quantization["config_groups"]["group_0"]["weights"];
            assert_eq!((&weights["type"], &weights["num_bits"]), (&"float".into(), &4.into()), "{arch} {kind}");

            let names = tensor_names(&out);
            let expert = "model.layers.1.mlp.experts.0";
            assert!(names.contains(&format!("{expert}.gate_proj.weight_packed")), "{arch} {kind}");
            assert!(!names.iter().any(|n| n.ends_with("weight_shape")), "{arch} {kind}: FP4 has no weight_shape");
            let global = |projection: &str| {
                let name = format!("{expert}.{projection}.weight_global_scale");
                names.contains(&name).then(|| tensor_bytes(&out, &name))
            };
            match kind {
                "nvfp4" => assert_eq!(global("gate_proj").unwrap(), global("up_proj").unwrap(), "{arch}: shared"),
                _ => assert!(global("gate_proj").is_none(), "{arch}: MXFP4 has no global scale"),
            }

            let eval = squeeze(&["eval", path_str(&out), "--data", SONNETS, "--ctx", "32", "--chunks", "2", "--json"]);
            let ppl = eval.ok().json()["ppl"].as_f64().unwrap();
            assert!(ppl.is_finite() && ppl > 1.0, "{arch} {kind}: ppl {ppl}");
        }
    }
}

/// A folder whose gate and up global scales disagree (as some published NVFP4 checkpoints do) fails the linter's
/// rule for both engines, naming both tensors; a zero global scale fails verify and the runtime, naming the tensor.
#[test]
fn disagreeing_or_zero_global_scales_are_caught() {
    let temp = tempfile::tempdir().unwrap();
    let source = synth(temp.path(), "kimi", "kimi-k2", &[]);
    let out = temp.path().join("nvfp4");
    squeeze(&["quantize", path_str(&source), path_str(&out), "--recipe", "kimi-k2-nvfp4", "--engine", "vllm"]).ok();
    let up = "model.layers.1.mlp.experts.3.up_proj.weight_global_scale";
    let value = f32::from_le_bytes(tensor_bytes(&out, up).try_into().unwrap());
    overwrite(&out, up, &(value * 2.0).to_le_bytes());
    let run = squeeze(&["verify", path_str(&out), "--engine", "all"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("fp4-fused-global-scale") && run.stdout.contains(up), "{}", run.stdout);
    // vLLM would serve the pair with gate's scale: the runtime's commands refuse to measure each half under its
    // own, naming the pair and both scales.
    let (o, s) = (path_str(&out), path_str(&source));
    let gate = "model.layers.1.mlp.experts.3.gate_proj.weight_global_scale";
    for args in [
        vec!["eval", o, "--data", SONNETS, "--ctx", "32", "--chunks", "1"],
        vec!["eval", "--reference", s, "--candidate", o, "--data", SONNETS, "--ctx", "32", "--chunks", "1"],
        vec!["serve-test", o, "--prompt", "Shall I", "--max-new-tokens", "2"],
        vec!["calibrate-kv", o, "--data", SONNETS, "--seq-len", "32", "--dry-run"],
    ] {
        let run = squeeze(&args);
        expect_exit_2(&run, &[up, gate, &format!("is {}", value * 2.0), &format!("is {value}"), "gate scale"]);
    }

    overwrite(&out, up, &0f32.to_le_bytes());
    let run = squeeze(&["verify", path_str(&out)]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains(up) && run.stdout.contains("finite and positive"), "{}", run.stdout);
    let run = squeeze(&["eval", path_str(&out), "--data", SONNETS, "--ctx", "32", "--chunks", "1"]);
    expect_exit_2(&run, &[up]);
}

#[test]
fn fp4_bad_input_exits_2_naming_the_flag_rule_or_tensor() {
    let temp = tempfile::tempdir().unwrap();
    let source = synth(temp.path(), "kimi", "kimi-k2", &[]);
    let out = |name: &str| temp.path().join(name);
    // NVFP4's group is 16: a recipe or --group-size that says otherwise is refused.
    let builtin = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/recipes/kimi-k2-nvfp4.toml")).unwrap();
    let recipe = temp.path().join("bad.toml");
    fs::write(&recipe, builtin.replace("group_size = 16", "group_size = 32")).unwrap();
    let run = squeeze(&["quantize", path_str(&source), path_str(&out("a")), "--recipe", path_str(&recipe)]);
    expect_exit_2(&run, &["rules[0]", "nvfp4", "group is 16"]);
    let run = squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&out("b")),
        "--recipe",
        "kimi-k2-mxfp4",
        "--group-size",
        "16",
    ]);
    expect_exit_2(&run, &["--group-size", "mxfp4", "32"]);
    let run = squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&out("c")),
        "--recipe",
        "kimi-k2-nvfp4",
        "--scale-rule",
        "mse",
    ]);
    expect_exit_2(&run, &["--scale-rule", "ct-minmax"]);
    // Calibrated methods are INT4-only.
    let run = squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&out("d")),
        "--recipe",
        "kimi-k2-nvfp4",
        "--method",
        "gptq",
        "--calibration",
        SONNETS,
    ]);
    expect_exit_2(&run, &["--method gptq", "nvfp4"]);
    // A row length the format's group does not divide names the tensor.
    let narrow = synth(temp.path(), "narrow", "kimi-k2", &["--hidden", "336"]);
    let run = squeeze(&["quantize", path_str(&narrow), path_str(&out("e")), "--recipe", "kimi-k2-mxfp4"]);
    expect_exit_2(&run, &["model.layers.1.mlp.experts.0.", "group of 32 does not divide the row length 336"]);
    for name in ["a", "b", "c", "d", "e"] {
        assert!(!out(name).join("config.json").exists(), "{name}: nothing written");
    }
}

#[test]
fn w4a8_outputs_declare_fp8_activations_and_shapes_the_engines_refuse_exit_2() {
    let temp = tempfile::tempdir().unwrap();
    let source = synth(temp.path(), "wide", "kimi-k2", &["--hidden", "512", "--moe-intermediate", "256"]);
    let out = temp.path().join("w4a8");
    squeeze(&["quantize", path_str(&source), path_str(&out), "--recipe", "kimi-k2-w4a8"]).ok();
    let group = &read_json(&out.join("config.json"))["quantization_config"]["config_groups"]["group_0"];
    assert_eq!(group["weights"]["group_size"], 128);
    let activations = &group["input_activations"];
    assert_eq!((&activations["type"], &activations["num_bits"]), (&"float".into(), &8.into()), "{group}");
    assert_eq!((&activations["strategy"], &activations["dynamic"]), (&"token".into(), &true.into()), "{group}");
    // Random weights at group 128 lose more than real ones: the limit is the caller's.
    let args = [
        "verify",
        path_str(&out),
        "--source",
        path_str(&source),
        "--engine",
        "all",
        "--max-int4-error",
        "0.4",
        "--json",
    ];
    let report = squeeze(&args).ok().json();
    assert_eq!(report["passed"], true, "{}", report["problems"]);
    let rules = report["engine_rules"].to_string();
    assert!(rules.contains("w4a8-shapes"), "{rules}");
    let eval = squeeze(&["eval", path_str(&out), "--data", SONNETS, "--ctx", "32", "--chunks", "1", "--json"]);
    assert!(eval.ok().json()["ppl"].as_f64().unwrap().is_finite());
    // The runtime computes as vLLM's W4A8 kernels do (FP8 group scales, FP8 products, FP8 per-token inputs): the same
    // folder declared weights-only (W4A16) scores closer to its source.
    let a16 = temp.path().join("w4a8-as-w4a16");
    fs::create_dir(&a16).unwrap();
    for entry in fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        fs::copy(&path, a16.join(path.file_name().unwrap())).unwrap();
    }
    let mut config = read_json(&a16.join("config.json"));
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = serde_json::Value::Null;
    fs::write(a16.join("config.json"), config.to_string()).unwrap();
    let (w4a8, w4a16) = (weights_kld(&source, &out), weights_kld(&source, &a16));
    assert!(
        w4a8 > w4a16 && w4a8.is_finite(),
        "W4A8 quantizes the experts' inputs and scales too: KLD {w4a8} vs {w4a16}"
    );
    // Input quantization the runtime cannot emulate (INT8 per token) is named, not scored as W4A16.
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"] =
        serde_json::json!({"num_bits": 8, "type": "int", "symmetric": true, "strategy": "token", "dynamic": true});
    fs::write(a16.join("config.json"), config.to_string()).unwrap();
    let run = squeeze(&["eval", path_str(&a16), "--data", SONNETS, "--ctx", "32", "--chunks", "1"]);
    expect_exit_2(&run, &["config_groups.group_0.input_activations", "W4A8"]);

    // Rows of 320 take no group of 128: the tensor is named before anything is written.
    let narrow = synth(temp.path(), "narrow", "kimi-k2", &[]);
    let run = squeeze(&["quantize", path_str(&narrow), path_str(&temp.path().join("a")), "--recipe", "kimi-k2-w4a8"]);
    expect_exit_2(&run, &["gate_proj.weight", "w4a8-fp8's group of 128", "row length 320"]);
    // hidden 384 takes groups of 128 but not the engines' W4A8 kernels (hidden % 256): the linter refuses the plan.
    let odd = synth(temp.path(), "odd", "kimi-k2", &["--hidden", "384", "--moe-intermediate", "256"]);
    let run = squeeze(&["quantize", path_str(&odd), path_str(&temp.path().join("b")), "--recipe", "kimi-k2-w4a8"]);
    expect_exit_2(&run, &["w4a8-shapes", "hidden_size", "384"]);
    for name in ["a", "b"] {
        assert!(!temp.path().join(name).join("config.json").exists(), "{name}: nothing written");
    }
    // One recipe cannot mix W4A16 and W4A8 INT4 rules.
    let builtin = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/recipes/kimi-k2-w4a8.toml")).unwrap();
    let mixed = format!(
        "{builtin}\n[[rules]]\nname = \"shared\"\nmatch = 'shared_experts'\nscheme = \"int4\"\ngroup_size = 32\n"
    );
    let recipe = temp.path().join("mixed.toml");
    fs::write(&recipe, mixed).unwrap();
    let run =
        squeeze(&["quantize", path_str(&source), path_str(&temp.path().join("c")), "--recipe", path_str(&recipe)]);
    expect_exit_2(&run, &["int4 and w4a8-fp8"]);
}

/// SGLang 0.5.23's FP4 MoE methods (lint rule `fp4-moe-engine`): NVFP4 experts need `hidden_size % 128` and
/// `moe_intermediate_size / tp % 64`, and MXFP4 split experts have no method that loads them, so `quantize`'s default
/// `--engine all` refuses both before writing, naming the rule, the key or tensor and `--engine vllm`; shapes that fit
/// pass for NVFP4.
#[test]
fn sglang_fp4_moe_rules_refuse_mxfp4_experts_and_nvfp4_shapes_it_cannot_load() {
    let temp = tempfile::tempdir().unwrap();
    let tiny = synth(temp.path(), "tiny", "kimi-k2", &[]);
    let run = squeeze(&["quantize", path_str(&tiny), path_str(&temp.path().join("a")), "--recipe", "kimi-k2-nvfp4"]);
    expect_exit_2(&run, &["fp4-moe-engine", "sglang", "`hidden_size`: 320", "--engine vllm"]);
    let wide = synth(temp.path(), "wide", "kimi-k2", &["--hidden", "256", "--moe-intermediate", "128"]);
    let run = squeeze(&["quantize", path_str(&wide), path_str(&temp.path().join("b")), "--recipe", "kimi-k2-mxfp4"]);
    expect_exit_2(&run, &["fp4-moe-engine", "mlp.experts.0.", "would load as zeros", "--engine vllm"]);
    for name in ["a", "b"] {
        assert!(!temp.path().join(name).exists(), "{name}: nothing written");
    }
    let out = temp.path().join("c");
    squeeze(&["quantize", path_str(&wide), path_str(&out), "--recipe", "kimi-k2-nvfp4"]).ok();
    let verify = squeeze(&["verify", path_str(&out), "--engine", "sglang", "--json"]).ok().json();
    let rules = verify["engine_rules"]["rules"].as_array().unwrap();
    let rule = rules.iter().find(|rule| rule["rule"] == "fp4-moe-engine").unwrap();
    assert_eq!(rule["status"], "passed", "{rule}");
}

/// W4A4 NVFP4 (`-nvfp4-w4a4` recipes): the weights are the weights-only recipe's byte for byte, plus each routed
/// expert's `input_global_scale` from the calibration pass (gate and up read the same input, so they agree; with
/// `--force-route-all` every expert sees every token, so every expert's gate/up scale is the same); the config
/// declares compressed-tensors' NVFP4 activations; the runtime quantizes the experts' inputs as vLLM does, which
/// moves the output away from the weights-only one. Missing calibration, calibration with nothing to calibrate and
/// a zero scale are refused, naming the flag or tensor.
#[test]
fn w4a4_nvfp4_calibrates_activation_scales_and_the_runtime_quantizes_activations() {
    let temp = tempfile::tempdir().unwrap();
    let source = synth(temp.path(), "glm5", "glm5", &[]);
    let out = |name: &str| temp.path().join(name);
    let quantize = |name: &str, extra: &[&str]| {
        let target = temp.path().join(name);
        let mut args = vec!["quantize", path_str(&source), path_str(&target), "--engine", "vllm"];
        args.extend_from_slice(extra);
        squeeze(&args)
    };
    quantize("a16", &["--recipe", "glm5-nvfp4"]).ok();
    quantize("a4", &["--recipe", "glm5-nvfp4-w4a4", "--calibration", SONNETS, "--seq-len", "64"]).ok();
    quantize("all", &["--recipe", "glm5-nvfp4-w4a4", "--calibration", SONNETS, "--seq-len", "64", "--force-route-all"])
        .ok();

    let config = read_json(&out("a4").join("config.json"));
    let activations = &config["quantization_config"]["config_groups"]["group_0"]["input_activations"];
    assert_eq!((&activations["strategy"], &activations["group_size"]), (&"tensor_group".into(), &16.into()));
    assert_eq!((&activations["type"], &activations["num_bits"]), (&"float".into(), &4.into()));
    let scalar = |dir: &Path, name: &str| f32::from_le_bytes(tensor_bytes(dir, name).try_into().unwrap());
    let names = tensor_names(&out("a4"));
    let experts: Vec<String> =
        names.iter().filter_map(|n| n.strip_suffix(".gate_proj.input_global_scale")).map(str::to_string).collect();
    assert!(experts.len() >= 4, "every routed expert has scales: {experts:?}");
    for expert in &experts {
        for suffix in ["weight_packed", "weight_scale", "weight_global_scale"] {
            for projection in ["gate", "up", "down"] {
                let name = format!("{expert}.{projection}_proj.{suffix}");
                assert_eq!(tensor_bytes(&out("a4"), &name), tensor_bytes(&out("a16"), &name), "{name}");
            }
        }
        let [gate, up, down] =
            ["gate", "up", "down"].map(|p| scalar(&out("a4"), &format!("{expert}.{p}_proj.input_global_scale")));
        assert!(gate.is_finite() && gate > 0.0 && down.is_finite() && down > 0.0, "{expert}: {gate} {down}");
        assert_eq!(gate, up, "{expert}: gate and up read the same input");
        assert_ne!(gate, down, "{expert}: down reads act(gate)·up");
    }
    let layer_scales = |dir: &Path| -> Vec<f32> {
        experts
            .iter()
            .filter(|e| e.starts_with("model.layers.1."))
            .map(|e| scalar(dir, &format!("{e}.gate_proj.input_global_scale")))
            .collect()
    };
    let everyone = layer_scales(&out("all"));
    assert!(everyone.windows(2).all(|w| w[0] == w[1]), "route-all: one input for all: {everyone:?}");
    let routed = layer_scales(&out("a4"));
    assert!(routed.iter().all(|s| *s >= everyone[0]), "routed tokens are a subset: {routed:?} vs {everyone:?}");

    let verify =
        squeeze(&["verify", path_str(&out("a4")), "--source", path_str(&source), "--engine", "vllm", "--json"]);
    assert_eq!(verify.ok().json()["passed"], true);
    let (a16, a4) = (weights_kld(&source, &out("a16")), weights_kld(&source, &out("a4")));
    assert!(a4 > a16 && a4.is_finite(), "W4A4 quantizes the experts' inputs too: KLD {a4} vs weights-only {a16}");

    expect_exit_2(&quantize("x", &["--recipe", "glm5-nvfp4-w4a4"]), &["--calibration", "input_global_scale"]);
    expect_exit_2(
        &quantize("x", &["--recipe", "glm5-int4", "--calibration", SONNETS]),
        &["--calibration", "nvfp4-w4a4"],
    );
    expect_exit_2(
        &quantize("x", &["--recipe", "glm5-nvfp4-w4a4", "--calibration", SONNETS, "--part", "1/2"]),
        &["--part", "--calibration"],
    );
    let name = format!("{}.down_proj.input_global_scale", experts[0]);
    overwrite(&out("a4"), &name, &0f32.to_le_bytes());
    let run = squeeze(&["verify", path_str(&out("a4")), "--engine", "vllm"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains(&name), "{}", run.stdout);
    let run = squeeze(&["eval", path_str(&out("a4")), "--data", SONNETS, "--ctx", "32", "--chunks", "1"]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains(&name), "{}", run.stderr);
}

/// The `-nvfp4-mlp` recipes quantize the shared experts and the dense MLP too, each gate/up pair under one global
/// scale (the engines fuse them), and the output verifies for vLLM and evaluates.
#[test]
fn nvfp4_mlp_recipes_quantize_shared_experts_and_dense_mlps() {
    let temp = tempfile::tempdir().unwrap();
    for arch in ["kimi-k2", "glm5", "glm45"] {
        let source = synth(temp.path(), arch, arch, &[]);
        let out = temp.path().join(format!("{arch}-mlp"));
        let recipe = format!("{arch}-nvfp4-mlp");
        squeeze(&["quantize", path_str(&source), path_str(&out), "--recipe", &recipe, "--engine", "vllm"]).ok();
        let verify = squeeze(&["verify", path_str(&out), "--source", path_str(&source), "--engine", "vllm", "--json"]);
        assert_eq!(verify.ok().json()["passed"], true, "{arch}");
        let names = tensor_names(&out);
        for module in ["model.layers.1.mlp.shared_experts", "model.layers.0.mlp"] {
            let global =
                |projection: &str| tensor_bytes(&out, &format!("{module}.{projection}_proj.weight_global_scale"));
            assert!(names.contains(&format!("{module}.down_proj.weight_packed")), "{arch} {module}");
            assert_eq!(global("gate"), global("up"), "{arch} {module}: one global scale for the fused gate/up");
        }
        let eval = squeeze(&["eval", path_str(&out), "--data", SONNETS, "--ctx", "32", "--chunks", "1", "--json"]);
        assert!(eval.ok().json()["ppl"].as_f64().unwrap().is_finite(), "{arch}");
    }
}
