//! `eval --mtp`: the MTP layer's draft acceptance on a GLM model, the same in an INT4 output as the layer is kept,
//! its parts merged to the bit, and the bad input around it (a model without MTP, a missing MTP tensor).

use std::fs;

use crate::common::{expect_exit_2, path_str, squeeze, synth, tensor_names};

const SONNETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");

fn eval_mtp(model: &std::path::Path) -> serde_json::Value {
    let args = ["eval", path_str(model), "--data", SONNETS, "--ctx", "48", "--chunks", "2", "--mtp", "--json"];
    squeeze(&args).ok().json()
}

#[test]
fn eval_mtp_reports_draft_acceptance_for_fp8_and_int4() {
    let temp = tempfile::tempdir().unwrap();
    for arch in ["glm45", "glm5"] {
        let fp8 = synth(temp.path(), arch, arch, &[]);
        let report = eval_mtp(&fp8);
        let mtp = &report["mtp"];
        assert_eq!(mtp["layer"], 3, "{arch}: the MTP layer follows the 3 decoder layers: {mtp}");
        // 2 chunks × (48 − 2) positions with a token t + 2.
        assert_eq!(mtp["positions"], 2 * 46, "{arch}: {mtp}");
        let acceptance = mtp["acceptance"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&acceptance), "{arch}: {mtp}");
        assert_eq!(mtp["mean_accepted_length"].as_f64().unwrap(), 1.0 + acceptance / 100.0);
        assert!(mtp["mean_kld"].as_f64().unwrap() > 0.0, "{arch}: random MTP weights draft differently: {mtp}");
        // The main model's perplexity on tokens t + 2 is the eval's own perplexity over those positions: finite.
        assert!(mtp["main_ppl"].as_f64().unwrap().is_finite() && mtp["draft_ppl"].as_f64().unwrap().is_finite());

        let int4 = temp.path().join(format!("{arch}-int4"));
        squeeze(&["quantize", path_str(&fp8), path_str(&int4)]).ok();
        let quantized = eval_mtp(&int4);
        assert_eq!(quantized["mtp"]["positions"], mtp["positions"], "{arch}");
        assert_ne!(quantized["mtp"]["mean_kld"], mtp["mean_kld"], "{arch}: INT4 experts move the drafts");
    }
}

#[test]
fn eval_mtp_bad_input_exits_2_naming_the_flag_or_tensor() {
    let temp = tempfile::tempdir().unwrap();
    let kimi = synth(temp.path(), "kimi", "kimi-k2", &[]);
    let run = squeeze(&["eval", path_str(&kimi), "--data", SONNETS, "--ctx", "32", "--chunks", "1", "--mtp"]);
    expect_exit_2(&run, &["no MTP layer", "num_nextn_predict_layers"]);

    let glm = synth(temp.path(), "glm45", "glm45", &[]);

    // An MTP layer without its eh_proj: the tensor is named.
    let index = glm.join("model.safetensors.index.json");
    let mut map: serde_json::Value = serde_json::from_str(&fs::read_to_string(&index).unwrap()).unwrap();
    map["weight_map"].as_object_mut().unwrap().remove("model.layers.3.eh_proj.weight");
    fs::write(&index, serde_json::to_string(&map).unwrap()).unwrap();
    let run = squeeze(&["eval", path_str(&glm), "--data", SONNETS, "--ctx", "32", "--chunks", "1", "--mtp"]);
    expect_exit_2(&run, &["model.layers.3.eh_proj.weight"]);

    // A chain depth outside 1 … 16, or without --mtp.
    for depth in ["0", "17", "-1"] {
        let run = squeeze(&["eval", path_str(&glm), "--data", SONNETS, "--mtp", "--mtp-depth", depth]);
        expect_exit_2(&run, &["--mtp-depth", "1 … 16"]);
    }
    let run = squeeze(&["eval", path_str(&glm), "--data", SONNETS, "--mtp-depth", "2"]);
    expect_exit_2(&run, &["--mtp"]);
}

#[test]
fn parity_mtp_puts_both_models_drafts_side_by_side_and_gates_the_drop() {
    let temp = tempfile::tempdir().unwrap();
    let fp8 = synth(temp.path(), "glm45", "glm45", &[]);
    let int4 = temp.path().join("int4");
    squeeze(&["quantize", path_str(&fp8), path_str(&int4)]).ok();
    let parity = |candidate: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["eval", "--reference", path_str(&fp8), "--candidate", path_str(candidate)];
        args.extend(["--data", SONNETS, "--ctx", "48", "--chunks", "2", "--mtp", "--json", "--modes", "weights"]);
        args.extend_from_slice(extra);
        squeeze(&args)
    };
    // Against itself: the same drafts, no drop.
    let same = parity(&fp8, &[]).json();
    assert_eq!(same["mtp"]["drop"], 0.0, "{}", same["mtp"]);
    assert_eq!(same["mtp"]["reference"]["mean_kld"], same["mtp"]["candidate"]["mean_kld"]);

    let run = parity(&int4, &["--max-mtp-drop", "100"]);
    let json = run.json();
    let (reference, candidate) = (&json["mtp"]["reference"], &json["mtp"]["candidate"]);
    assert_eq!(reference["positions"], 2 * 46);
    let drop = reference["acceptance"].as_f64().unwrap() - candidate["acceptance"].as_f64().unwrap();
    assert_eq!(json["mtp"]["drop"].as_f64().unwrap(), drop);
    assert!(json["failures"].as_array().unwrap().iter().all(|f| f["gate"] != "max-mtp-drop"), "{}", json["failures"]);

    let without = squeeze(&["eval", path_str(&fp8), "--data", SONNETS, "--max-mtp-drop", "3"]);
    expect_exit_2(&without, &["--mtp"]);
}

/// The committed GLM-4.5-shaped trained model carries an MTP layer trained with the main model frozen
/// (scripts/train-mtp.sh): its greedy drafts are accepted far above the untrained layer's chance level (random MTP
/// weights: under 1 %; measured on 8 chunks: 43.45 %), which a runtime that fed the MTP layer the wrong hidden state,
/// position or embedding would not reach.
#[test]
fn the_trained_glm45_mtp_layer_drafts_what_its_main_model_accepts() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = root.join("eval/tiny-shakespeare-glm45-fp8");
    let heldout = root.join("eval/shakespeare-heldout.txt");
    let args =
        ["eval", path_str(&model), "--data", path_str(&heldout), "--ctx", "256", "--chunks", "4", "--mtp", "--json"];
    let report = squeeze(&args).ok().json();
    let acceptance = report["mtp"]["acceptance"].as_f64().unwrap();
    assert!(acceptance > 30.0, "trained MTP drafts accepted only {acceptance} %: {}", report["mtp"]);
}

/// The committed GLM-5-shaped trained model (MLA + DSA, index_topk 64 < ctx 256) carries an MTP layer with its own
/// DSA indexer, trained with the main model frozen (scripts/train-mtp.sh): its greedy drafts are accepted far above
/// chance (measured: 60.43 % on these 4 chunks, 63.98 % on 8), which a runtime that fed the MTP layer the wrong hidden
/// state, position or embedding, or ran its indexer over the wrong keys, would not reach.
#[test]
fn the_trained_glm5_mtp_layer_drafts_what_its_main_model_accepts() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = root.join("eval/tiny-shakespeare-glm5-fp8");
    let heldout = root.join("eval/shakespeare-heldout.txt");
    let args =
        ["eval", path_str(&model), "--data", path_str(&heldout), "--ctx", "256", "--chunks", "4", "--mtp", "--json"];
    let report = squeeze(&args).ok().json();
    assert_eq!(report["architecture"], "GlmMoeDsaForCausalLM");
    let acceptance = report["mtp"]["acceptance"].as_f64().unwrap();
    assert!(acceptance > 30.0, "trained MTP drafts accepted only {acceptance} %: {}", report["mtp"]);
}

/// `mtp = "bf16"` keeps the MTP layer's routed experts BF16 and ignores them under both engines' names for that
/// layer (vLLM: `model.layers.N.mlp.experts…`, SGLang's NextN: `model.decoder.mlp.experts…`); the linter passes it
/// for both, fails SGLang alone when SGLang's entry is missing, and the runtime drafts from the BF16 experts.
#[test]
fn a_recipe_keeps_the_mtp_experts_bf16_for_both_engines() {
    let temp = tempfile::tempdir().unwrap();
    let fp8 = synth(temp.path(), "glm45", "glm45", &[]);
    let recipe = temp.path().join("mtp-bf16.toml");
    let builtin = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/recipes/glm45-int4.toml")).unwrap();
    fs::write(&recipe, builtin.replace("name = \"glm45-int4\"", "name = \"glm45-mtp-bf16\"\nmtp = \"bf16\"")).unwrap();
    let out = temp.path().join("int4");
    squeeze(&["quantize", path_str(&fp8), path_str(&out), "--recipe", path_str(&recipe)]).ok();

    let names = tensor_names(&out);
    assert!(names.iter().any(|n| n == "model.layers.3.mlp.experts.0.up_proj.weight"), "MTP experts stay plain");
    assert!(!names.iter().any(|n| n.starts_with("model.layers.3.mlp.experts.") && n.ends_with("weight_packed")));
    assert!(names.iter().any(|n| n == "model.layers.1.mlp.experts.0.up_proj.weight_packed"), "main experts INT4");
    let config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    let ignore = config["quantization_config"]["ignore"].as_array().unwrap().clone();
    for entry in ["re:^model\\.layers\\.3\\.mlp\\.experts\\..*", "re:^model\\.decoder\\.mlp\\.experts\\..*"] {
        assert!(ignore.iter().any(|e| e == entry), "{entry} missing from {ignore:?}");
    }
    // `report` on the source predicted those bytes: the MTP experts' BF16 instead of INT4.
    let index: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join("model.safetensors.index.json")).unwrap()).unwrap();
    let report = squeeze(&["report", path_str(&fp8), "--json"]).ok().json();
    assert_eq!(
        report["sizes"]["output_tensors_mtp_bf16"]["bytes"], index["metadata"]["total_size"],
        "{}",
        report["sizes"]
    );
    let verify = squeeze(&["verify", path_str(&out), "--engine", "all"]).ok();
    assert!(verify.stdout.contains("the MTP layer's 24 kept BF16"), "{}", verify.stdout);
    let report = eval_mtp(&out);
    assert!(report["mtp"]["acceptance"].as_f64().is_some(), "{report}");

    // Without SGLang's name for the layer, SGLang would look for INT4 experts: its rule fails, vLLM's passes.
    let mut edited = config.clone();
    edited["quantization_config"]["ignore"] =
        serde_json::Value::Array(ignore.into_iter().filter(|e| !e.as_str().unwrap().contains("decoder")).collect());
    fs::write(out.join("config.json"), serde_json::to_string_pretty(&edited).unwrap()).unwrap();
    let sglang = squeeze(&["verify", path_str(&out), "--engine", "sglang"]);
    assert_eq!(sglang.code, 1, "{}", sglang.stdout);
    assert!(sglang.stdout.contains("model.decoder.mlp.experts.0.gate_proj"), "{}", sglang.stdout);
    squeeze(&["verify", path_str(&out), "--engine", "vllm"]).ok();
}

const TRAINED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/tiny-shakespeare-glm45-fp8");

fn serve_speculative(model: &std::path::Path, extra: &[&str]) -> crate::common::Run {
    let mut args = vec!["serve-test", path_str(model), "--json", "--kv-pages", "256", "--page-size", "4"];
    for prompt in ["ROMEO:\nWhat", "First Citizen:\nBefore we proceed any further", "KING"] {
        args.extend(["--prompt", prompt]);
    }
    args.extend_from_slice(extra);
    squeeze(&args)
}

#[test]
fn speculative_decoding_with_the_trained_mtp_head_yields_greedy_tokens_faster_per_pass() {
    let model = std::path::Path::new(TRAINED);
    for (depth, kv) in [("mtp", "bf16"), ("mtp=3", "f32"), ("mtp=2", "fp8")] {
        let report =
            serve_speculative(model, &["--speculative", depth, "--kv-dtype", kv, "--max-new-tokens", "20"]).ok().json();
        let speculative = &report["speculative"];
        assert_eq!(speculative["identical_to_greedy"], true, "{depth} {kv}: {speculative}");
        assert_eq!(report["completed"], 3, "{depth} {kv}");
        let length = speculative["mean_accepted_length"].as_f64().unwrap();
        assert!(length > 1.0, "{depth} {kv}: a trained MTP head gets drafts accepted: {speculative}");
        let k = speculative["depth"].as_u64().unwrap() as usize;
        assert_eq!(speculative["drafted_by_depth"].as_array().unwrap().len(), k);
        // Fewer passes of the main model than tokens: emitted = Σ tokens, one pass per request-step.
        let tokens: u64 = report["requests"].as_array().unwrap().iter().map(|r| r["tokens"].as_u64().unwrap()).sum();
        assert_eq!(speculative["emitted"].as_u64().unwrap() + 3, tokens, "the first token of each comes from prefill");
        assert!(speculative["verifications"].as_u64().unwrap() < tokens - 3, "{speculative}");
        assert!(report["decode_steps"].as_u64().unwrap() < speculative["greedy_decode_steps"].as_u64().unwrap());
    }
}

#[test]
fn speculative_decoding_rolls_back_rejected_drafts_on_every_glm_layout() {
    let temp = tempfile::tempdir().unwrap();
    // Untrained MTP layers: most drafts are rejected, so every step rolls back; tokens must still be greedy's.
    for arch in ["glm45", "glm5", "glm5.2"] {
        let model = synth(temp.path(), arch, arch, &[]);
        let report = serve_speculative(&model, &["--speculative", "mtp=4", "--max-new-tokens", "12"]).ok().json();
        let speculative = &report["speculative"];
        assert_eq!(speculative["identical_to_greedy"], true, "{arch}: {speculative}");
        assert!(speculative["drafted"].as_u64().unwrap() > speculative["accepted"].as_u64().unwrap(), "{arch}");
        assert!(
            speculative["pages_rolled_back"].as_u64().unwrap() > 0,
            "{arch}: 4 drafts on pages of 4: {speculative}"
        );
    }
}

#[test]
fn a_page_freed_by_a_rollback_and_still_mapped_is_caught() {
    let temp = tempfile::tempdir().unwrap();
    let model = synth(temp.path(), "glm45", "glm45", &[]);
    for step in ["1", "3"] {
        let fault = format!("rollback-stale@{step}");
        let run =
            serve_speculative(&model, &["--speculative", "mtp=2", "--max-new-tokens", "12", "--inject-fault", &fault]);
        let report = run.ok().json();
        assert_eq!(report["faults_injected"], 1, "{fault}");
        assert_eq!(report["undetected"], 0, "{fault}: {}", report["injected"]);
        assert_eq!(report["false_positives"], 0, "{fault}");
        assert_eq!(report["aborted"], 1, "{fault}: only the victim aborts");
        assert_eq!(report["speculative"]["identical_to_greedy"], true, "{fault}: the others decode greedy's tokens");
    }
}

#[test]
fn speculative_bad_input_exits_2_naming_the_flag() {
    let temp = tempfile::tempdir().unwrap();
    let kimi = synth(temp.path(), "kimi", "kimi-k2", &[]);
    expect_exit_2(&serve_speculative(&kimi, &["--speculative", "mtp"]), &["--speculative", "no MTP layer"]);
    let glm = synth(temp.path(), "glm45", "glm45", &[]);
    expect_exit_2(
        &serve_speculative(&glm, &["--speculative", "mtp", "--temperature", "0.7"]),
        &["--speculative", "--temperature"],
    );
    expect_exit_2(&serve_speculative(&glm, &["--speculative", "eagle"]), &["--speculative", "mtp=K"]);
    expect_exit_2(&serve_speculative(&glm, &["--speculative", "mtp=0"]), &["--speculative", "1 … 16"]);
    let prefill = ["--speculative", "mtp", "--prefill-model", path_str(&glm)];
    expect_exit_2(&serve_speculative(&glm, &prefill), &["--speculative", "--prefill-model"]);
}

#[test]
fn calibrated_methods_gather_the_mtp_experts_statistics_from_the_mtp_forward() {
    let temp = tempfile::tempdir().unwrap();
    let source = synth(temp.path(), "glm45", "glm45", &[]);
    let mut outputs = Vec::new();
    for method in ["imatrix", "gptq", "rtn"] {
        let out = temp.path().join(method);
        let mut args = vec!["quantize", path_str(&source), path_str(&out), "--method", method, "--json"];
        if method != "rtn" {
            args.extend(["--calibration", SONNETS, "--samples", "4", "--seq-len", "64"]);
        }
        let report = squeeze(&args).ok().json();
        if method != "rtn" {
            let coverage = &report["expert_coverage"];
            assert_eq!(coverage["uncalibrated_layers"], serde_json::json!([]), "{method}: {coverage}");
            let mtp = coverage["layers"].as_array().unwrap().iter().find(|l| l["layer"] == 3).expect("the MTP layer");
            // Every position but each chunk's last drafts through the MTP layer: 4 × 63 tokens × top-2 routes.
            let routed: u64 = mtp["routed"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).sum();
            assert_eq!(routed, 4 * 63 * 2, "{method}: {mtp}");
        }
        outputs.push(out);
    }
    // The MTP layer's experts took their method's statistics: their codes differ from the weights-only rule's.
    let expert = "model.layers.3.mlp.experts.1.down_proj.weight_packed";
    let packed = |dir: &std::path::Path| crate::common::tensor_bytes(dir, expert);
    assert_ne!(packed(&outputs[0]), packed(&outputs[2]), "imatrix vs rtn");
    assert_ne!(packed(&outputs[1]), packed(&outputs[2]), "gptq vs rtn");
}

#[test]
fn eval_mtp_parts_merge_to_the_report_of_one_run() {
    let temp = tempfile::tempdir().unwrap();
    let fp8 = synth(temp.path(), "glm45", "glm45", &[]);
    let int4 = temp.path().join("int4");
    squeeze(&["quantize", path_str(&fp8), path_str(&int4)]).ok();
    let one_model = vec![path_str(&fp8)];
    let parity = vec!["--reference", path_str(&fp8), "--candidate", path_str(&int4)];
    for (name, models) in [("eval", one_model), ("parity", parity)] {
        let mut args =
            vec!["eval", "--data", SONNETS, "--ctx", "32", "--chunks", "5", "--mtp", "--mtp-depth", "2", "--json"];
        args.extend_from_slice(&models);
        // Parity gates fail on random weights (exit 1): the reports are what is compared.
        let run = |args: &[&str]| {
            let run = squeeze(args);
            assert!(run.code == 0 || run.code == 1, "{name}: exit {}\n{}", run.code, run.stderr);
            run.json()
        };
        let whole = run(&args);
        let files: Vec<_> = (1..=3).map(|i| temp.path().join(format!("{name}-{i}.safetensors"))).collect();
        for (index, file) in files.iter().enumerate() {
            let part = format!("{}/3", index + 1);
            let mut part_args = args.clone();
            part_args.extend(["--part", &part, "--save-stats", path_str(file)]);
            let report = run(&part_args);
            assert!(report["mtp"].is_object(), "{name} part {part}: its own drafts are reported");
        }
        let mut merge = vec!["merge-eval", "--json"];
        merge.extend(files.iter().map(|file| path_str(file)));
        let merged = run(&merge);
        assert!(whole["mtp"].is_object(), "{name}");
        let chains = match name {
            "eval" => vec![&whole["mtp"]["chain"]],
            _ => vec![&whole["mtp"]["reference"]["chain"], &whole["mtp"]["candidate"]["chain"]],
        };
        for chain in chains {
            assert_eq!(chain["depth"], 2, "{name}: chained drafts are reported (and merged): {}", whole["mtp"]);
        }
        assert_eq!(merged["mtp"], whole["mtp"], "{name}: merged parts vs one run");
    }
}
