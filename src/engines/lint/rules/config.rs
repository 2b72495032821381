//! The rules on `config.json` alone: quantization method and format, the group and its weight arguments, the
//! KV-cache scheme, the router keys `e_score_correction_bias` needs, and the DSA indexer schedule each engine derives.

use serde_json::{json, Value};

use crate::engines::lint::context::{name_list, Context, Stored};
use crate::engines::lint::report::{Finding, Outcome, Status};
use crate::engines::Engine;
use crate::format::compressed_tensors::is_w4a8_activations;

const NOTHING_QUANTIZED: &str = "the output holds no INT4 modules and no config groups";

/// The missing-`quantization_config` finding, or `None` when it is there.
fn missing_quantization(context: &Context) -> Option<Finding> {
    if !context.config.is_object() {
        return Some(Finding::failed(
            "config.json",
            "missing or not a JSON object",
            "write the output with squeeze quantize, which writes config.json with its quantization_config",
        ));
    }
    context.quantization.is_none().then(|| {
        Finding::failed(
            "config.json `quantization_config`",
            "missing or not an object",
            "write the output with squeeze quantize, which writes the compressed-tensors quantization_config",
        )
    })
}

pub fn quant_method(context: &Context, _: Engine) -> Outcome {
    let (Some(quantization), None) = (context.quantization, missing_quantization(context)) else {
        return Outcome::from_findings("", missing_quantization(context).into_iter().collect());
    };
    if !context.has_int4() {
        return Outcome::skipped(NOTHING_QUANTIZED);
    }
    let mut findings = Vec::new();
    let method = quantization.get("quant_method");
    if method != Some(&json!("compressed-tensors")) {
        findings.push(Finding::failed(
            "quantization_config.quant_method",
            format!("is {}, expected \"compressed-tensors\"", shown(method)),
            "set it to \"compressed-tensors\"",
        ));
    }
    let format = quantization.get("format");
    let fp4_format = super::fp4::expected_format(context);
    let expected = fp4_format.unwrap_or("pack-quantized");
    if format != Some(&json!(expected)) {
        findings.push(Finding::failed(
            "quantization_config.format",
            format!("is {}, expected \"{expected}\"", shown(format)),
            match fp4_format {
                Some(_) => format!("set it to \"{expected}\" (what the FP4 modules are)"),
                None => "set it to \"pack-quantized\"; layouts that keep FP8 modules (recipe unselected = \
                         \"fp8-block\") are outside the INT4 MoE load path these rules were read for"
                    .to_string(),
            },
        ));
    }
    for group in &context.groups {
        let is_fp4 = group.json.pointer("/weights/type").and_then(Value::as_str) == Some("float")
            && group.json.pointer("/weights/num_bits").and_then(Value::as_u64) == Some(4);
        let allowed: &[&str] =
            if is_fp4 { &["nvfp4-pack-quantized", "mxfp4-pack-quantized"] } else { &["pack-quantized"] };
        match group.json.get("format") {
            None | Some(Value::Null) => {}
            Some(Value::String(value)) if allowed.contains(&value.as_str()) => {}
            Some(value) => findings.push(Finding::failed(
                format!("quantization_config.config_groups.{}.format", group.name),
                format!("is {value}, expected {}", allowed.join(" or ")),
                format!("set it to {} or remove it", allowed[0]),
            )),
        }
    }
    Outcome::from_findings(format!("compressed-tensors {expected}"), findings)
}

pub fn linear_target(context: &Context, engine: Engine) -> Outcome {
    if let Some(finding) = missing_quantization(context) {
        return Outcome::from_findings("", vec![finding]);
    }
    if !context.has_int4() {
        return Outcome::skipped(NOTHING_QUANTIZED);
    }
    let remedy = "keep one INT4 group with \"targets\": [\"Linear\"] and list unquantized modules in `ignore`";
    match context.groups.as_slice() {
        [] => Outcome::from_findings(
            "",
            vec![Finding::failed(
                "quantization_config.config_groups",
                "missing or empty, but INT4 tensors exist",
                remedy,
            )],
        ),
        [group] => {
            let targets = group.json.get("targets");
            let linear = targets == Some(&json!(["Linear"]));
            if engine == Engine::Sglang {
                return sglang_targets(context, group.name, linear, shown(targets));
            }
            if linear {
                Outcome::passed(format!("{} targets [\"Linear\"]", group.name))
            } else {
                Outcome::from_findings(
                    "",
                    vec![Finding::failed(
                        format!("quantization_config.config_groups.{}.targets", group.name),
                        format!(
                            "is {}: older SGLang indexes target_scheme_map[\"Linear\"] and raises KeyError for \
                             regex-only targets",
                            shown(targets)
                        ),
                        "set it to [\"Linear\"] and list unquantized modules in `ignore`",
                    )],
                )
            }
        }
        groups => {
            let names: Vec<&str> = groups.iter().map(|g| g.name).collect();
            Outcome::from_findings(
                "",
                vec![Finding::failed(
                    "quantization_config.config_groups",
                    format!("has {} groups ({}), the INT4 MoE path expects one", groups.len(), names.join(", ")),
                    remedy,
                )],
            )
        }
    }
}

/// SGLang 0.5.23 with one config group: `get_moe_scheme` (compressed_tensors.py) finds each MoE layer's scheme by
/// matching `<layer>.experts.0.{gate,up,down}_proj` against the targets (`find_matched_target`: exact, `re:`
/// re.match, or the module class `Linear`), so targets naming the routed experts load like `["Linear"]` (the
/// routed-experts and ignore-coverage rules check that they name every expert and that every other linear is
/// ignored) — except that two places read `target_scheme_map["Linear"]` alone: W4A8's `CompressedTensorsW4AFP8MoE`
/// (KeyError without it) and the shared-expert fusion gate ([`sglang_fuses_shared_expert`]).
fn sglang_targets(context: &Context, group: &str, linear: bool, targets: String) -> Outcome {
    let subject = format!("quantization_config.config_groups.{group}.targets");
    let mut findings = Vec::new();
    if !linear && w4a8_group(context).is_some() {
        findings.push(Finding::failed(
            subject.clone(),
            format!(
                "is {targets}: SGLang 0.5.23's W4A8 MoE (CompressedTensorsW4AFP8MoE.__init__) reads \
                 target_scheme_map[\"Linear\"] and raises KeyError without it"
            ),
            "set it to [\"Linear\"] and list unquantized modules in `ignore`",
        ));
    }
    if let Some(problem) = sglang_fuses_shared_expert(context, linear) {
        findings.push(Finding::failed(
            subject,
            format!("is {targets}: {problem}"),
            "give the INT4 group \"targets\": [\"Linear\"] (symmetric) and list unquantized modules in `ignore`, or \
             serve with --disable-shared-experts-fusion",
        ));
    }
    let detail = if linear {
        format!("{group} targets [\"Linear\"]")
    } else {
        format!("{group} targets {targets}: SGLang 0.5.23 matches the routed experts by name (get_moe_scheme)")
    };
    Outcome::from_findings(detail, findings)
}

/// Why SGLang 0.5.23 would fuse an unquantized shared expert into the INT4 routed experts' MoE layer, if it would
/// (INT4 outputs only).
/// `DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason` (models/deepseek_v2.py) fuses for
/// `DeepseekV3ForCausalLM` and `GlmMoeDsaForCausalLM` (GLM-5) with 256 routed experts and one shared expert (CUDA,
/// no DeepEP/TBO) unless `is_wint4afp8_or_wint4a16_config` (models/deepseek_common/utils.py) says the routed
/// experts are INT4, which it reads from `target_scheme_map["Linear"]` only (pack-quantized int4 symmetric static,
/// W4A16 or W4A8). Fused, the shared expert is loaded as expert 256 of the INT4 layer, where its BF16 `weight` names
/// no parameter and is skipped (`DeepseekV2WeightLoaderMixin.do_load_weights`: `if name not in params_dict:
/// continue`).
fn sglang_fuses_shared_expert(context: &Context, linear: bool) -> Option<String> {
    // Read for INT4 routed experts only (FP4 MoE methods have their own shared-expert handling, not read here).
    if !context.modules.values().any(|stored| *stored == Stored::Int4) {
        return None;
    }
    let architecture = context.architecture()?;
    if !matches!(architecture, "DeepseekV3ForCausalLM" | "GlmMoeDsaForCausalLM") {
        return None;
    }
    let routed = context.config.get("n_routed_experts").and_then(Value::as_u64);
    let shared = context.config.get("n_shared_experts").and_then(Value::as_u64);
    if routed != Some(256) || shared != Some(1) {
        return None;
    }
    let unquantized_shared =
        context.modules.iter().any(|(module, stored)| module.contains(".mlp.shared_experts.") && !stored.is_packed());
    if !unquantized_shared {
        return None;
    }
    let int4_linear = linear
        && context.quantization.and_then(|q| q.get("format")) == Some(&json!("pack-quantized"))
        && int4_group_weights(context).is_some_and(|(_, w)| {
            w.get("num_bits") == Some(&json!(4))
                && w.get("type") == Some(&json!("int"))
                && w.get("symmetric") == Some(&json!(true))
                && w.get("dynamic") != Some(&json!(true))
        });
    (!int4_linear).then(|| {
        format!(
            "SGLang 0.5.23 fuses the shared expert of a {architecture} with 256 routed experts into the routed \
             experts' MoE layer unless target_scheme_map[\"Linear\"] is symmetric INT4 \
             (deepseek_v2.py shared_experts_fusion_disable_reason, deepseek_common/utils.py \
             is_wint4afp8_or_wint4a16_config); the unquantized shared expert's weights then load nowhere"
        )
    })
}

/// The weights arguments of the INT4 group (`num_bits` 4), else of the first group.
pub fn int4_group_weights<'a>(context: &'a Context) -> Option<(&'a str, &'a Value)> {
    let mut with_weights = context.groups.iter().filter_map(|g| g.json.get("weights").map(|w| (g.name, w)));
    let first = with_weights.clone().next();
    with_weights.find(|(_, w)| w.get("num_bits").and_then(Value::as_u64) == Some(4)).or(first)
}

/// The INT4 group size, when the config states one.
pub fn group_size(context: &Context) -> Option<usize> {
    int4_group_weights(context)?.1.get("group_size")?.as_u64().map(|g| g as usize)
}

/// The group sizes the engines' INT4 MoE kernels take.
pub const GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// The INT4 group's input activations, when they make it W4A8.
pub fn w4a8_group<'a>(context: &'a Context) -> Option<&'a str> {
    let (group, _) = int4_group_weights(context)?;
    let json = context.groups.iter().find(|g| g.name == group)?.json;
    json.get("input_activations").is_some_and(is_w4a8_activations).then_some(group)
}

/// W4A8 loads only where vLLM's `CompressedTensorsW4A8Fp8MoEMethod` (`compressed_tensors_moe_w4a8_fp8.py`) and
/// SGLang's `CompressedTensorsW4AFP8MoE` accept the shapes: group 128, symmetric weights, `hidden_size % 256 == 0`
/// and `moe_intermediate_size / tp % 256 == 0` (vLLM asserts each).
pub fn w4a8_shapes(context: &Context, _: Engine) -> Outcome {
    let Some(group) = w4a8_group(context) else {
        return Outcome::skipped("not W4A8 (no FP8 per-token input activations)");
    };
    let mut findings = Vec::new();
    let weights = int4_group_weights(context).map(|(_, w)| w);
    let size = weights.and_then(|w| w.get("group_size")).and_then(Value::as_u64);
    if size != Some(128) {
        findings.push(Finding::failed(
            format!("quantization_config.config_groups.{group}.weights.group_size"),
            format!("is {size:?}: W4A8 MoE needs 128 (\"Only group size 128 supported for W4A8 MoE\")"),
            "requantize with a w4a8-fp8 rule (group 128)",
        ));
    }
    if weights.and_then(|w| w.get("symmetric")) == Some(&Value::Bool(false)) {
        findings.push(Finding::failed(
            format!("quantization_config.config_groups.{group}.weights.symmetric"),
            "is false: W4A8 MoE takes symmetric weights only (\"Only symmetric quantization is supported for W4A8 \
             MoE\")",
            "requantize with a w4a8-fp8 rule (symmetric)",
        ));
    }
    let tp = context.tp.max(1);
    match (context.config_usize("hidden_size"), context.config_usize("moe_intermediate_size")) {
        (Ok(hidden), Ok(intermediate)) => {
            if !hidden.is_multiple_of(256) {
                findings.push(Finding::failed(
                    "config.json `hidden_size`",
                    format!("{hidden} is not a multiple of 256: vLLM's W4A8 MoE asserts it"),
                    "serve this model as INT4 W4A16 (the -int4 recipe) instead",
                ));
            }
            if !intermediate.is_multiple_of(tp) || !(intermediate / tp).is_multiple_of(256) {
                let fits: Vec<String> = [8, 4, 2, 1]
                    .iter()
                    .filter(|&&t| intermediate.is_multiple_of(t) && (intermediate / t).is_multiple_of(256))
                    .map(|t| format!("--tp {t}"))
                    .collect();
                findings.push(Finding::failed(
                    "config.json `moe_intermediate_size`",
                    format!("{intermediate} / tp {tp} is not a multiple of 256: vLLM's W4A8 MoE asserts it per shard"),
                    match fits.first() {
                        Some(fit) => format!("serve with {fit}, or as INT4 W4A16"),
                        None => "serve this model as INT4 W4A16 (the -int4 recipe): no tp fits".to_string(),
                    },
                ));
            }
        }
        (h, i) => findings.extend([h.err(), i.err()].into_iter().flatten()),
    }
    Outcome::from_findings(format!("{group}: W4A8, tp {tp}"), findings)
}

pub fn weight_args(context: &Context, engine: Engine) -> Outcome {
    if let Some(finding) = missing_quantization(context) {
        return Outcome::from_findings("", vec![finding]);
    }
    if !context.has_int4() {
        return Outcome::skipped(NOTHING_QUANTIZED);
    }
    if super::fp4::expected_format(context).is_some() && !context.modules.values().any(|s| *s == Stored::Int4) {
        return Outcome::skipped("no INT4 modules (fp4-weight-args checks the FP4 group)");
    }
    let Some((group, weights)) = int4_group_weights(context) else {
        return Outcome::from_findings(
            "",
            vec![Finding::failed(
                "quantization_config.config_groups.*.weights",
                "no group has `weights`",
                "write the group as squeeze quantize does (num_bits 4, type int, symmetric, strategy group)",
            )],
        );
    };
    let key = |name: &str| format!("quantization_config.config_groups.{group}.weights.{name}");
    let mut findings = Vec::new();
    // `symmetric`, `strategy` and `actorder` are each engine's own (`vllm_weight_args`, `sglang_weight_args`).
    match engine {
        Engine::Vllm => findings.extend(vllm_weight_args(weights, &key)),
        Engine::Sglang => findings.extend(sglang_weight_args(weights, context.tp.max(1), &key)),
    }
    for (name, expected) in [("type", json!("int")), ("num_bits", json!(4)), ("dynamic", json!(false))] {
        let got = weights.get(name);
        if got != Some(&expected) {
            findings.push(Finding::failed(
                key(name),
                format!("is {}, expected {expected}", shown(got)),
                format!("set it to {expected}: the INT4 MoE path takes static int4 weights only"),
            ));
        }
    }
    let channel = weights.get("strategy") == Some(&json!("channel"));
    match weights.get("group_size").and_then(Value::as_u64) {
        _ if channel => {}
        Some(g) if GROUP_SIZES.contains(&(g as usize)) => {}
        _ => findings.push(Finding::failed(
            key("group_size"),
            format!("is {}, expected 32, 64 or 128", shown(weights.get("group_size"))),
            "requantize with --group-size 32 (Kimi's layout), 64 or 128",
        )),
    }
    let activations = context
        .groups
        .iter()
        .find(|g| g.name == group)
        .and_then(|g| g.json.get("input_activations"))
        .filter(|v| !v.is_null());
    if let Some(activations) = activations.filter(|a| !is_w4a8_activations(a)) {
        findings.push(Finding::failed(
            format!("quantization_config.config_groups.{group}.input_activations"),
            format!("is {activations}, expected null (W4A16) or FP8 per-token dynamic symmetric (W4A8)"),
            "set it to null",
        ));
    }
    let detail = format!("{group}: group_size {}", shown(weights.get("group_size")));
    Outcome::from_findings(detail, findings)
}

/// What vLLM 0.32 refuses among the weight arguments other writers use: `symmetric` false and `strategy` channel
/// load (`CompressedTensorsWNA16MoEMethod`, compressed_tensors_moe_wna16.py: zero points `w13/w2_weight_zero_point`,
/// `strategy == "channel"` one group), `actorder` weight/static only changes calibration; `actorder` group or
/// dynamic (a `weight_g_idx`) raises "no longer supported" (compressed_tensors.py
/// `_quantization_scheme_map_from_config`), and another strategy has no WNA16 MoE method.
fn vllm_weight_args(weights: &Value, key: &dyn Fn(&str) -> String) -> Vec<Finding> {
    let mut findings = Vec::new();
    match weights.get("symmetric") {
        Some(Value::Bool(_)) => {}
        other => findings.push(Finding::failed(
            key("symmetric"),
            format!("is {}, expected true or false", shown(other)),
            "set it to true (or false with weight_zero_point tensors)",
        )),
    }
    let strategy = weights.get("strategy");
    if !matches!(strategy.and_then(Value::as_str), Some("group" | "channel")) {
        findings.push(Finding::failed(
            key("strategy"),
            format!("is {}, expected \"group\" or \"channel\"", shown(strategy)),
            "requantize with group scales (squeeze quantize writes strategy group)",
        ));
    }
    let actorder = weights.get("actorder");
    let refused = match actorder {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(order)) => !matches!(order.as_str(), "weight" | "static"),
        Some(_) => true,
    };
    if refused {
        findings.push(Finding::failed(
            key("actorder"),
            format!("is {}: vLLM 0.32 no longer loads group/dynamic activation order (weight_g_idx)", shown(actorder)),
            "requantize without activation order, or with actorder \"weight\" (same layout, no g_idx)",
        ));
    }
    findings
}

/// SGLang 0.5.23 on CUDA (compressed-tensors 0.18 parses the config): `compressed_tensors.py`
/// `_is_wNa16_group_channel` sends static int4 `group` and `channel` weights, symmetric or not, to
/// `CompressedTensorsWNA16MoE` (Marlin; the Triton backend, `--moe-runner-backend triton` or SM100's default, takes
/// symmetric group 32/128 without actorder only and falls back to Marlin on SM100). There:
/// - `symmetric: false` does not load: `FusedMoE._weight_loader_impl` (fused_moe_triton/layer.py) transposes every
///   compressed-tensors expert tensor except those named `zero`, so compressed-tensors' zero points
///   (`[out/8, groups]`, packed along the output rows) go untransposed into the `[groups, out/8]` parameter
///   `create_weights` allocates (a shape-mismatch error, or a silently wrong copy where the shapes coincide), and
///   `process_weights_after_loading` converts them as AWQ-interleaved (`moe_awq_to_marlin_zero_points`);
/// - `actorder`: `create_weights` sizes down_proj's scales for the whole (unsplit) intermediate size when actorder
///   is set and not the string "static" (`load_full_w2`), but the loader never reads `load_full_w2` and shards
///   them, so at a MoE tensor-parallel size above 1 the Marlin kernel divides K by the wrong group count (group size
///   g / tp): "weight" and "group" load only with the experts unsplit; "dynamic" (compressed-tensors' alias of
///   "group") loses its g_idx (`process_weights_after_loading` sorts by g_idx only for the string "group").
fn sglang_weight_args(weights: &Value, tp: usize, key: &dyn Fn(&str) -> String) -> Vec<Finding> {
    let mut findings = Vec::new();
    match weights.get("symmetric") {
        Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => findings.push(Finding::failed(
            key("symmetric"),
            "is false: SGLang 0.5.23 copies compressed-tensors' weight_zero_point [out/8, groups] into its \
             [groups, out/8] parameter without the transpose the other expert tensors get, and reads it as \
             AWQ-interleaved (FusedMoE._weight_loader_impl, CompressedTensorsWNA16MoE.process_weights_after_loading): \
             a shape-mismatch error at load, or wrong zero points",
            "serve this folder with vLLM, or requantize symmetric (squeeze quantize writes symmetric INT4)",
        )),
        other => findings.push(Finding::failed(
            key("symmetric"),
            format!("is {}, expected true", shown(other)),
            "set it to true (squeeze quantize writes symmetric INT4)",
        )),
    }
    let strategy = weights.get("strategy");
    if !matches!(strategy.and_then(Value::as_str), Some("group" | "channel")) {
        findings.push(Finding::failed(
            key("strategy"),
            format!("is {}, expected \"group\" or \"channel\" (SGLang's WNA16 MoE scheme)", shown(strategy)),
            "requantize with group scales (squeeze quantize writes strategy group)",
        ));
    }
    // compressed-tensors 0.18 reads `true` as "group" and `false` as null.
    let actorder = weights.get("actorder");
    let order = match actorder {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Some(None),
        Some(Value::Bool(true)) => Some(Some("group")),
        Some(Value::String(order)) => Some(Some(order.as_str())),
        Some(_) => None,
    };
    let group = weights.get("group_size").and_then(Value::as_u64).map_or("g".to_string(), |g| g.to_string());
    let unsplit = "serve with the experts unsplit (--tp 1, or --ep-size equal to --tp), or requantize without \
                   activation order";
    match order {
        Some(None | Some("static")) => {}
        Some(Some(order @ ("weight" | "group"))) => {
            if tp > 1 {
                findings.push(Finding::failed(
                    key("actorder"),
                    format!(
                        "is \"{order}\": at tp {tp} SGLang 0.5.23 allocates down_proj's scales unsplit \
                         (CompressedTensorsWNA16MoE.create_weights, load_full_w2) but loads them split (FusedMoE \
                         never reads load_full_w2), so its Marlin MoE kernel runs with group size {group} / {tp}"
                    ),
                    match order {
                        "weight" => format!(
                            "set it to \"static\" (compressed-tensors' alias of \"weight\": the same layout, which \
                             SGLang does not size as act-order), or {unsplit}"
                        ),
                        _ => unsplit.to_string(),
                    },
                ));
            }
        }
        Some(Some("dynamic")) => findings.push(Finding::failed(
            key("actorder"),
            "is \"dynamic\": SGLang 0.5.23 applies weight_g_idx only when actorder is the string \"group\" \
             (CompressedTensorsWNA16MoE.process_weights_after_loading), so this alias serves the groups unpermuted",
            "set it to \"group\" (the same layout)",
        )),
        _ => findings.push(Finding::failed(
            key("actorder"),
            format!(
                "is {}: compressed-tensors 0.18 (SGLang 0.5.23's) knows null, weight, static, group, dynamic",
                shown(actorder)
            ),
            "set it to null",
        )),
    }
    findings
}

/// KV-scale tensors of the output (`….k_scale`, `.v_scale`, `.q_scale`, `.kv_scale`).
pub fn kv_scale_names<'a>(context: &Context<'a>) -> Vec<&'a str> {
    context
        .tensors
        .keys()
        .copied()
        .filter(|name| {
            name.rsplit_once('.')
                .is_some_and(|(_, last)| matches!(last, "k_scale" | "v_scale" | "q_scale" | "kv_scale"))
        })
        .collect()
}

pub fn kv_cache_scheme(context: &Context, _: Engine) -> Outcome {
    let scales = kv_scale_names(context);
    let scheme = context.quantization.and_then(|q| q.get("kv_cache_scheme")).filter(|s| !s.is_null());
    let Some(scheme) = scheme else {
        if scales.is_empty() {
            return Outcome::skipped("no kv_cache_scheme and no KV-scale tensors");
        }
        return Outcome::from_findings(
            "",
            vec![Finding::failed(
                "quantization_config.kv_cache_scheme",
                format!("missing or null, but the output holds KV-scale tensors ({})", name_list(&scales)),
                "rerun squeeze calibrate-kv, which writes the scales and the scheme together",
            )],
        );
    };
    let mut findings = Vec::new();
    for (name, expected) in [
        ("type", json!("float")),
        ("num_bits", json!(8)),
        ("strategy", json!("tensor")),
        ("symmetric", json!(true)),
        ("dynamic", json!(false)),
    ] {
        let got = scheme.get(name);
        if got != Some(&expected) {
            findings.push(Finding::failed(
                format!("quantization_config.kv_cache_scheme.{name}"),
                format!("is {}, expected {expected}", shown(got)),
                format!(
                    "set it to {expected}: vLLM and SGLang take static symmetric per-tensor FP8 KV scales only \
                     (calibrate-kv --strategy tensor)"
                ),
            ));
        }
    }
    Outcome::from_findings("float 8-bit per-tensor static", findings)
}

/// Architectures vLLM loads through `deepseek_v2.py`, where the bias exists only for `noaux_tc`.
const DEEPSEEK_V2_FAMILY: [&str; 4] =
    ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM", "KimiK2ForCausalLM"];

pub fn router_topk(context: &Context, _: Engine) -> Outcome {
    // DeepSeek-V4 stores the bias as `ffn.gate.bias`; vLLM's V4 models (models/deepseek_v4/{nvidia,cpu}/model.py)
    // rename it to `e_score_correction_bias` and create that parameter only for noaux_tc, and score with the
    // config's sqrtsoftplus.
    let deepseek_v4 = context.architecture() == Some("DeepseekV4ForCausalLM");
    let is_bias = |name: &&str| crate::engines::lint::fixes::is_router_bias(name, deepseek_v4);
    let biases: Vec<&str> = context.tensors.keys().copied().filter(is_bias).collect();
    if biases.is_empty() {
        return Outcome::skipped("no e_score_correction_bias tensors");
    }
    if crate::engines::lint::fixes::routes_elsewhere(context.config) {
        return Outcome::skipped(
            "Kimi-Linear / Kimi K3 route by moe_router_activation_func and always build the bias (vLLM \
             kimi_linear.py, models/kimi_k3/)",
        );
    }
    let architecture = context.architecture();
    let strict = deepseek_v4 || architecture.is_none_or(|a| DEEPSEEK_V2_FAMILY.contains(&a));
    let caveat = if strict {
        String::new()
    } else {
        format!(
            " (read in deepseek_v2.py for DeepSeek-V3/Kimi K2/GLM-5; {} loads through another file, so this is a \
             warning)",
            architecture.unwrap_or("?")
        )
    };
    let finding = |subject: &str, problem: String, remedy: &str| {
        let mut f = Finding::failed(subject, problem + &caveat, remedy);
        if !strict {
            f.status = Status::Warning;
        }
        f
    };
    let mut findings = Vec::new();
    let topk = context.config.get("topk_method");
    if topk != Some(&json!("noaux_tc")) {
        findings.push(finding(
            "config.json `topk_method`",
            format!(
                "is {} but {} exists: the engine creates that parameter only for noaux_tc and fails with \
                 KeyError: {}",
                shown(topk),
                biases[0],
                biases[0].trim_start_matches("model.").replace(".ffn.gate.bias", ".ffn.gate.e_score_correction_bias")
            ),
            "add \"topk_method\": \"noaux_tc\" to config.json (squeeze quantize adds it when it is missing)",
        ));
    }
    let scoring = context.config.get("scoring_func");
    if !deepseek_v4 && scoring != Some(&json!("sigmoid")) {
        findings.push(finding(
            "config.json `scoring_func`",
            format!(
                "is {}: the engine defaults to softmax routing scores, the model was trained with sigmoid",
                shown(scoring)
            ),
            "add \"scoring_func\": \"sigmoid\" to config.json (squeeze quantize adds it when it is missing)",
        ));
    }
    for bias in &biases {
        let router = format!("{}.weight", bias.trim_end_matches(".e_score_correction_bias").trim_end_matches(".bias"));
        let kept = context.tensors.get(router.as_str()).is_some_and(|t| t.shape.len() == 2);
        if !kept {
            findings.push(Finding::failed(
                router.clone(),
                format!("missing while {bias} exists: the router weight must be kept unquantized"),
                "keep the router weight (the built-in recipes' `keep` has \\.mlp\\.gate\\.)",
            ));
        }
    }
    Outcome::from_findings(format!("{} router bias tensors", biases.len()), findings)
}

/// A config value for a message: its JSON, or `missing`.
pub fn shown(value: Option<&Value>) -> String {
    match value {
        None => "missing".into(),
        Some(value) => value.to_string(),
    }
}
/// GLM-5.2's shared DSA indexer: the engine must build an indexer exactly in the layers `indexer_types` marks full
/// (the ones whose weights the checkpoint holds). vLLM ignores `indexer_types`; SGLang reads it first.
pub fn indexer_schedule(context: &Context, engine: Engine) -> Outcome {
    let Some(kinds) = context.config.get("indexer_types").and_then(Value::as_array) else {
        return Outcome::skipped("no indexer_types (every DSA layer, if any, runs its own indexer)");
    };
    let full: Vec<bool> = kinds.iter().map(|kind| kind.as_str() != Some("shared")).collect();
    let shared = full.iter().filter(|runs| !**runs).count();
    let detail = format!("{} full, {shared} shared DSA layers", full.len() - shared);
    if engine == Engine::Sglang {
        return Outcome::passed(detail);
    }
    let disagreements = crate::engines::lint::indexer_schedule::vllm_disagreements(context.config, &full);
    if disagreements.is_empty() {
        return Outcome::passed(detail);
    }
    let shown: Vec<String> = disagreements.iter().take(3).cloned().collect();
    let more = disagreements.len().saturating_sub(shown.len());
    Outcome::from_findings(
        detail,
        vec![Finding::failed(
            "config.json `indexer_types`",
            format!(
                "vLLM reads only index_topk_pattern or index_topk_freq/index_skip_topk_offset, and from them derives \
                 another schedule: {}{}",
                shown.join("; "),
                if more > 0 { format!("; and {more} more layers") } else { String::new() }
            ),
            format!(
                "add \"index_topk_pattern\": \"{}\" to config.json (squeeze quantize adds it)",
                crate::engines::lint::indexer_schedule::pattern(&full)
            ),
        )],
    )
}

/// GLM-5.3-Flash's text config carries the keys vLLM reads without a default (`fixes::glm5_next_keys`), with the
/// values its layout implies.
pub fn glm5_next_keys(context: &Context, _: Engine) -> Outcome {
    let keys = crate::engines::lint::fixes::glm5_next_keys(context.config);
    if keys.is_empty() {
        return Outcome::skipped("not GLM-5.3-Flash (text model_type glm5_next_text)");
    }
    let mut findings = Vec::new();
    for (key, want, why) in &keys {
        let remedy = format!("set text_config `{key}` to {want} (squeeze quantize adds it)");
        match context.config.get(*key) {
            None | Some(Value::Null) => findings.push(Finding::failed(
                format!("config.json text_config `{key}`"),
                format!(
                    "is missing: vLLM's glm5next model reads it without a default (AttributeError at load); it {why}"
                ),
                remedy,
            )),
            Some(value) if *key != "indexer_rope_interleave" && value != want => findings.push(Finding::failed(
                format!("config.json text_config `{key}`"),
                format!("is {value} but the layout needs {want}: vLLM {why}"),
                remedy,
            )),
            Some(_) => {}
        }
    }
    Outcome::from_findings(format!("{} keys", keys.len()), findings)
}
