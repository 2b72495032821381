//! compressed-tensors' FP4 modules, written and read: `nvfp4-pack-quantized` and `mxfp4-pack-quantized`
//! (compressed-tensors 0.20.1 `compressors/nvfp4/base.py` `NVFP4PackedCompressor`, `compressors/mxfp4/base.py`
//! `MXFP4PackedCompressor`; vLLM 0.32 `compressed_tensors.py` `_is_nvfp4_format`/`_is_mxfp4` detect them by the
//! group's args: float, 4 bits, symmetric, `tensor_group` 16 or `group` 32). The math is [`crate::quant::fp4`].
//!
//! ```text
//! NVFP4  <module>.weight_packed        U8      [out, in/2]   E2M1 codes, the even element in the low nibble
//!        <module>.weight_scale         F8_E4M3 [out, in/16]
//!        <module>.weight_global_scale  F32     [1]           a divisor: w = fp4 · weight_scale / global
//! MXFP4  <module>.weight_packed        U8      [out, in/2]
//!        <module>.weight_scale         U8      [out, in/32]  E8M0: 2^(s − 127)
//! ```
//! No `weight_shape` (vLLM's FP4 loaders have no parameter for it and fail on one). Fused partners — an expert's
//! gate and up projections, which vLLM loads into one `w13` — share one global scale: vLLM keeps gate's for both
//! and warns "w1_weight_global_scale must match w3_weight_global_scale" (`compressed_tensors_moe` NVFP4 method), so
//! an up projection quantized under its own scale would be served mis-scaled.

use crate::io::dtype::Dtype;
use crate::io::writer::PlannedTensor;
use crate::io::Checkpoint;
use crate::quant::fp4;

use super::{packed_name, scale_name};

/// Which FP4 format a module is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fp4Kind {
    Nvfp4,
    Mxfp4,
}

impl Fp4Kind {
    pub fn name(self) -> &'static str {
        match self {
            Fp4Kind::Nvfp4 => "nvfp4",
            Fp4Kind::Mxfp4 => "mxfp4",
        }
    }

    /// Elements per scale.
    pub fn group(self) -> usize {
        match self {
            Fp4Kind::Nvfp4 => fp4::NVFP4_GROUP,
            Fp4Kind::Mxfp4 => fp4::MXFP4_GROUP,
        }
    }

    /// The compressed-tensors format name of its config group.
    pub fn format(self) -> &'static str {
        match self {
            Fp4Kind::Nvfp4 => "nvfp4-pack-quantized",
            Fp4Kind::Mxfp4 => "mxfp4-pack-quantized",
        }
    }

    fn scale_dtype(self) -> Dtype {
        match self {
            Fp4Kind::Nvfp4 => Dtype::F8_E4M3,
            Fp4Kind::Mxfp4 => Dtype::U8,
        }
    }
}

/// `<module>.weight_global_scale`.
pub fn global_scale_name(module: &str) -> String {
    format!("{module}.weight_global_scale")
}

/// `<module>.input_global_scale`: a W4A4 NVFP4 module's activation global scale (F32 `[1]`, 448 · 6 / the
/// calibrated absmax of its inputs; compressed-tensors' `generate_gparam` over the `static_minmax` observer).
pub fn input_global_scale_name(module: &str) -> String {
    format!("{module}.input_global_scale")
}

/// The tensors of FP4 module `module` of a `[rows, columns]` weight (`columns` a multiple of the kind's group);
/// with `fp4_activations` (W4A4 NVFP4) also its `input_global_scale`.
pub fn fp4_tensors(
    module: &str,
    rows: usize,
    columns: usize,
    kind: Fp4Kind,
    fp4_activations: bool,
) -> Vec<PlannedTensor> {
    let mut tensors = vec![
        PlannedTensor::new(packed_name(module), Dtype::U8, vec![rows, columns / 2]),
        PlannedTensor::new(scale_name(module), kind.scale_dtype(), vec![rows, columns / kind.group()]),
    ];
    if kind == Fp4Kind::Nvfp4 {
        tensors.push(PlannedTensor::new(global_scale_name(module), Dtype::F32, vec![1]));
    }
    if fp4_activations {
        tensors.push(PlannedTensor::new(input_global_scale_name(module), Dtype::F32, vec![1]));
    }
    tensors
}

/// The weight whose NVFP4 global scale `name` (`….gate_proj.weight` / `….up_proj.weight`, or the vendors'
/// `….w1.weight` / `….w3.weight` of Kimi K3 and DeepSeek-V4, w1 the gate) must share: the other half of the fused
/// gate/up projection.
pub fn fused_partner(name: &str) -> Option<String> {
    const PAIRS: [(&str, &str); 4] = [
        (".gate_proj.weight", ".up_proj.weight"),
        (".up_proj.weight", ".gate_proj.weight"),
        (".w1.weight", ".w3.weight"),
        (".w3.weight", ".w1.weight"),
    ];
    PAIRS.iter().find_map(|(own, other)| name.strip_suffix(own).map(|prefix| format!("{prefix}{other}")))
}

/// The FP4 modules of a checkpoint (a U8 `weight_packed`), in file order, by the text model's names.
pub fn fp4_modules(checkpoint: &Checkpoint) -> Vec<String> {
    checkpoint
        .names_in_file_order()
        .into_iter()
        .filter(|name| checkpoint.get(name).is_some_and(|tensor| tensor.dtype == Dtype::U8))
        .filter_map(|name| name.strip_suffix(".weight_packed").map(|module| checkpoint.text_name(module)))
        .collect()
}

/// An FP4 module as stored, after its conventions were checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp4Module {
    pub kind: Fp4Kind,
    pub rows: usize,
    pub columns: usize,
    /// `weight_packed`, two codes per byte.
    pub packed: Vec<u8>,
    /// `weight_scale`: E4M3 (NVFP4) or E8M0 (MXFP4) bytes, one per group.
    pub scales: Vec<u8>,
    /// NVFP4's `weight_global_scale` (1 for MXFP4).
    pub global_scale: f32,
}

/// An FP4 module's layout: its kind and weight shape, read from its tensors' headers (and the global scale's four
/// bytes), every shape and dtype checked against the others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp4Layout {
    pub kind: Fp4Kind,
    pub rows: usize,
    pub columns: usize,
    pub global_scale: f32,
    /// W4A4: the activation global scale ([`input_global_scale_name`]), finite and positive.
    pub input_global_scale: Option<f32>,
}

/// The value of a one-element F32 scale tensor `name`, which must be finite and positive (`what` says why).
fn positive_scalar(checkpoint: &Checkpoint, name: &str, what: &str) -> Result<Option<f32>, String> {
    let Some(tensor) = checkpoint.get(name) else { return Ok(None) };
    let value = match (tensor.dtype, tensor.shape.iter().product::<usize>(), tensor.bytes) {
        (Dtype::F32, 1, [a, b, c, d]) => f32::from_le_bytes([*a, *b, *c, *d]),
        (dtype, _, _) => return Err(format!("{name}: {dtype} {:?}, expected F32 [1]", tensor.shape)),
    };
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("{name}: {value}; {what} must be finite and positive"));
    }
    Ok(Some(value))
}

impl Fp4Layout {
    /// The layout of module `module` of `checkpoint` (its kind from its tensors: a global scale means NVFP4, a U8
    /// scale MXFP4), without reading its codes or scales (what `inspect` and `report` check). Errors name the tensor.
    pub fn read(checkpoint: &Checkpoint, module: &str) -> Result<Self, String> {
        let get = |name: String| checkpoint.get(&name).ok_or_else(|| format!("{name}: missing"));
        let packed = get(packed_name(module))?;
        let scale = get(scale_name(module))?;
        let [rows, half] = match packed.shape {
            [rows, half] if packed.dtype == Dtype::U8 => [*rows, *half],
            other => {
                return Err(format!("{}: {} {other:?}, expected U8 [out, in/2]", packed_name(module), packed.dtype))
            }
        };
        let columns = 2 * half;
        let global = checkpoint.get(&global_scale_name(module));
        let kind = match (scale.dtype, &global) {
            (Dtype::F8_E4M3, Some(_)) => Fp4Kind::Nvfp4,
            (Dtype::U8, None) => Fp4Kind::Mxfp4,
            (dtype, global) => {
                return Err(format!(
                    "{}: {dtype} {}; NVFP4 needs an F8_E4M3 scale and a weight_global_scale, MXFP4 a U8 scale and none",
                    scale_name(module),
                    if global.is_some() { "with a weight_global_scale" } else { "without a weight_global_scale" }
                ))
            }
        };
        let group = kind.group();
        if !columns.is_multiple_of(group) || scale.shape != [rows, columns / group] {
            return Err(format!(
                "{}: {:?}, expected [{rows}, {}] ({} groups of {group} per row of {columns})",
                scale_name(module),
                scale.shape,
                columns / group,
                kind.name()
            ));
        }
        let global_scale =
            positive_scalar(checkpoint, &global_scale_name(module), "a global scale (it divides every scale)")?
                .unwrap_or(1.0);
        let input_global_scale = positive_scalar(
            checkpoint,
            &input_global_scale_name(module),
            "an activation global scale (it divides every activation scale)",
        )?;
        if input_global_scale.is_some() && kind != Fp4Kind::Nvfp4 {
            return Err(format!("{}: only NVFP4 (W4A4) has activation global scales", input_global_scale_name(module)));
        }
        Ok(Self { kind, rows, columns, global_scale, input_global_scale })
    }
}

impl Fp4Module {
    /// Reads module `module` of `checkpoint` ([`Fp4Layout::read`]), every scale checked. Errors name the tensor.
    pub fn read(checkpoint: &Checkpoint, module: &str) -> Result<Self, String> {
        let Fp4Layout { kind, rows, columns, global_scale, .. } = Fp4Layout::read(checkpoint, module)?;
        let missing = |name: String| format!("{name}: missing");
        let packed = checkpoint.get(&packed_name(module)).ok_or_else(|| missing(packed_name(module)))?;
        let scale = checkpoint.get(&scale_name(module)).ok_or_else(|| missing(scale_name(module)))?;
        if kind == Fp4Kind::Nvfp4 {
            if let Some(group) = scale.bytes.iter().position(|&b| !fp4_scale_ok(b)) {
                return Err(format!("{}: group {group} has a NaN or negative scale", scale_name(module)));
            }
        }
        Ok(Self { kind, rows, columns, packed: packed.bytes.to_vec(), scales: scale.bytes.to_vec(), global_scale })
    }

    /// The weight in f32, row-major `[rows, columns]`, as compressed-tensors decompresses it.
    pub fn dequantize(&self) -> Vec<f32> {
        let (columns, groups) = (self.columns, self.columns / self.kind.group());
        let mut out = vec![0f32; self.rows * columns];
        let mut codes = vec![0u8; columns];
        for (row, values) in out.chunks_mut(columns).enumerate() {
            fp4::unpack(&self.packed[row * columns / 2..][..columns / 2], &mut codes);
            let scales = &self.scales[row * groups..][..groups];
            match self.kind {
                Fp4Kind::Nvfp4 => fp4::nvfp4_dequantize_row(&codes, scales, self.global_scale, values),
                Fp4Kind::Mxfp4 => fp4::mxfp4_dequantize_row(&codes, scales, values),
            }
        }
        out
    }
}

/// An E4M3 scale byte that is a number and not negative (−0 included: it decodes to 0).
fn fp4_scale_ok(byte: u8) -> bool {
    let value = crate::quant::fp8::decode(byte);
    value.is_finite() && value >= 0.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::writer::ShardWriter;

    fn write(dir: &std::path::Path, planned: &[PlannedTensor], bytes: &[Vec<u8>]) -> Checkpoint {
        let mut writer = ShardWriter::create(&dir.join("model.safetensors"), planned.to_vec()).unwrap();
        for (tensor, bytes) in planned.iter().zip(bytes) {
            writer.write_tensor(&tensor.name, bytes).unwrap();
        }
        writer.finish().unwrap();
        Checkpoint::open(dir).unwrap()
    }

    /// Modules written under the names and shapes `fp4_tensors` plans read back as the values they encode, for
    /// both kinds; a zero global scale and a missing one are refused naming the tensor.
    #[test]
    fn written_modules_read_back_and_bad_global_scales_are_refused() {
        let (rows, columns) = (3usize, 64usize);
        let weights: Vec<f32> = (0..rows * columns).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        for kind in [Fp4Kind::Nvfp4, Fp4Kind::Mxfp4] {
            let global = fp4::nvfp4_global_scale(fp4::absmax(&weights));
            let (mut packed, mut scales) = (Vec::new(), Vec::new());
            let (mut codes, mut row_packed) = (vec![0u8; columns], vec![0u8; columns / 2]);
            let mut row_scales = vec![0u8; columns / kind.group()];
            let mut expected = vec![0f32; columns];
            let mut want = Vec::new();
            for row in weights.chunks(columns) {
                match kind {
                    Fp4Kind::Nvfp4 => fp4::nvfp4_quantize_row(row, global, &mut codes, &mut row_scales),
                    Fp4Kind::Mxfp4 => fp4::mxfp4_quantize_row(row, &mut codes, &mut row_scales),
                }
                match kind {
                    Fp4Kind::Nvfp4 => fp4::nvfp4_dequantize_row(&codes, &row_scales, global, &mut expected),
                    Fp4Kind::Mxfp4 => fp4::mxfp4_dequantize_row(&codes, &row_scales, &mut expected),
                }
                want.extend_from_slice(&expected);
                fp4::pack(&codes, &mut row_packed);
                packed.extend_from_slice(&row_packed);
                scales.extend_from_slice(&row_scales);
            }
            let planned = fp4_tensors("m", rows, columns, kind, false);
            let mut bytes = vec![packed, scales];
            if kind == Fp4Kind::Nvfp4 {
                bytes.push(global.to_le_bytes().to_vec());
            }
            let dir = tempfile::tempdir().unwrap();
            let checkpoint = write(dir.path(), &planned, &bytes);
            let module = Fp4Module::read(&checkpoint, "m").unwrap();
            assert_eq!((module.kind, module.rows, module.columns), (kind, rows, columns));
            assert_eq!(module.dequantize(), want, "{kind:?}");
            assert_eq!(fp4_modules(&checkpoint), vec!["m".to_string()]);

            if kind == Fp4Kind::Nvfp4 {
                bytes[2] = 0f32.to_le_bytes().to_vec();
                let dir = tempfile::tempdir().unwrap();
                let error = Fp4Module::read(&write(dir.path(), &planned, &bytes), "m").unwrap_err();
                assert!(error.starts_with("m.weight_global_scale: 0"), "{error}");
                let dir = tempfile::tempdir().unwrap();
                let error = Fp4Module::read(&write(dir.path(), &planned[..2], &bytes[..2]), "m").unwrap_err();
                assert!(error.starts_with("m.weight_scale: F8_E4M3 without a weight_global_scale"), "{error}");
            }
        }
    }

    #[test]
    fn gate_and_up_are_each_others_partners() {
        let gate = "model.layers.1.mlp.experts.7.gate_proj.weight";
        let up = "model.layers.1.mlp.experts.7.up_proj.weight";
        assert_eq!(fused_partner(gate).as_deref(), Some(up));
        assert_eq!(fused_partner(up).as_deref(), Some(gate));
        assert_eq!(fused_partner("model.layers.1.mlp.experts.7.down_proj.weight"), None);
    }
}
