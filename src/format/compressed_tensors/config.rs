//! The compressed-tensors `quantization_config` of `config.json`: written from a [`QuantizationScheme`] (INT4
//! `pack-quantized` group, optional FP8 `float-quantized` block group, `ignore`) and read back for its INT4 group size.

use serde_json::{json, Value};

/// The INT4 group of an output.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Group {
    pub group_size: usize,
    /// The compressed-tensors observer name of the scale rule (`minmax`, `mse`).
    pub observer: &'static str,
    /// `Linear`, or `re:` patterns when an FP8 group is present too.
    pub targets: Vec<String>,
    /// W4A8: FP8 activations quantized per token at run time (vLLM `CompressedTensorsW4A8Fp8MoEMethod`, SGLang
    /// `CompressedTensorsW4AFP8MoE`); the weights are the same.
    pub fp8_activations: bool,
}

/// An FP4 group of an output: NVFP4 or MXFP4, weights only (W4A16).
#[derive(Debug, Clone, PartialEq)]
pub struct Fp4Group {
    pub kind: super::Fp4Kind,
    /// W4A4: NVFP4 activations too (compressed-tensors' preset `NVFP4`), else weights only (`NVFP4A16`/`MXFP4A16`).
    pub fp4_activations: bool,
    /// `re:` patterns of the modules it quantizes.
    pub targets: Vec<String>,
}

/// What an output's `quantization_config` declares.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizationScheme {
    /// The INT4 `pack-quantized` group (`group_0`), if any module is INT4.
    pub int4: Option<Int4Group>,
    /// The FP4 groups, one per kind used, after the INT4 one.
    pub fp4: Vec<Fp4Group>,
    /// Whether FP8 modules are kept: a `float-quantized` block 128×128 group after the INT4 one.
    pub fp8_block: bool,
    /// Modules the engines must leave unquantized.
    pub ignore: Vec<String>,
}

/// The `quantization_config` JSON of a scheme; `format` is `pack-quantized`, `float-quantized` or
/// `mixed-precision` by the groups present.
pub fn quantization_config(scheme: &QuantizationScheme) -> Value {
    let mut groups = serde_json::Map::new();
    if let Some(int4) = &scheme.int4 {
        groups.insert(
            "group_0".into(),
            json!({
                "targets": int4.targets,
                "weights": {
                    "num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": int4.group_size,
                    "dynamic": false, "observer": int4.observer, "actorder": null, "block_structure": null
                },
                "input_activations": if int4.fp8_activations {
                    json!({
                        "num_bits": 8, "type": "float", "symmetric": true, "strategy": "token", "dynamic": true,
                        "observer": null, "group_size": null
                    })
                } else {
                    Value::Null
                },
                "output_activations": null,
                "format": "pack-quantized"
            }),
        );
    }
    for group in &scheme.fp4 {
        // compressed-tensors 0.20.1's presets NVFP4A16 / MXFP4A16 / NVFP4 (`quantization/quant_scheme.py`),
        // serialized as its QuantizationConfig writes them; vLLM takes NVFP4 activations for tensor_group, 4-bit,
        // float, symmetric, group 16 (`compressed_tensors.py` `_is_nvfp4_format`) and reads no other field.
        let (strategy, scale_dtype) = match group.kind {
            super::Fp4Kind::Nvfp4 => ("tensor_group", "torch.float8_e4m3fn"),
            super::Fp4Kind::Mxfp4 => ("group", "torch.uint8"),
        };
        groups.insert(
            format!("group_{}", groups.len()),
            json!({
                "targets": group.targets,
                "weights": {
                    "num_bits": 4, "type": "float", "symmetric": true, "strategy": strategy,
                    "group_size": group.kind.group(), "dynamic": false, "observer": "minmax",
                    "scale_dtype": scale_dtype, "actorder": null, "block_structure": null
                },
                "input_activations": if group.fp4_activations {
                    json!({
                        "num_bits": 4, "type": "float", "symmetric": true, "strategy": "tensor_group",
                        "group_size": group.kind.group(), "dynamic": "local", "observer": "static_minmax",
                        "scale_dtype": scale_dtype, "actorder": null, "block_structure": null
                    })
                } else {
                    Value::Null
                },
                "output_activations": null,
                "format": group.kind.format()
            }),
        );
    }
    if scheme.fp8_block {
        groups.insert(
            format!("group_{}", groups.len()),
            json!({
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8, "type": "float", "symmetric": true, "strategy": "block", "block_structure": [128, 128],
                    "dynamic": false, "observer": "minmax", "group_size": null, "actorder": null
                },
                "input_activations": {
                    "num_bits": 8, "type": "float", "symmetric": true, "strategy": "group", "group_size": 128, "dynamic": true, "observer": null
                },
                "output_activations": null,
                "format": "float-quantized"
            }),
        );
    }
    let formats = usize::from(scheme.int4.is_some()) + scheme.fp4.len() + usize::from(scheme.fp8_block);
    let format = if formats > 1 {
        "mixed-precision"
    } else if scheme.fp8_block {
        "float-quantized"
    } else if let Some(group) = scheme.fp4.first() {
        group.kind.format()
    } else {
        "pack-quantized"
    };
    json!({
        "quant_method": "compressed-tensors",
        "format": format,
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": scheme.ignore,
        "kv_cache_scheme": null
    })
}

/// The INT4 group size from a compressed-tensors `quantization_config` (the first group with 4-bit integer
/// weights).
pub fn int4_group_size(config: Option<&Value>) -> Option<usize> {
    let groups = crate::io::composite::quantization_config(config?)?.get("config_groups")?.as_object()?;
    groups.values().find_map(|group| {
        let weights = group.get("weights")?;
        let int = weights.get("type").and_then(Value::as_str).is_none_or(|kind| kind == "int");
        (weights.get("num_bits")?.as_u64()? == 4 && int)
            .then(|| weights.get("group_size")?.as_u64().map(|g| g as usize))?
    })
}

/// The keys of a compressed-tensors `QuantizationArgs` (0.20.1 `quantization/quant_args.py`, which forbids any
/// other: `ConfigDict(extra="forbid")`).
const WEIGHT_ARGS_KEYS: [&str; 12] = [
    "num_bits",
    "type",
    "symmetric",
    "group_size",
    "strategy",
    "block_structure",
    "dynamic",
    "actorder",
    "scale_dtype",
    "zp_dtype",
    "observer",
    "observer_kwargs",
];

/// What an INT4 `pack-quantized` group declares about its stored weights, as squeeze reads them: squeeze's own
/// outputs (symmetric, group, no activation order) and the other writers' (llm-compressor, GPTQModel, AutoRound,
/// published releases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int4Args {
    /// Columns per scale; `None`: `strategy: channel`, one scale per output row.
    pub group_size: Option<usize>,
    /// `symmetric: false`: a packed `weight_zero_point` per scale, `w = (q − z) · s`.
    pub symmetric: bool,
    /// `actorder: group` or `dynamic`: columns map to groups through a `weight_g_idx` (older llm-compressor GPTQ
    /// with activation order; compressed-tensors 0.20 and vLLM 0.32 no longer load it). `weight`/`static` change
    /// only how GPTQ ran, not the layout.
    pub g_idx: bool,
    /// W4A8: the group's `input_activations` are FP8 quantized per token at run time ([`is_w4a8_activations`]);
    /// the weights are the same, the engines compute with them differently ([`crate::quant::w4a8`]).
    pub fp8_activations: bool,
}

impl Int4Args {
    /// squeeze's own layout: symmetric groups of `group_size`, no `g_idx`, weights only (W4A16).
    pub fn group(group_size: usize) -> Self {
        Self { group_size: Some(group_size), symmetric: true, g_idx: false, fp8_activations: false }
    }

    /// The columns one scale covers in a weight of `columns` columns.
    pub fn group_of(&self, columns: usize) -> usize {
        self.group_size.unwrap_or(columns).max(1)
    }
}

/// FP8 activations quantized per token at run time, symmetric: what vLLM's `_is_fp8_w4a8` (`compressed_tensors.py`)
/// takes beside INT4 group weights (W4A8).
pub fn is_w4a8_activations(activations: &Value) -> bool {
    activations.get("type") == Some(&json!("float"))
        && activations.get("num_bits") == Some(&json!(8))
        && activations.get("strategy") == Some(&json!("token"))
        && activations.get("dynamic") == Some(&json!(true))
        && activations.get("symmetric") == Some(&json!(true))
}

/// The INT4 weight arguments of a compressed-tensors `quantization_config` (the first group with 4-bit integer
/// weights), checked: `Ok(None)` when no group is INT4; an error naming the `config_groups.<group>.weights.<field>`
/// squeeze does not read (a key compressed-tensors does not define, a strategy other than `group`/`channel`,
/// dynamic weights, an unknown `actorder` or `scale_dtype`), or `input_activations` other than none (W4A16) and
/// FP8 per token (W4A8), which the runtime could not emulate.
pub fn int4_args(config: Option<&Value>) -> Result<Option<Int4Args>, String> {
    let Some(groups) = config
        .and_then(crate::io::composite::quantization_config)
        .and_then(|q| q.get("config_groups"))
        .and_then(Value::as_object)
    else {
        return Ok(None);
    };
    let found = groups.iter().find_map(|(name, group)| {
        let weights = group.get("weights")?;
        let int = weights.get("type").and_then(Value::as_str).is_none_or(|kind| kind == "int");
        (weights.get("num_bits")?.as_u64()? == 4 && int).then_some((name, group, weights))
    });
    let Some((name, group, weights)) = found else { return Ok(None) };
    let fp8_activations = match group.get("input_activations") {
        None | Some(Value::Null) => false,
        Some(activations) if is_w4a8_activations(activations) => true,
        Some(other) => {
            return Err(format!(
                "config.json quantization_config.config_groups.{name}.input_activations: is {other}; squeeze reads \
                 INT4 weights with unquantized inputs (null: W4A16) or FP8 inputs quantized per token (W4A8: type \
                 float, num_bits 8, strategy token, dynamic true, symmetric true), and would score any other as \
                 the engines do not run it"
            ))
        }
    };
    let field = |key: &str| format!("config.json quantization_config.config_groups.{name}.weights.{key}");
    let fix = "squeeze reads compressed-tensors INT4 pack-quantized weights: static, strategy group or channel";
    if let Some(key) =
        weights.as_object().into_iter().flatten().map(|(k, _)| k).find(|k| !WEIGHT_ARGS_KEYS.contains(&k.as_str()))
    {
        return Err(format!("{}: is not a compressed-tensors quantization field; {fix}", field(key)));
    }
    let shown = |key: &str| weights.get(key).map_or("missing".to_string(), Value::to_string);
    // compressed-tensors' `validate_model_after` (quant_args.py): no strategy means group for a positive
    // group_size, channel for −1 (and tensor without one, which pack-quantized INT4 does not store).
    let size = weights.get("group_size").filter(|g| !g.is_null());
    let strategy = match weights.get("strategy").filter(|s| !s.is_null()) {
        None => match size.and_then(Value::as_i64) {
            Some(-1) => Some("channel"),
            Some(_) => Some("group"),
            None => None,
        },
        Some(strategy) => strategy.as_str(),
    };
    let group_size = match (strategy, size) {
        (Some("group"), Some(size)) => match size.as_u64() {
            Some(size) if size >= 1 => Some(size as usize),
            _ => return Err(format!("{}: is {size}, expected a positive integer", field("group_size"))),
        },
        (Some("group"), None) => return Err(format!("{}: missing for strategy group", field("group_size"))),
        (Some("channel"), _) => None,
        _ => {
            return Err(format!(
                "{}: is {}, expected \"group\" or \"channel\"; {fix}",
                field("strategy"),
                shown("strategy")
            ))
        }
    };
    let symmetric = match weights.get("symmetric") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(symmetric)) => *symmetric,
        Some(other) => return Err(format!("{}: is {other}, expected true or false", field("symmetric"))),
    };
    match weights.get("dynamic") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(other) => {
            return Err(format!("{}: is {other}, expected false (stored weights are static); {fix}", field("dynamic")))
        }
    }
    // compressed-tensors `ActivationOrdering` (quant_args.py): weight/static, and the removed group/dynamic.
    let g_idx = match weights.get("actorder") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(order)) if matches!(order.as_str(), "weight" | "static") => false,
        Some(Value::String(order)) if matches!(order.as_str(), "group" | "dynamic") => true,
        Some(other) => {
            return Err(format!(
                "{}: is {other}, expected null, \"weight\", \"static\", \"group\" or \"dynamic\"",
                field("actorder")
            ))
        }
    };
    // The scale dtype is the stored tensor's; a declared one must be one of the three squeeze reads.
    match weights.get("scale_dtype") {
        None | Some(Value::Null) => {}
        Some(Value::String(dtype))
            if matches!(dtype.as_str(), "torch.bfloat16" | "torch.float16" | "torch.float32") => {}
        Some(other) => {
            return Err(format!(
                "{}: is {other}, expected torch.bfloat16, torch.float16 or torch.float32 (the INT4 scale dtypes \
                 compressed-tensors and vLLM load)",
                field("scale_dtype")
            ))
        }
    }
    match weights.get("zp_dtype") {
        None | Some(Value::Null) => {}
        Some(Value::String(dtype)) if matches!(dtype.as_str(), "torch.int8" | "torch.int32") => {}
        Some(other) => {
            return Err(format!(
                "{}: is {other}, expected torch.int8 (INT4 zero points are integers)",
                field("zp_dtype")
            ))
        }
    }
    Ok(Some(Int4Args { group_size, symmetric, g_idx, fp8_activations }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(weights: Value) -> Value {
        json!({"quantization_config": {"quant_method": "compressed-tensors",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}})
    }

    #[test]
    fn int4_args_read_what_compressed_tensors_writes_and_name_what_they_do_not() {
        let read = |weights: Value| int4_args(Some(&config(weights)));
        let squeeze = json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32,
            "dynamic": false, "observer": "minmax", "actorder": null, "block_structure": null});
        assert_eq!(read(squeeze), Ok(Some(Int4Args::group(32))));
        // llm-compressor's asymmetric, act-ordered, channel-wise; the strategy inferred as compressed-tensors does.
        let asym = json!({"num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": false,
            "zp_dtype": "torch.int8", "actorder": "weight", "scale_dtype": "torch.float32", "observer_kwargs": {}});
        assert_eq!(
            read(asym),
            Ok(Some(Int4Args { group_size: Some(128), symmetric: false, g_idx: false, fp8_activations: false }))
        );
        let channel = Int4Args { group_size: None, symmetric: true, g_idx: false, fp8_activations: false };
        assert_eq!(read(json!({"num_bits": 4, "strategy": "channel"})), Ok(Some(channel)));
        assert_eq!(read(json!({"num_bits": 4, "group_size": -1})), Ok(Some(channel)));
        let g_idx = read(json!({"num_bits": 4, "group_size": 64, "actorder": "group"}));
        assert_eq!(
            g_idx,
            Ok(Some(Int4Args { group_size: Some(64), symmetric: true, g_idx: true, fp8_activations: false }))
        );
        assert_eq!(read(json!({"num_bits": 8, "group_size": 64})), Ok(None));
        let key = "config.json quantization_config.config_groups.group_0.weights";
        for (weights, expected) in [
            (json!({"num_bits": 4, "group_size": 32, "zero_point_bits": 4}), format!("{key}.zero_point_bits: is not")),
            (json!({"num_bits": 4, "strategy": "tensor"}), format!("{key}.strategy: is \"tensor\"")),
            (json!({"num_bits": 4, "strategy": "group"}), format!("{key}.group_size: missing")),
            (json!({"num_bits": 4, "group_size": 32, "actorder": "random"}), format!("{key}.actorder: is \"random\"")),
            (json!({"num_bits": 4, "group_size": 32, "dynamic": true}), format!("{key}.dynamic: is true")),
            (
                json!({"num_bits": 4, "group_size": 32, "scale_dtype": "torch.float8_e4m3fn"}),
                format!("{key}.scale_dtype: is"),
            ),
            (json!({"num_bits": 4, "group_size": 32, "zp_dtype": "torch.float16"}), format!("{key}.zp_dtype: is")),
        ] {
            let error = read(weights).unwrap_err();
            assert!(error.starts_with(&expected), "expected `{expected}`, got `{error}`");
        }
    }

    #[test]
    fn int4_args_read_w4a8_activations_and_refuse_other_input_quantization() {
        let with_inputs = |activations: Value| {
            let weights =
                json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128});
            int4_args(Some(&json!({"quantization_config": {"config_groups": {"group_0": {
                "targets": ["Linear"], "weights": weights, "input_activations": activations}}}})))
        };
        let w4a8 = json!({"num_bits": 8, "type": "float", "symmetric": true, "strategy": "token", "dynamic": true});
        assert_eq!(with_inputs(w4a8), Ok(Some(Int4Args { fp8_activations: true, ..Int4Args::group(128) })));
        assert_eq!(with_inputs(Value::Null), Ok(Some(Int4Args::group(128))));
        let int8 = json!({"num_bits": 8, "type": "int", "symmetric": true, "strategy": "token", "dynamic": true});
        let error = with_inputs(int8).unwrap_err();
        assert!(
            error.starts_with("config.json quantization_config.config_groups.group_0.input_activations: is"),
            "{error}"
        );
    }
}
