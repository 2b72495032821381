//! The rules on FP4 outputs (NVFP4, MXFP4: [`crate::format::compressed_tensors::fp4`]), squeeze's or anyone's: the
//! config group's weight arguments as vLLM detects the formats, each module's tensors, and one NVFP4 global scale
//! for each fused gate/up pair.

use serde_json::{json, Value};

use crate::engines::lint::context::{Context, Stored};
use crate::engines::lint::output::Values;
use crate::engines::lint::report::{Finding, Outcome};
use crate::engines::Engine;
use crate::format::compressed_tensors::{fused_partner, Fp4Kind};
use crate::io::dtype::Dtype;

const NO_FP4: &str = "no FP4 modules (U8 weight_packed)";
const REQUANTIZE: &str = "requantize the module with squeeze quantize";

/// The FP4 modules with their kind (a `weight_global_scale` beside them: NVFP4).
fn fp4_modules<'a>(context: &Context<'a>) -> Vec<(&'a str, Fp4Kind)> {
    context
        .modules
        .iter()
        .filter(|(_, stored)| **stored == Stored::Fp4)
        .map(|(module, _)| {
            let nvfp4 = context.tensors.contains_key(format!("{module}.weight_global_scale").as_str());
            (*module, if nvfp4 { Fp4Kind::Nvfp4 } else { Fp4Kind::Mxfp4 })
        })
        .collect()
}

/// The config format an FP4 output declares: its kind's, or `mixed-precision` beside other groups.
pub fn expected_format(context: &Context) -> Option<&'static str> {
    let kinds: std::collections::BTreeSet<&'static str> =
        fp4_modules(context).iter().map(|(_, kind)| kind.format()).collect();
    match (kinds.len(), context.groups.len()) {
        (0, _) => None,
        (1, 1) => kinds.into_iter().next(),
        _ => Some("mixed-precision"),
    }
}

/// The FP4 config groups' weights as vLLM 0.32 detects them (`compressed_tensors.py` `_is_nvfp4_format`,
/// `_is_mxfp4`): float, 4 bits, symmetric, static, `tensor_group` 16 (NVFP4) or `group` 32 (MXFP4), weights only.
pub fn fp4_weight_args(context: &Context, _: Engine) -> Outcome {
    if fp4_modules(context).is_empty() {
        return Outcome::skipped(NO_FP4);
    }
    let groups: Vec<_> = context
        .groups
        .iter()
        .filter(|g| g.json.pointer("/weights/type").and_then(Value::as_str) == Some("float"))
        .filter(|g| g.json.pointer("/weights/num_bits").and_then(Value::as_u64) == Some(4))
        .collect();
    if groups.is_empty() {
        return Outcome::from_findings(
            "",
            vec![Finding::failed(
                "quantization_config.config_groups",
                "FP4 tensors exist but no group declares float 4-bit weights",
                "write the config as squeeze quantize does (compressed-tensors' NVFP4A16 / MXFP4A16 presets)",
            )],
        );
    }
    let mut findings = Vec::new();
    let mut detail = Vec::new();
    for group in groups {
        let key = |name: &str| format!("quantization_config.config_groups.{}.weights.{name}", group.name);
        let weights = &group.json["weights"];
        let kind = match (weights.get("strategy").and_then(Value::as_str), weights.get("group_size")) {
            (Some("tensor_group"), Some(size)) if size == 16 => Fp4Kind::Nvfp4,
            (Some("group"), Some(size)) if size == 32 => Fp4Kind::Mxfp4,
            (strategy, size) => {
                findings.push(Finding::failed(
                    key("strategy"),
                    format!(
                        "strategy {strategy:?} with group_size {}: vLLM loads FP4 as tensor_group 16 (NVFP4) or \
                         group 32 (MXFP4) only",
                        size.map_or("null".into(), Value::to_string)
                    ),
                    REQUANTIZE,
                ));
                continue;
            }
        };
        detail.push(format!("{}: {}", group.name, kind.name()));
        for (name, expected) in [("symmetric", json!(true)), ("dynamic", json!(false))] {
            if weights.get(name) != Some(&expected) {
                findings.push(Finding::failed(
                    key(name),
                    format!("is {}, expected {expected}", weights.get(name).map_or("missing".into(), Value::to_string)),
                    format!("set it to {expected}: vLLM's FP4 methods take symmetric static weights only"),
                ));
            }
        }
        let activations = group.json.get("input_activations").filter(|v| !v.is_null());
        if let Some(activations) = activations {
            findings.extend(w4a4_findings(context, group.name, kind, activations));
            if let Some(last) = detail.last_mut() {
                last.push_str(" W4A4");
            }
        }
    }
    let w4a4 = context.groups.iter().any(|g| g.json.get("input_activations").is_some_and(|v| !v.is_null()));
    if let (false, Some(module)) = (w4a4, input_scaled(context).first()) {
        findings.push(Finding::warning(
            format!("{module}.input_global_scale"),
            "is present, but no FP4 group declares input_activations: the engines ignore it and serve W4A16",
            "declare the W4A4 input_activations (compressed-tensors' NVFP4 preset), or drop the input_global_scale \
             tensors",
        ));
    }
    Outcome::from_findings(detail.join(", "), findings)
}

/// The FP4 modules that carry an `input_global_scale`.
fn input_scaled<'a>(context: &Context<'a>) -> Vec<&'a str> {
    fp4_modules(context)
        .into_iter()
        .map(|(module, _)| module)
        .filter(|module| context.tensors.contains_key(format!("{module}.input_global_scale").as_str()))
        .collect()
}

/// A group that declares FP4 activations (W4A4): vLLM takes NVFP4 ones only (tensor_group 16, float, 4-bit,
/// symmetric: `compressed_tensors.py` `_is_nvfp4_format`; anything else raises "For NVFP4 weights, input
/// quantization must also be NVFP4 format or None"), and it loads each module's `input_global_scale` into a
/// parameter made with `torch.empty`, so a module without one computes with whatever memory held.
fn w4a4_findings(context: &Context, group: &str, kind: Fp4Kind, activations: &Value) -> Vec<Finding> {
    let key = format!("quantization_config.config_groups.{group}.input_activations");
    let nvfp4 = activations.get("type").and_then(Value::as_str) == Some("float")
        && activations.get("num_bits").and_then(Value::as_u64) == Some(4)
        && activations.get("strategy").and_then(Value::as_str) == Some("tensor_group")
        && activations.get("group_size").and_then(Value::as_u64) == Some(16)
        && activations.get("symmetric").and_then(Value::as_bool) == Some(true);
    if kind != Fp4Kind::Nvfp4 || !nvfp4 {
        return vec![Finding::failed(
            key,
            format!("is {activations}: vLLM takes FP4 activations only as NVFP4 (float 4-bit, tensor_group 16, symmetric) over NVFP4 weights"),
            "write null (weights only), or NVFP4 activations over NVFP4 weights (recipe scheme nvfp4-w4a4)",
        )];
    }
    let scaled = input_scaled(context);
    let missing: Vec<&str> = fp4_modules(context)
        .into_iter()
        .filter(|(module, kind)| *kind == Fp4Kind::Nvfp4 && !scaled.contains(module))
        .map(|(module, _)| module)
        .collect();
    match missing.first() {
        None => Vec::new(),
        Some(first) => vec![Finding::failed(
            format!("{first}.input_global_scale"),
            format!(
                "missing ({} NVFP4 modules have none) while {key} declares W4A4: the engines would quantize their \
                 inputs with an uninitialized scale",
                missing.len()
            ),
            "requantize with squeeze quantize --calibration FILE and an nvfp4-w4a4 recipe",
        )],
    }
}

/// Each FP4 module's tensors: `weight_packed` U8 `[out, in/2]`, `weight_scale` F8_E4M3 `[out, in/16]` with a
/// `weight_global_scale` F32 `[1]` finite and positive (NVFP4) or U8 `[out, in/32]` (MXFP4), no `weight_shape` (vLLM's
/// FP4 loaders have no parameter for it) and no leftover `weight`.
pub fn fp4_tensors(context: &Context, _: Engine) -> Outcome {
    let modules = fp4_modules(context);
    if modules.is_empty() {
        return Outcome::skipped(NO_FP4);
    }
    let mut findings = Vec::new();
    for &(module, kind) in &modules {
        let tensor = |suffix: &str| context.tensors.get(format!("{module}.{suffix}").as_str()).copied();
        let name = |suffix: &str| format!("{module}.{suffix}");
        let Some(packed) = tensor("weight_packed") else { continue };
        let [rows, half] = packed.shape[..] else {
            findings.push(Finding::failed(
                name("weight_packed"),
                format!("has shape {:?}, expected 2-D", packed.shape),
                REQUANTIZE,
            ));
            continue;
        };
        let (scale_dtype, group) = match kind {
            Fp4Kind::Nvfp4 => (Dtype::F8_E4M3, 16),
            Fp4Kind::Mxfp4 => (Dtype::U8, 32),
        };
        let expected = [rows, 2 * half / group];
        match tensor("weight_scale") {
            Some(scale) if scale.dtype == scale_dtype && scale.shape == expected && (2 * half) % group == 0 => {}
            Some(scale) => findings.push(Finding::failed(
                name("weight_scale"),
                format!(
                    "is {} {:?}, expected {scale_dtype} {expected:?} ({} groups of {group})",
                    scale.dtype,
                    scale.shape,
                    kind.name()
                ),
                REQUANTIZE,
            )),
            None => findings.push(Finding::failed(name("weight_scale"), "missing", REQUANTIZE)),
        }
        for suffix in ["weight_global_scale", "input_global_scale"] {
            let Some(global) = tensor(suffix) else { continue };
            if global.dtype != Dtype::F32 || global.shape.iter().product::<usize>() != 1 {
                findings.push(Finding::failed(
                    name(suffix),
                    format!("is {} {:?}, expected F32 [1]", global.dtype, global.shape),
                    REQUANTIZE,
                ));
            } else if let Some(Values::Floats { first_bad: Some((_, value)), .. }) = &global.values {
                findings.push(Finding::failed(
                    name(suffix),
                    format!("is {value}; it divides every scale it governs, so it must be finite and > 0"),
                    REQUANTIZE,
                ));
            }
        }
        for (suffix, problem) in [
            ("weight_shape", "is present: vLLM's FP4 loaders have no weight_shape parameter and fail on it"),
            ("weight", "a leftover unquantized/FP8 `weight` next to weight_packed"),
        ] {
            if tensor(suffix).is_some() {
                findings.push(Finding::failed(name(suffix), problem, "remove it"));
            }
        }
    }
    Outcome::from_findings(format!("{} FP4 modules", modules.len()), findings)
}

/// NVFP4 gate/up pairs share one global scale: vLLM loads them into one fused `w13` with gate's scale and only warns
/// "w1_weight_global_scale must match w3_weight_global_scale" (`compressed_tensors_moe` NVFP4 method), so an up
/// projection quantized under its own scale is served mis-scaled.
pub fn fp4_fused_global_scale(context: &Context, _: Engine) -> Outcome {
    let nvfp4: Vec<&str> =
        fp4_modules(context).into_iter().filter(|(_, kind)| *kind == Fp4Kind::Nvfp4).map(|(m, _)| m).collect();
    if nvfp4.is_empty() {
        return Outcome::skipped("no NVFP4 modules");
    }
    let global = |module: &str| match context.tensors.get(format!("{module}.weight_global_scale").as_str()) {
        Some(tensor) => match &tensor.values {
            Some(Values::Floats { first, .. }) => *first,
            _ => None,
        },
        None => None,
    };
    let (mut pairs, mut unknown) = (0, 0);
    let mut findings = Vec::new();
    for &gate in nvfp4.iter().filter(|m| m.ends_with(".gate_proj")) {
        let Some(up) = fused_partner(&format!("{gate}.weight")) else { continue };
        let up = up.trim_end_matches(".weight");
        if !nvfp4.contains(&up) {
            continue;
        }
        pairs += 1;
        match (global(gate), global(up)) {
            (Some(a), Some(b)) if a.to_bits() != b.to_bits() => findings.push(Finding::failed(
                format!("{gate}.weight_global_scale, {up}.weight_global_scale"),
                format!(
                    "differ ({a} vs {b}): vLLM serves the fused gate/up with one scale (a routed expert's gate scale; \
                     a dense or shared-expert linear's larger one), mis-scaling the other partner"
                ),
                "requantize with squeeze quantize, which gives fused partners one global scale (that of the larger \
                 absmax)",
            )),
            (Some(_), Some(_)) => {}
            _ => unknown += 1,
        }
    }
    let detail = match unknown {
        0 => format!("{pairs} gate/up pairs"),
        _ => format!("{pairs} gate/up pairs ({unknown} with values not known before writing)"),
    };
    Outcome::from_findings(detail, findings)
}

/// What SGLang 0.5.23 needs of FP4 routed experts (vLLM: no rule beyond the tensors'). NVFP4 weights-only MoE
/// (`CompressedTensorsW4A16Nvfp4MoE`, FP4 Marlin) raises ValueError unless `hidden_size % 128 == 0` and
/// `moe_intermediate_size / tp % 64 == 0`. MXFP4 MoE goes to the GPT-OSS `Mxfp4MoEMethod` (`_is_mxfp4_moe`), whose
/// parameters are `w13_weight`/`w2_weight`: the DeepSeek-V2/V3 (Kimi K2.x, GLM-5) and GLM-4.5 loaders rename
/// `weight_packed` to them on NPU only, so on CUDA/ROCm the experts' `weight_packed` are skipped ("not found in
/// params_dict") and serve as zeros — a failure, read in the loader's code, not run.
pub fn fp4_moe_engine(context: &Context, engine: Engine) -> Outcome {
    let experts: Vec<(&str, Fp4Kind)> = fp4_modules(context)
        .into_iter()
        .filter(|(module, _)| crate::model::tensor_class::is_routed_expert(module))
        .collect();
    if experts.is_empty() {
        return Outcome::skipped("no FP4 routed experts");
    }
    if engine == Engine::Vllm {
        return Outcome::passed("vLLM 0.32 loads any shape fp4-tensors accepts");
    }
    let mut findings = Vec::new();
    if let Some((module, _)) = experts.iter().find(|(_, kind)| *kind == Fp4Kind::Mxfp4) {
        findings.push(Finding::failed(
            format!("{module}.weight_packed"),
            "SGLang serves compressed-tensors MXFP4 MoE with its GPT-OSS method, which has no per-expert \
             weight_packed parameter for this architecture: the experts would load as zeros",
            "serve MXFP4 with vLLM (write it with --engine vllm), or use an nvfp4 or int4 recipe for SGLang",
        ));
    }
    if experts.iter().any(|(_, kind)| *kind == Fp4Kind::Nvfp4) {
        let tp = context.tp.max(1);
        match (context.config_usize("hidden_size"), context.config_usize("moe_intermediate_size")) {
            (Ok(hidden), Ok(intermediate)) => {
                if !hidden.is_multiple_of(128) {
                    findings.push(Finding::failed(
                        "config.json `hidden_size`",
                        format!("{hidden} is not a multiple of 128: SGLang's NVFP4 MoE (FP4 Marlin) refuses it"),
                        "serve it with vLLM (--engine vllm), or as INT4 W4A16 (the -int4 recipe)",
                    ));
                }
                if !intermediate.is_multiple_of(tp) || !(intermediate / tp).is_multiple_of(64) {
                    findings.push(Finding::failed(
                        "config.json `moe_intermediate_size`",
                        format!("{intermediate} / tp {tp} is not a multiple of 64: SGLang's NVFP4 MoE refuses it"),
                        "serve with a tp that divides it into multiples of 64, or with vLLM (--engine vllm)",
                    ));
                }
            }
            (h, i) => findings.extend([h.err(), i.err()].into_iter().flatten()),
        }
    }
    Outcome::from_findings(format!("{} FP4 routed experts", experts.len()), findings)
}
