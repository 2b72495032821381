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
