//! The rules on tensors: each INT4 module's packed weight, scale and shape (dtypes, shapes, values) with no FP8
//! leftovers, and the KV-scale tensors' names, dtypes and values.

use regex::Regex;

use super::config::{group_size, kv_scale_names};
use crate::io::dtype::Dtype;
use crate::lint::context::{Context, Stored};
use crate::lint::engine::Engine;
use crate::lint::output::Values;
use crate::lint::report::{Finding, Outcome};
use crate::quant::pack::packed_columns;

pub fn int4_tensors(context: &Context, _: Engine) -> Outcome {
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
    let mut values_checked = false;
    for module in &modules {
        let tensor = |suffix: &str| context.tensors.get(format!("{module}.{suffix}").as_str()).copied();
        let name = |suffix: &str| format!("{module}.{suffix}");
        let requantize = "requantize the module with squeeze quantize";
        // weight_shape: [out, in]
        let Some(shape) = tensor("weight_shape") else {
            findings.push(Finding::failed(name("weight_shape"), "missing", requantize));
            continue;
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
                continue;
            }
        }
        if shape.shape != [2] {
            findings.push(Finding::failed(
                name("weight_shape"),
                format!("has shape {:?}, expected [2] = [out, in]", shape.shape),
                requantize,
            ));
            continue;
        }
        let dims = match &shape.values {
            Some(Values::Ints(values)) if values.len() == 2 && values.iter().all(|v| *v > 0) => {
                [values[0] as usize, values[1] as usize]
            }
            Some(values) => {
                findings.push(Finding::failed(
                    name("weight_shape"),
                    format!("holds {values:?}, expected two positive sizes"),
                    requantize,
                ));
                continue;
            }
            None => {
                findings.push(Finding::failed(name("weight_shape"), "values unknown", requantize));
                continue;
            }
        };
        let [rows, columns] = dims;
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
        match tensor("weight_scale") {
            None => findings.push(Finding::failed(name("weight_scale"), "missing", requantize)),
            Some(scale) => {
                let expected_shape = group.map(|g| vec![rows, columns.div_ceil(g)]);
                if scale.dtype != Dtype::BF16 || expected_shape.as_ref().is_some_and(|s| *s != scale.shape) {
                    findings.push(Finding::failed(
                        name("weight_scale"),
                        format!(
                            "is {} {:?}, expected BF16 {}",
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
        // (A leftover `weight_scale_inv` is reported by the output-wide check above.)
        for (suffix, problem) in [
            ("weight_zero_point", "a zero point in a symmetric scheme"),
            ("weight", "a leftover unquantized/FP8 `weight` next to weight_packed"),
        ] {
            if tensor(suffix).is_some() {
                findings.push(Finding::failed(name(suffix), problem, "remove it"));
            }
        }
    }
    let values = if values_checked { "values checked" } else { "values not known before writing" };
    Outcome::from_findings(format!("{} INT4 modules ({values})", modules.len()), findings)
}

/// The KV-scale tensor names the engines load (anchored regexes). vLLM 0.32 and SGLang 0.5.23 load
/// `model.layers.N.self_attn.{k,v}_scale` for GQA layers (REFERENCES §9); change this list when an engine does.
pub const ALLOWED_KV_SCALE_NAMES: [&str; 2] =
    [r"^model\.layers\.\d+\.self_attn\.k_scale$", r"^model\.layers\.\d+\.self_attn\.v_scale$"];

pub fn kv_scales(context: &Context, engine: Engine) -> Outcome {
    let scales = kv_scale_names(context);
    if scales.is_empty() {
        return Outcome::skipped("no KV-scale tensors");
    }
    let allowed: Vec<Regex> = ALLOWED_KV_SCALE_NAMES.iter().filter_map(|p| Regex::new(p).ok()).collect();
    let mut findings = Vec::new();
    for name in &scales {
        let Some(tensor) = context.tensors.get(name) else { continue };
        let remedy = "write model.layers.N.self_attn.k_scale/v_scale as F32 [1] (squeeze calibrate-kv does)";
        if !allowed.iter().any(|re| re.is_match(name)) {
            findings.push(Finding::failed(
                *name,
                "is not a KV-scale name the engines load: vLLM remaps it and drops it with \"… is not loaded\", \
                 SGLang skips it (\"not found in params_dict\"); the cache then uses scale 1.0",
                remedy,
            ));
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
    if findings.is_empty() && context.is_mla() {
        let (problem, source) = match engine {
            Engine::Vllm => (
                "MLA layers of a compressed-tensors checkpoint get no KV-scale parameter in vLLM 0.32: the FP8 \
                 latent cache uses scale 1.0 whatever the file holds",
                "vLLM compressed_tensors.py get_quant_method (Attention only, not MLAAttention)",
            ),
            Engine::Sglang => (
                "SGLang's CUDA MLA pool casts to FP8 without a scale and DSA caches use dynamic per-block scales: the \
                 file's scales are loaded but unused",
                "SGLang memory_pool.py _write_mla_kv_buffer",
            ),
        };
        findings.push(Finding::warning(
            "model.layers.*.self_attn (MLA)",
            problem,
            "measure what scale 1.0 costs with squeeze eval before serving FP8 KV",
        ));
        return Outcome::from_findings(format!("{} KV-scale tensors", scales.len()), findings).with_source(source);
    }
    Outcome::from_findings(format!("{} KV-scale tensors", scales.len()), findings)
}
