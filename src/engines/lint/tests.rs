//! Whole-rule tests on hand-made output descriptions: a good Kimi-style output passes for both engines, and
//! each broken config or tensor fails the rule that owns it, awkward configs included (never a panic).

use serde_json::{json, Value};

use super::*;
use crate::io::dtype::Dtype;

fn tensor(name: &str, dtype: Dtype, shape: &[usize], values: Option<Values>) -> TensorFacts {
    TensorFacts { name: name.into(), dtype, shape: shape.to_vec(), values }
}

fn int4(tensors: &mut Vec<TensorFacts>, module: &str, rows: usize, columns: usize, group: usize) {
    tensors.push(tensor(&format!("{module}.weight_packed"), Dtype::I32, &[rows, columns.div_ceil(8)], None));
    let scales = rows * columns.div_ceil(group);
    tensors.push(tensor(
        &format!("{module}.weight_scale"),
        Dtype::BF16,
        &[rows, columns.div_ceil(group)],
        Some(Values::floats(vec![0.01; scales])),
    ));
    tensors.push(tensor(
        &format!("{module}.weight_shape"),
        Dtype::I64,
        &[2],
        Some(Values::Ints(vec![rows as i64, columns as i64])),
    ));
}

/// A Kimi-layout output: hidden 256, moe_intermediate 128, one dense and one MoE layer.
fn good() -> OutputDescription {
    let (hidden, inter) = (256, 128);
    let mut tensors = vec![tensor("model.embed_tokens.weight", Dtype::BF16, &[300, hidden], None)];
    for layer in 0..2 {
        let attention = format!("model.layers.{layer}.self_attn");
        for (name, shape) in
            [("q_a_proj", [96, hidden]), ("kv_a_proj_with_mqa", [80, hidden]), ("o_proj", [hidden, 128])]
        {
            tensors.push(tensor(&format!("{attention}.{name}.weight"), Dtype::BF16, &shape, None));
        }
        tensors.push(tensor(&format!("model.layers.{layer}.input_layernorm.weight"), Dtype::BF16, &[hidden], None));
    }
    for name in ["gate_proj", "up_proj", "down_proj"] {
        tensors.push(tensor(&format!("model.layers.0.mlp.{name}.weight"), Dtype::BF16, &[384, hidden], None));
        tensors.push(tensor(
            &format!("model.layers.1.mlp.shared_experts.{name}.weight"),
            Dtype::BF16,
            &[inter, hidden],
            None,
        ));
    }
    tensors.push(tensor("model.layers.1.mlp.gate.weight", Dtype::BF16, &[2, hidden], None));
    tensors.push(tensor("model.layers.1.mlp.gate.e_score_correction_bias", Dtype::F32, &[2], None));
    for expert in 0..2 {
        let prefix = format!("model.layers.1.mlp.experts.{expert}");
        int4(&mut tensors, &format!("{prefix}.gate_proj"), inter, hidden, 32);
        int4(&mut tensors, &format!("{prefix}.up_proj"), inter, hidden, 32);
        int4(&mut tensors, &format!("{prefix}.down_proj"), hidden, inter, 32);
    }
    tensors.push(tensor("lm_head.weight", Dtype::BF16, &[300, hidden], None));
    let config = json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": hidden, "moe_intermediate_size": inter, "num_hidden_layers": 2, "kv_lora_rank": 64,
        "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "output_activations": null,
                "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32,
                            "dynamic": false, "observer": "minmax", "actorder": null}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            "kv_cache_scheme": null
        }
    });
    OutputDescription { config, tensors }
}

const BOTH: [Engine; 2] = [Engine::Vllm, Engine::Sglang];

fn status(report: &LintReport, rule: &str) -> Status {
    report.rules.iter().filter(|r| r.rule == rule).map(|r| r.status).max().expect("rule is reported")
}

fn findings(report: &LintReport, rule: &str) -> String {
    report.rules.iter().filter(|r| r.rule == rule).flat_map(|r| r.finding_lines()).collect::<Vec<_>>().join("\n")
}

#[test]
fn a_good_output_passes_for_both_engines() {
    let report = lint(&good(), &BOTH, 1);
    assert!(report.passed, "{report:#?}");
    assert_eq!(report.rules.len(), rules::RULES.len(), "both engines agree, one row per rule: {report:#?}");
    assert_eq!(status(&report, "routed-experts"), Status::Passed);
    assert_eq!(status(&report, "mtp-eh-proj"), Status::Skipped);
    assert_eq!(report.rules[0].engines, BOTH.to_vec());
}

fn quantization(output: &mut OutputDescription) -> &mut Value {
    &mut output.config["quantization_config"]
}

#[test]
fn each_broken_piece_fails_its_own_rule() {
    let case = |rule: &str, needle: &str, tp: usize, edit: &dyn Fn(&mut OutputDescription)| {
        let mut output = good();
        edit(&mut output);
        let report = lint(&output, &BOTH, tp);
        assert_eq!(status(&report, rule), Status::Failed, "{rule}: {report:#?}");
        assert!(!report.passed);
        let text = findings(&report, rule);
        assert!(text.contains(needle), "{rule}: `{needle}` not in\n{text}");
    };
    case("quant-method", "pack-quantized", 1, &|o| quantization(o)["format"] = json!("mixed-precision"));
    case("linear-target", "target_scheme_map", 1, &|o| {
        quantization(o)["config_groups"]["group_0"]["targets"] = json!(["re:.*experts.*"])
    });
    case("weight-args", "group_size", 1, &|o| {
        quantization(o)["config_groups"]["group_0"]["weights"]["group_size"] = json!(16)
    });
    case("weight-args", "symmetric", 1, &|o| {
        quantization(o)["config_groups"]["group_0"]["weights"]["symmetric"] = json!(false)
    });
    // 128 / tp 8 = 16: not a multiple of 32.
    case("group-size-tp", "--tp 4", 8, &|_| {});
    case("ignore-coverage", "re:.*self_attn.*", 1, &|o| {
        quantization(o)["ignore"] =
            json!(["lm_head", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"])
    });
    case("ignore-coverage", "model.layers.0.self_attn", 1, &|o| {
        // `re.match` is anchored at the start: this pattern matches nothing.
        quantization(o)["ignore"][1] = json!("re:self_attn")
    });
    case("fused-pairs", "q_a_proj", 1, &|o| {
        quantization(o)["ignore"][1] = json!("re:.*self_attn\\.(o_proj|kv_a_proj_with_mqa)");
        o.tensors.retain(|t| !t.name.starts_with("model.layers.0.self_attn.q_a_proj"));
        int4(&mut o.tensors, "model.layers.0.self_attn.q_a_proj", 96, 256, 32);
    });
    case("routed-experts", "ignore entry", 1, &|o| {
        quantization(o)["ignore"].as_array_mut().unwrap().push(json!("re:.*experts\\.1\\."))
    });
    case("router-topk", "topk_method", 1, &|o| {
        o.config.as_object_mut().unwrap().remove("topk_method");
    });
    case("int4-tensors", "weight_packed", 1, &|o| {
        let packed = o.tensors.iter_mut().find(|t| t.name.ends_with("experts.0.down_proj.weight_packed")).unwrap();
        packed.shape = vec![512, 8];
    });
    case("int4-tensors", "finite", 1, &|o| {
        let scale = o.tensors.iter_mut().find(|t| t.name.ends_with("experts.0.up_proj.weight_scale")).unwrap();
        scale.values = Some(Values::floats([0.5, 0.0]));
    });
    case("kv-cache-scheme", "strategy", 1, &|o| {
        quantization(o)["kv_cache_scheme"] =
            json!({"type": "float", "num_bits": 8, "strategy": "attn_head", "symmetric": true, "dynamic": false});
    });
    case("kv-scales", "not a KV-scale name", 1, &|o| {
        quantization(o)["kv_cache_scheme"] =
            json!({"type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": true, "dynamic": false});
        o.tensors.push(tensor(
            "model.layers.0.self_attn.attn.attn.k_scale",
            Dtype::F32,
            &[1],
            Some(Values::floats([0.1])),
        ));
    });
}

#[test]
fn mtp_eh_proj_must_be_ignored() {
    let mut output = good();
    output.config["num_hidden_layers"] = json!(1);
    output.tensors.push(tensor("model.layers.1.eh_proj.weight", Dtype::BF16, &[256, 512], None));
    let report = lint(&output, &BOTH, 1);
    assert_eq!(status(&report, "mtp-eh-proj"), Status::Failed, "{report:#?}");
    assert!(findings(&report, "mtp-eh-proj").contains("add \"model.layers.1.eh_proj\""));
    output.config["quantization_config"]["ignore"].as_array_mut().unwrap().push(json!("model.layers.1.eh_proj"));
    assert_eq!(status(&lint(&output, &BOTH, 1), "mtp-eh-proj"), Status::Passed);
}

#[test]
fn kv_scales_on_mla_differ_per_engine() {
    let mut output = good();
    output.config["quantization_config"]["kv_cache_scheme"] =
        json!({"type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": true, "dynamic": false});
    for which in ["k_scale", "v_scale"] {
        let name = format!("model.layers.0.self_attn.{which}");
        output.tensors.push(tensor(&name, Dtype::F32, &[1], Some(Values::floats([0.02]))));
    }
    let report = lint(&output, &BOTH, 1);
    assert!(report.passed, "{report:#?}");
    let rows: Vec<&RuleResult> = report.rules.iter().filter(|r| r.rule == "kv-scales").collect();
    assert_eq!(rows.len(), 2, "one row per engine: {rows:#?}");
    assert!(rows.iter().all(|r| r.status == Status::Warning));
    assert!(rows[0].source.contains("compressed_tensors.py") && rows[1].source.contains("memory_pool.py"));
    // GQA: no MLA caveat, but SGLang loads only self_attn.attn.{k,v}_scale: vLLM passes, SGLang fails...
    output.config.as_object_mut().unwrap().remove("kv_lora_rank");
    let report = lint(&output, &BOTH, 1);
    let rows: Vec<&RuleResult> = report.rules.iter().filter(|r| r.rule == "kv-scales").collect();
    assert_eq!(rows.iter().map(|r| r.status).collect::<Vec<_>>(), vec![Status::Passed, Status::Failed], "{rows:#?}");
    // ... until the scales are written under SGLang's names too (calibrate-kv --engine all).
    for which in ["k_scale", "v_scale"] {
        let name = format!("model.layers.0.self_attn.attn.{which}");
        output.tensors.push(tensor(&name, Dtype::F32, &[1], Some(Values::floats([0.02]))));
    }
    let report = lint(&output, &BOTH, 1);
    assert!(report.rules.iter().filter(|r| r.rule == "kv-scales").all(|r| r.status == Status::Passed), "{report:#?}");
}

#[test]
fn marlin_padding_and_small_hidden_sizes_warn_but_pass() {
    let mut output = good();
    output.config["hidden_size"] = json!(320);
    // 128 / tp 2 = 64 fits group 32 and Marlin; tp 4 = 32 pads.
    let report = lint(&output, &BOTH, 4);
    assert_eq!(status(&report, "group-size-tp"), Status::Warning, "{report:#?}");
    assert!(findings(&report, "group-size-tp").contains("Marlin"));
    assert!(report.passed);
}

#[test]
fn awkward_configs_fail_the_rule_naming_the_key_and_never_panic() {
    let mut output = good();
    output.config.as_object_mut().unwrap().remove("moe_intermediate_size");
    let report = lint(&output, &BOTH, 1);
    assert_eq!(status(&report, "group-size-tp"), Status::Failed);
    assert!(findings(&report, "group-size-tp").contains("moe_intermediate_size"), "{report:#?}");

    for config in [
        Value::Null,
        json!([1, 2]),
        json!({"quantization_config": "compressed-tensors"}),
        json!({"quantization_config": {"config_groups": [], "ignore": "lm_head"}}),
        json!({"quantization_config": {"config_groups": {"group_0": {"targets": "Linear", "weights": 4}}},
               "hidden_size": "big", "architectures": "x", "topk_method": 3}),
    ] {
        let mut output = good();
        output.config = config.clone();
        let report = lint(&output, &BOTH, 8);
        assert!(!report.passed, "{config}: {report:#?}");
        assert_eq!(status(&report, "quant-method"), Status::Failed, "{config}");
    }
    // Nothing quantized: the INT4 rules do not apply.
    let bf16 = OutputDescription {
        config: json!({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {}}}),
        tensors: vec![tensor("lm_head.weight", Dtype::BF16, &[4, 4], None)],
    };
    let report = lint(&bf16, &BOTH, 1);
    assert!(report.passed, "{report:#?}");
    assert_eq!(status(&report, "linear-target"), Status::Skipped);
}

/// The status of `rule` for one engine alone, and its finding lines.
fn one_engine(output: &OutputDescription, engine: Engine, tp: usize, rule: &str) -> (Status, String) {
    let report = lint(output, &[engine], tp);
    (status(&report, rule), findings(&report, rule))
}

fn weights(output: &mut OutputDescription) -> &mut Value {
    &mut quantization(output)["config_groups"]["group_0"]["weights"]
}

/// SGLang 0.5.23's reading of the layouts other writers use (F32/F16 scales, zero points, channel, actorder,
/// targets naming the experts), beside vLLM's.
#[test]
fn sglang_rules_for_peer_layouts() {
    // F16 and F32 scales load in both engines (cast to the model dtype); an integer scale in neither.
    for (dtype, loads) in [(Dtype::F32, true), (Dtype::F16, true), (Dtype::I32, false)] {
        let mut output = good();
        for t in output.tensors.iter_mut().filter(|t| t.name.ends_with(".weight_scale")) {
            t.dtype = dtype;
        }
        for engine in BOTH {
            let (got, text) = one_engine(&output, engine, 1, "int4-tensors");
            assert_eq!(got == Status::Passed, loads, "{dtype} {engine:?}: {got:?}\n{text}");
        }
    }

    // Asymmetric with compressed-tensors' zero points [out/8, groups]: vLLM loads them; SGLang copies them untransposed.
    let mut asymmetric = good();
    weights(&mut asymmetric)["symmetric"] = json!(false);
    let zero_points: Vec<TensorFacts> = asymmetric
        .tensors
        .iter()
        .filter_map(|t| t.name.strip_suffix(".weight_scale").filter(|m| m.contains(".experts.")).map(|m| (m, t)))
        .map(|(module, scale)| {
            tensor(&format!("{module}.weight_zero_point"), Dtype::I32, &[scale.shape[0] / 8, scale.shape[1]], None)
        })
        .collect();
    asymmetric.tensors.extend(zero_points);
    for rule in ["weight-args", "int4-tensors"] {
        assert_eq!(one_engine(&asymmetric, Engine::Vllm, 1, rule).0, Status::Passed, "vLLM {rule}");
        let (got, text) = one_engine(&asymmetric, Engine::Sglang, 1, rule);
        assert_eq!(got, Status::Failed, "SGLang {rule}: {text}");
        assert!(text.contains("without the transpose") || text.contains("untransposed"), "{rule}: {text}");
    }
    // One finding for the folder, not one per tensor.
    assert_eq!(one_engine(&asymmetric, Engine::Sglang, 1, "int4-tensors").1.lines().count(), 1);
    // A zero point in a symmetric scheme still fails both.
    let mut stray = asymmetric;
    weights(&mut stray)["symmetric"] = json!(true);
    for engine in BOTH {
        let (got, text) = one_engine(&stray, engine, 1, "int4-tensors");
        assert_eq!(got, Status::Failed, "{engine:?}");
        assert!(text.contains("a zero point in a symmetric scheme"), "{text}");
    }

    // strategy channel, one scale per row: both engines load it (Marlin group -1); no group-size rule applies.
    let mut channel = good();
    weights(&mut channel)["strategy"] = json!("channel");
    weights(&mut channel)["group_size"] = Value::Null;
    for t in channel.tensors.iter_mut().filter(|t| t.name.ends_with(".weight_scale")) {
        t.shape[1] = 1;
        t.values = Some(Values::floats(vec![0.01; t.shape[0]]));
    }
    for engine in BOTH {
        assert_eq!(one_engine(&channel, engine, 2, "weight-args").0, Status::Passed, "{engine:?}");
        assert_eq!(one_engine(&channel, engine, 2, "int4-tensors").0, Status::Passed, "{engine:?}");
        assert_eq!(one_engine(&channel, engine, 2, "group-size-tp").0, Status::Skipped, "{engine:?}");
    }
    weights(&mut channel)["strategy"] = json!("tensor");
    assert_eq!(one_engine(&channel, Engine::Sglang, 1, "weight-args").0, Status::Failed);

    // actorder: SGLang sizes down_proj's scales for act-order unless the string is "static", and loads them split.
    let actorder = |value: Value, tp: usize| {
        let mut output = good();
        weights(&mut output)["actorder"] = value;
        one_engine(&output, Engine::Sglang, tp, "weight-args")
    };
    for value in [Value::Null, json!(false), json!("static")] {
        assert_eq!(actorder(value.clone(), 2).0, Status::Passed, "{value}");
    }
    for value in [json!("weight"), json!("group"), json!(true)] {
        assert_eq!(actorder(value.clone(), 1).0, Status::Passed, "{value} at tp 1");
        let (got, text) = actorder(value.clone(), 2);
        assert_eq!(got, Status::Failed, "{value} at tp 2");
        assert!(text.contains("load_full_w2") && text.contains("group size 32 / 2"), "{text}");
    }
    assert!(actorder(json!("weight"), 2).1.contains("set it to \"static\""));
    let (got, text) = actorder(json!("dynamic"), 1);
    assert_eq!(got, Status::Failed);
    assert!(text.contains("unpermuted"), "{text}");
    assert_eq!(actorder(json!("sorted"), 1).0, Status::Failed);

    // Targets naming the routed experts: SGLang matches them by name (vLLM's rule is unchanged).
    let mut named = good();
    quantization(&mut named)["config_groups"]["group_0"]["targets"] =
        json!(["re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"]);
    assert_eq!(one_engine(&named, Engine::Sglang, 1, "linear-target").0, Status::Passed);
    assert_eq!(one_engine(&named, Engine::Vllm, 1, "linear-target").0, Status::Failed);
    // … except where SGLang would fuse the BF16 shared expert into the INT4 layer (GLM-5's and DeepSeek-V3's 256
    // routed experts and one shared), which only a symmetric INT4 "Linear" group prevents.
    for architecture in ["GlmMoeDsaForCausalLM", "DeepseekV3ForCausalLM"] {
        let mut fused = named.clone();
        fused.config["architectures"] = json!([architecture]);
        fused.config["n_routed_experts"] = json!(256);
        fused.config["n_shared_experts"] = json!(1);
        let (got, text) = one_engine(&fused, Engine::Sglang, 1, "linear-target");
        assert_eq!(got, Status::Failed, "{architecture}");
        assert!(text.contains("shared_experts_fusion_disable_reason"), "{text}");
        quantization(&mut fused)["config_groups"]["group_0"]["targets"] = json!(["Linear"]);
        assert_eq!(one_engine(&fused, Engine::Sglang, 1, "linear-target").0, Status::Passed, "{architecture}");
        weights(&mut fused)["symmetric"] = json!(false);
        assert_eq!(one_engine(&fused, Engine::Sglang, 1, "linear-target").0, Status::Failed, "{architecture}");
    }
    let mut kimi = named.clone();
    kimi.config["n_routed_experts"] = json!(384);
    kimi.config["n_shared_experts"] = json!(1);
    assert_eq!(one_engine(&kimi, Engine::Sglang, 1, "linear-target").0, Status::Passed, "Kimi's 384 are not fused");
    // W4A8's SGLang method reads target_scheme_map["Linear"].
    let mut w4a8 = named;
    quantization(&mut w4a8)["config_groups"]["group_0"]["input_activations"] =
        json!({"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true, "symmetric": true});
    let (got, text) = one_engine(&w4a8, Engine::Sglang, 1, "linear-target");
    assert_eq!(got, Status::Failed);
    assert!(text.contains("CompressedTensorsW4AFP8MoE"), "{text}");
}

#[test]
fn kda_convolutions_and_gate_parameters_must_stay_unquantized_floats() {
    let mut output = good();
    assert_eq!(status(&lint(&output, &BOTH, 1), "kda-params"), Status::Skipped);
    let attention = "model.layers.0.self_attn";
    for name in ["q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"] {
        output.tensors.push(tensor(&format!("{attention}.{name}"), Dtype::F32, &[64, 1, 4], None));
    }
    output.tensors.push(tensor(&format!("{attention}.A_log"), Dtype::F32, &[1, 1, 2, 1], None));
    output.tensors.push(tensor(&format!("{attention}.dt_bias"), Dtype::F32, &[64], None));
    assert_eq!(status(&lint(&output, &BOTH, 1), "kda-params"), Status::Passed);
    // A packed convolution and an FP8 dt_bias: each named.
    output.tensors.retain(|t| t.name != format!("{attention}.k_conv1d.weight"));
    int4(&mut output.tensors, &format!("{attention}.k_conv1d"), 64, 32, 32);
    output.tensors.iter_mut().filter(|t| t.name.ends_with("dt_bias")).for_each(|t| t.dtype = Dtype::F8_E4M3);
    let report = lint(&output, &BOTH, 1);
    assert_eq!(status(&report, "kda-params"), Status::Failed, "{report:#?}");
    let text = findings(&report, "kda-params");
    assert!(text.contains("k_conv1d.weight_packed") && text.contains("dt_bias"), "{text}");
}

#[test]
fn glm53_flash_needs_vllms_keys_and_unquantized_attention() {
    let mut output = good();
    assert_eq!(status(&lint(&output, &BOTH, 1), "glm5-next-keys"), Status::Skipped);
    assert_eq!(status(&lint(&output, &BOTH, 1), "glm5-next-attention"), Status::Skipped);
    output.config["model_type"] = json!("glm5_next_text");
    output.config["qk_rope_head_dim"] = json!(0);
    output.config["hc_mult"] = json!(4);
    let attention = "model.layers.1.self_attn";
    output.tensors.push(tensor(&format!("{attention}.q_a_proj.weight"), Dtype::F8_E4M3, &[64, 64], None));
    output.tensors.push(tensor(&format!("{attention}.kv_b_proj.weight"), Dtype::BF16, &[64, 64], None));
    // The keys missing: each named; once added as quantize adds them, passed.
    let report = lint(&output, &BOTH, 1);
    assert_eq!(status(&report, "glm5-next-keys"), Status::Failed, "{report:#?}");
    let text = findings(&report, "glm5-next-keys");
    assert!(["mhc", "mla_use_nope", "indexer_rope_interleave"].iter().all(|k| text.contains(k)), "{text}");
    let fixes = crate::engines::lint::glm5_next_fixes(&mut output.config);
    assert_eq!(fixes.len(), 3);
    assert_eq!((&output.config["mhc"], &output.config["mla_use_nope"]), (&json!(true), &json!(true)));
    assert_eq!(status(&lint(&output, &BOTH, 1), "glm5-next-keys"), Status::Passed);
    assert!(crate::engines::lint::glm5_next_fixes(&mut output.config).is_empty(), "existing keys are kept");
    output.config["mhc"] = json!(false);
    assert_eq!(status(&lint(&output, &BOTH, 1), "glm5-next-keys"), Status::Failed);
    // A block-FP8 q_a_proj is dequantized at load: passed; an INT4 or FP8 kv_b_proj has nowhere to load.
    assert_eq!(status(&lint(&output, &BOTH, 1), "glm5-next-attention"), Status::Passed);
    output.tensors.retain(|t| !t.name.contains("kv_b_proj"));
    int4(&mut output.tensors, &format!("{attention}.kv_b_proj"), 64, 64, 32);
    let report = lint(&output, &BOTH, 1);
    assert_eq!(status(&report, "glm5-next-attention"), Status::Failed, "{report:#?}");
    assert!(findings(&report, "glm5-next-attention").contains("kv_b_proj"));
    // An INT4 KDA projection: vLLM has nowhere to load it; SGLang loads it unfused.
    output.tensors.retain(|t| !t.name.contains("kv_b_proj"));
    output.tensors.push(tensor(&format!("{attention}.kv_b_proj.weight"), Dtype::BF16, &[64, 64], None));
    let kda = "model.layers.0.self_attn";
    output.tensors.push(tensor(&format!("{kda}.A_log"), Dtype::F32, &[2], None));
    int4(&mut output.tensors, &format!("{kda}.q_proj"), 64, 64, 32);
    assert_eq!(one_engine(&output, Engine::Vllm, 1, "glm5-next-attention").0, Status::Failed);
    assert_eq!(one_engine(&output, Engine::Sglang, 1, "glm5-next-attention").0, Status::Passed);
}
