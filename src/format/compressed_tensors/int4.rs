//! Reading one INT4 `pack-quantized` module: its three tensors checked against each other and the conventions
//! (so that no shape a file declares can index out of range), then its packed words and BF16 scales as stored, or
//! dequantized to f32. Errors are one line naming the tensor.

use half::bf16;

use crate::io::dtype::{integers, Dtype};
use crate::io::{Checkpoint, TensorRef};
use crate::quant::{int4, pack};

use super::{packed_name, scale_name, shape_name};

/// An INT4 module as stored, after its conventions were checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Module {
    pub rows: usize,
    pub columns: usize,
    pub group_size: usize,
    /// `weight_packed`: `[rows, ceil(columns/8)]` words.
    pub words: Vec<u32>,
    /// `weight_scale`: `[rows, ceil(columns/group_size)]` BF16 scales.
    pub scales: Vec<bf16>,
}

impl Int4Module {
    /// Reads module `module` of `checkpoint`, quantized in groups of `group_size`.
    pub fn read(checkpoint: &Checkpoint, module: &str, group_size: usize) -> Result<Self, String> {
        check_int4_conventions(checkpoint, module, Some(group_size))?;
        let missing = |name: String| format!("{name}: missing");
        let packed = checkpoint.get(&packed_name(module)).ok_or_else(|| missing(packed_name(module)))?;
        let scale = checkpoint.get(&scale_name(module)).ok_or_else(|| missing(scale_name(module)))?;
        let shape = checkpoint.get(&shape_name(module)).ok_or_else(|| missing(shape_name(module)))?;
        let [rows, columns] = read_shape(&shape).ok_or_else(|| missing(shape_name(module)))?;
        let words = packed.bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let scales = scale.bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]])).collect();
        Ok(Self { rows, columns, group_size, words, scales })
    }

    /// The weight in f32, row-major `[rows, columns]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let (rows, columns, group_size) = (self.rows, self.columns, self.group_size);
        let (words_per_row, groups_per_row) = (pack::packed_columns(columns), columns.div_ceil(group_size));
        let mut out = vec![0f32; rows * columns];
        let mut q = vec![0i8; columns];
        for (row, values) in out.chunks_mut(columns).enumerate() {
            pack::unpack_row(&self.words[row * words_per_row..][..words_per_row], columns, &mut q);
            int4::dequantize_row(&q, &self.scales[row * groups_per_row..][..groups_per_row], group_size, values);
        }
        out
    }
}

/// Checks module `module`'s `weight_packed`, `weight_scale` (shape only with a group size) and `weight_shape`
/// against each other, and every scale finite and positive.
pub fn check_int4_conventions(checkpoint: &Checkpoint, module: &str, group_size: Option<usize>) -> Result<(), String> {
    check_int4_layout(checkpoint, module, group_size)?;
    let scale = checkpoint.get(&scale_name(module)).ok_or_else(|| format!("{}: missing", scale_name(module)))?;
    if let Some(position) = scale.bytes.chunks_exact(2).position(|b| {
        let value = bf16::from_le_bytes([b[0], b[1]]).to_f32();
        !(value.is_finite() && value > 0.0)
    }) {
        return Err(format!("{module}.weight_scale: group {position} has a non-positive or non-finite scale"));
    }
    Ok(())
}

/// The part of [`check_int4_conventions`] that reads no weight or scale: the three tensors present, their dtypes
/// and shapes agreeing with `weight_shape` (what `inspect` and `report` check on folders of any size).
pub fn check_int4_layout(checkpoint: &Checkpoint, module: &str, group_size: Option<usize>) -> Result<(), String> {
    let get = |suffix: &str| {
        checkpoint.get(&format!("{module}.{suffix}")).ok_or_else(|| format!("{module}.{suffix}: missing"))
    };
    let (packed, scale, shape) = (get("weight_packed")?, get("weight_scale")?, get("weight_shape")?);
    let [rows, columns] = read_shape(&shape).ok_or_else(|| {
        format!("{module}.weight_shape: must be I32 or I64 [2], got {} {:?}", shape.dtype, shape.shape)
    })?;
    if packed.dtype != Dtype::I32 || packed.shape != [rows, pack::packed_columns(columns)] {
        return Err(format!(
            "{module}.weight_packed: {} {:?}, expected I32 [{rows}, {}]",
            packed.dtype,
            packed.shape,
            pack::packed_columns(columns)
        ));
    }
    if let Some(group) = group_size {
        if scale.dtype != Dtype::BF16 || scale.shape != [rows, columns.div_ceil(group)] {
            return Err(format!(
                "{module}.weight_scale: {} {:?}, expected BF16 [{rows}, {}]",
                scale.dtype,
                scale.shape,
                columns.div_ceil(group)
            ));
        }
    }
    Ok(())
}

/// `[out, in]` of an INT4 module's `weight_shape` (I32 or I64 `[2]`, non-negative).
pub fn read_shape(tensor: &TensorRef) -> Option<[usize; 2]> {
    if tensor.shape != [2] {
        return None;
    }
    let values = integers(tensor.dtype, tensor.bytes)?;
    Some([usize::try_from(values[0]).ok()?, usize::try_from(values[1]).ok()?])
}

#[cfg(test)]
mod tests {
    use super::super::int4_tensors;
    use super::*;
    use crate::io::writer::ShardWriter;

    /// A module written under the names and shapes `int4_tensors` plans reads back as the values it encodes.
    #[test]
    fn written_module_reads_back() {
        let (rows, columns, group_size) = (3usize, 20usize, 10usize);
        let q: Vec<i8> = (0..rows * columns).map(|i| ((i * 7 + 3) % 16) as i8 - 8).collect();
        let scales: Vec<bf16> = (0..rows * 2).map(|i| bf16::from_f32(0.25 + i as f32 / 8.0)).collect();
        let words_per_row = pack::packed_columns(columns);
        let mut words = vec![0u32; rows * words_per_row];
        for (row, out) in words.chunks_mut(words_per_row).enumerate() {
            pack::pack_row(&q[row * columns..][..columns], out);
        }
        let bytes = [
            words.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>(),
            scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
            [rows as i64, columns as i64].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ];
        let dir = tempfile::tempdir().unwrap();
        let planned = int4_tensors("m", rows, columns, group_size);
        let mut writer = ShardWriter::create(&dir.path().join("model.safetensors"), planned.clone()).unwrap();
        for (tensor, bytes) in planned.iter().zip(&bytes) {
            writer.write_tensor(&tensor.name, bytes).unwrap();
        }
        writer.finish().unwrap();
        let checkpoint = Checkpoint::open(dir.path()).unwrap();
        let module = Int4Module::read(&checkpoint, "m", group_size).unwrap();
        assert_eq!((module.rows, module.columns), (rows, columns));
        let values = module.dequantize();
        for (index, value) in values.iter().enumerate() {
            let (row, column) = (index / columns, index % columns);
            let scale = scales[row * 2 + column / group_size].to_f32();
            assert_eq!(*value, q[index] as f32 * scale, "element {index}");
        }
        let error = Int4Module::read(&checkpoint, "m", 4).unwrap_err();
        assert!(error.starts_with("m.weight_scale:"), "{error}");
    }
}
