//! The rules on tensors: each INT4 module's packed weight, scale and shape (dtypes, shapes, values) with no FP8
//! leftovers, and the KV-scale tensors' names, dtypes and values.

use super::config::{group_size, kv_scale_names};
use crate::engines::kv_scales::{kv_scale_handling, kv_scale_names as kv_scale_names_for, CacheLayout, ScaleUse};
use crate::engines::lint::context::{Context, Stored};
use crate::engines::lint::output::Values;
use crate::engines::lint::report::{Finding, Outcome};
use crate::engines::Engine;
use crate::io::dtype::Dtype;
use crate::quant::pack::packed_columns;

pub fn int4_tensors(context: &Context, engine: Engine) -> Outcome {
    let modules: Vec<&str> = context.modules.iter().filter(|(_, s)| **s == Stored::Int4).map(|(m, _)| *m).collect();
    let mut findings = Vec::new();
    for name in context.tensors.keys().filter(|n| n.ends_with(".weight_scale_inv")) {
        findings.push(Finding::failed(
            *name,
            "leftover FP8 block scale in an INT4 output",
            "dequantize the module to BF16 or quantize it to INT4 (recipe `unselected = \"bf16\"`)",
        ));
    }
    if modules.is_empty() {
        return match findings.is_empty() {
            true => Outcome::skipped("no INT4 modules"),
            false => Outcome::from_findings("no INT4 modules", findings),
        };
    }
    let group = group_size(context);
    // Both engines allocate the experts' scales in the model dtype and their weight loaders copy (cast) what the
    // file holds, so F16 and F32 scales load too (rounded to the model dtype): vLLM 0.32
    // compressed_tensors_moe_wna16.py `create_weights`; SGLang 0.5.23 compressed_tensors_wNa16_moe.py
    // `CompressedTensorsWNA16MoE.create_weights` (`params_dtype`), fused_moe_triton/layer.py `FusedMoE._load_w13` /
    // `_load_w2` (`copy_`). Zero points of an asymmetric group load in vLLM; SGLang 0.5.23 copies them without the
    // transpose its other compressed-tensors expert tensors get (`FusedMoE._weight_loader_impl` skips names with
    // `zero`): compressed-tensors' [out/8, groups] into its [groups, out/8] parameter.
    let vllm = engine == Engine::Vllm;
    let asymmetric = super::config::int4_group_weights(context)
        .is_some_and(|(_, weights)| weights.get("symmetric") == Some(&serde_json::Value::Bool(false)));
    let mut zero_point_reported = false;
    let mut values_checked = false;
    for module in &modules {
        let tensor = |suffix: &str| context.tensors.get(format!("{module}.{suffix}").as_str()).copied();
        let name = |suffix: &str| format!("{module}.{suffix}");
        let requantize = "requantize the module with squeeze quantize";
        let Some([rows, columns]) = module_dims(context, module, &mut findings) else { continue };
        // weight_packed: I32 [out, ceil(in/8)]
        match tensor("weight_packed") {
            Some(packed) if packed.dtype == Dtype::I32 && packed.shape == [rows, packed_columns(columns)] => {}
            Some(packed) => findings.push(Finding::failed(
                name("weight_packed"),
                format!(
                    "is {} {:?}, expected I32 [{rows}, {}] for weight_shape [{rows}, {columns}]",
                    packed.dtype,
                    packed.shape,
                    packed_columns(columns)
                ),
                requantize,
            )),
            None => findings.push(Finding::failed(name("weight_packed"), "missing", requantize)),
        }
        // weight_scale: BF16 [out, ceil(in/g)], finite and positive
        values_checked |= check_weight_scale(context, module, [rows, columns], group, &mut findings);
        // (A leftover `weight_scale_inv` is reported by the output-wide check above.)
        if let Some(zero_point) = tensor("weight_zero_point") {
            if !asymmetric {
                findings.push(Finding::failed(
                    name("weight_zero_point"),
                    "a zero point in a symmetric scheme",
                    "remove it",
                ));
            } else if !vllm && !zero_point_reported {
                // Once per output: every zero point of the folder has the same layout.
                zero_point_reported = true;
                findings.push(Finding::failed(
                    name("weight_zero_point"),
                    format!(
                        "is {} {:?} (compressed-tensors: [out/8, groups]); SGLang 0.5.23 loads it untransposed into \
                         its [groups, out/8] parameter and converts it as AWQ-interleaved \
                         (FusedMoE._weight_loader_impl, moe_awq_to_marlin_zero_points): a shape-mismatch error, or \
                         wrong zero points (every zero point of this output has this layout)",
                        zero_point.dtype, zero_point.shape
                    ),
                    "serve this folder with vLLM, or requantize symmetric (squeeze quantize writes symmetric INT4)",
                ));
            }
        }
        if tensor("weight").is_some() {
            findings.push(Finding::failed(
                name("weight"),
                "a leftover unquantized/FP8 `weight` next to weight_packed",
                "remove it",
            ));
        }
    }
    let values = if values_checked { "values checked" } else { "values not known before writing" };
    Outcome::from_findings(format!("{} INT4 modules ({values})", modules.len()), findings)
}

/// An INT4 module's `[out, in]` from its `weight_shape` (I64 `[2]`, positive), or `None` with the finding that
/// says why not.
fn module_dims(context: &Context, module: &str, findings: &mut Vec<Finding>) -> Option<[usize; 2]> {
    let name = |suffix: &str| format!("{module}.{suffix}");
    let requantize = "requantize the module with squeeze quantize";
    let Some(shape) = context.tensors.get(name("weight_shape").as_str()).copied() else {
        findings.push(Finding::failed(name("weight_shape"), "missing", requantize));
        return None;
    };
    match shape.dtype {
        Dtype::I64 => {}
        Dtype::I32 => findings.push(Finding::warning(
            name("weight_shape"),
            "is I32; vLLM declares it int64 (I32 loads, transformers 5.24 reads it cleanly)",
            "write I64 (squeeze quantize does)",
        )),
        other => {
            findings.push(Finding::failed(name("weight_shape"), format!("is {other}, expected I64"), requantize));
            return None;
        }
    }
    if shape.shape != [2] {
        findings.push(Finding::failed(
            name("weight_shape"),
            format!("has shape {:?}, expected [2] = [out, in]", shape.shape),
            requantize,
        ));
        return None;
    }
    Some(match &shape.values {
        Some(Values::Ints(values)) if values.len() == 2 && values.iter().all(|v| *v > 0) => {
            [values[0] as usize, values[1] as usize]
        }
        Some(values) => {
            findings.push(Finding::failed(
                name("weight_shape"),
                format!("holds {values:?}, expected two positive sizes"),
                requantize,
            ));
            return None;
        }
        None => {
            findings.push(Finding::failed(name("weight_shape"), "values unknown", requantize));
            return None;
        }
    })
}

/// Checks an INT4 module's `weight_scale` (a dtype the engines load, `[out, in/group]`, finite and positive values);
/// returns whether its values were known.
fn check_weight_scale(
    context: &Context,
    module: &str,
    [rows, columns]: [usize; 2],
    group: Option<usize>,
    findings: &mut Vec<Finding>,
) -> bool {
    let tensor = |suffix: &str| context.tensors.get(format!("{module}.{suffix}").as_str()).copied();
    let name = |suffix: &str| format!("{module}.{suffix}");
    let requantize = "requantize the module with squeeze quantize";
    let mut values_checked = false;
    match tensor("weight_scale") {
        None => findings.push(Finding::failed(name("weight_scale"), "missing", requantize)),
        Some(scale) => {
            let expected_shape = group.map(|g| vec![rows, columns.div_ceil(g)]);
            let dtype_loads = matches!(scale.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32);
            if !dtype_loads || expected_shape.as_ref().is_some_and(|s| *s != scale.shape) {
                findings.push(Finding::failed(
                    name("weight_scale"),
                    format!(
                        "is {} {:?}, expected BF16/F16/F32 {}",
                        scale.dtype,
                        scale.shape,
                        expected_shape.map_or("[out, in/group_size]".to_string(), |s| format!("{s:?}"))
                    ),
                    requantize,
                ));
            }
            if let Some(Values::Floats { first_bad, .. }) = &scale.values {
                values_checked = true;
                if let Some((index, value)) = first_bad {
                    findings.push(Finding::failed(
                        name("weight_scale"),
                        format!("scale {index} is {value}, expected finite and > 0"),
                        requantize,
                    ));
                }
            }
        }
    }
    values_checked
}

/// The layout of the config's KV cache, as [`crate::engines`] distinguishes them.
fn cache_layout(context: &Context) -> CacheLayout {
    match (context.is_mla(), context.config.get("index_topk").is_some_and(|v| !v.is_null())) {
        (false, _) => CacheLayout::Gqa,
        (true, false) => CacheLayout::Mla,
        (true, true) => CacheLayout::MlaSparse,
    }
}

/// The decoder layer of `name` and the rest after `model.layers.N.` (the suffix the engines' loaders match), by the
/// text model's name inside a vision-language wrapper.
fn layer_suffix(name: &str) -> Option<(usize, String)> {
    let text = crate::io::composite::text_name(name).unwrap_or_else(|| name.to_string());
    let (layer, suffix) = text.strip_prefix("model.layers.")?.split_once('.')?;
    Some((layer.parse().ok()?, suffix.to_string()))
}

/// KV-scale tensors: known names, F32 per-tensor, finite > 0; and for an engine that divides by the checkpoint's
/// scales, present under the names that engine loads ([`kv_scale_handling`]), else its cache silently uses 1.0.
pub fn kv_scales(context: &Context, engine: Engine) -> Outcome {
    let scales = kv_scale_names(context);
    if scales.is_empty() {
        return Outcome::skipped("no KV-scale tensors");
    }
    let layout = cache_layout(context);
    let handling = kv_scale_handling(engine, layout);
    let known: Vec<&str> = kv_scale_names_for(&Engine::ALL, layout).into_iter().flat_map(|(k, v)| [k, v]).collect();
    let remedy = "rewrite them with `squeeze calibrate-kv --engine all` (F32 [1] per layer under every engine's names)";
    let mut findings = Vec::new();
    let mut layers = std::collections::BTreeSet::new();
    for name in &scales {
        let Some(tensor) = context.tensors.get(name) else { continue };
        match layer_suffix(name) {
            Some((layer, suffix)) if known.contains(&suffix.as_str()) => {
                layers.insert(layer);
            }
            _ => findings.push(Finding::failed(
                *name,
                "is not a KV-scale name any engine loads: vLLM remaps and drops it (\"… is not loaded\"), SGLang skips \
                 it; the cache then uses scale 1.0",
                remedy,
            )),
        }
        if tensor.dtype != Dtype::F32 {
            findings.push(Finding::failed(*name, format!("is {}, expected F32", tensor.dtype), remedy));
        }
        if tensor.shape.iter().product::<usize>() != 1 || tensor.shape.len() > 1 {
            findings.push(Finding::failed(
                *name,
                format!("has shape {:?}: vLLM and SGLang take per-tensor scales only ([1] or [])", tensor.shape),
                "recalibrate with squeeze calibrate-kv --strategy tensor",
            ));
        }
        if let Some(Values::Floats { first_bad: Some((index, value)), .. }) = &tensor.values {
            findings.push(Finding::failed(*name, format!("value {index} is {value}, expected finite and > 0"), remedy));
        }
    }
    match handling.uses {
        ScaleUse::Checkpoint => {
            for layer in &layers {
                for suffix in &handling.loads {
                    let name = format!("model.layers.{layer}.{suffix}");
                    let stored = crate::io::composite::stored_name(&name, context.name_style);
                    if !context.tensors.contains_key(stored.as_str()) {
                        findings.push(Finding::failed(
                            name,
                            format!(
                                "is missing: {} {}; without it the layer's cache uses scale 1.0",
                                engine.label(),
                                handling.summary
                            ),
                            format!("rerun `squeeze calibrate-kv --engine {}` (or all)", engine.name()),
                        ));
                    }
                }
            }
        }
        ScaleUse::Unit | ScaleUse::DynamicTiles | ScaleUse::PowerOfTwoTiles => findings.push(Finding::warning(
            "model.layers.*.self_attn (MLA)",
            format!("{} {}", engine.label(), handling.summary),
            "measure what the engine's scales cost with `squeeze eval --kv-scales engine` before serving FP8 KV",
        )),
    }
    Outcome::from_findings(format!("{} KV-scale tensors", scales.len()), findings).with_source(handling.source)
}
