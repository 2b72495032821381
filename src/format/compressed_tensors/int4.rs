//! Reading one INT4 `pack-quantized` module: its tensors checked against each other and the conventions (so that
//! no shape a file declares can index out of range), then its packed words, scales (BF16, F16 or F32, read exactly
//! as f32), zero points and `g_idx` as stored, or dequantized to f32. Errors are one line naming the tensor.
//!
//! Beyond squeeze's own layout ([`super`]) it reads what compressed-tensors 0.20.1's `PackedQuantizationCompressor`
//! (`compressors/pack_quantized/base.py`) and vLLM 0.32's `CompressedTensorsWNA16` load, and older writers' `g_idx`:
//!
//! ```text
//! <module>.weight_scale       BF16/F16/F32 [out, groups]     groups = ceil(in/group_size), or 1 (strategy channel)
//! <module>.weight_zero_point  I32 [ceil(out/8), groups]       symmetric: false; pack_to_int32(z, 4, packed_dim=0):
//!                                                             nibble r%8 of word [r/8, g] holds z[r, g] + 8
//!                             (or I8 [out, groups], z unpacked, in −8…7)
//! <module>.weight_g_idx       I32/I64 [in]                    actorder: group; column j's group is g_idx[j]
//! ```
//!
//! A weight is `(q − z) · s` with `q` and `z` the signed codes (nibble − 8), as compressed-tensors' `dequantize`
//! and vLLM's `uint4` zero-point kernels (`w = (nibble_q − nibble_z) · s`) compute it.

use half::{bf16, f16};

use crate::io::dtype::{integers, Dtype};
use crate::io::{Checkpoint, TensorRef};
use crate::quant::{int4, pack};

use super::config::Int4Args;
use super::{packed_name, scale_name};

/// `<module>.weight_zero_point`.
pub fn zero_point_name(module: &str) -> String {
    format!("{module}.weight_zero_point")
}

/// `<module>.weight_g_idx`.
pub fn g_idx_name(module: &str) -> String {
    format!("{module}.weight_g_idx")
}

/// An INT4 module as stored, after its conventions were checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Module {
    pub rows: usize,
    pub columns: usize,
    /// Columns per scale (`columns` for `strategy: channel`).
    pub group_size: usize,
    /// `weight_packed`: `[rows, ceil(columns/8)]` words.
    pub words: Vec<u32>,
    /// `weight_scale`: `[rows, groups]`, each exactly the stored value.
    pub scales: Vec<f32>,
    /// The stored dtype of `weight_scale`: BF16 (squeeze's), F16 or F32.
    pub scale_dtype: Dtype,
    /// `weight_zero_point` unpacked to `[rows, groups]` signed codes (−8…7), for `symmetric: false`.
    pub zero_points: Option<Vec<i8>>,
    /// `weight_g_idx`: the group of each column, when the columns are not grouped in order.
    pub g_idx: Option<Vec<u32>>,
}

impl Int4Module {
    /// Reads module `module` of `checkpoint` under the config's INT4 arguments `args`.
    pub fn read(checkpoint: &Checkpoint, module: &str, args: &Int4Args) -> Result<Self, String> {
        let layout = check_int4_conventions(checkpoint, module, Some(args))?;
        let get = |name: String| checkpoint.get(&name).ok_or_else(|| format!("{name}: missing"));
        let packed = get(packed_name(module))?;
        let scale = get(scale_name(module))?;
        let words = packed.bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok(Self {
            rows: layout.rows,
            columns: layout.columns,
            group_size: layout.group_size,
            words,
            scales: scale_values(scale.dtype, scale.bytes),
            scale_dtype: scale.dtype,
            zero_points: layout.zero_points,
            g_idx: layout.g_idx,
        })
    }

    /// squeeze's own layout: BF16 scales in contiguous groups, no zero points (what the runtime keeps packed).
    pub fn is_squeeze_layout(&self) -> bool {
        self.scale_dtype == Dtype::BF16 && self.zero_points.is_none() && self.g_idx.is_none()
    }

    /// The scales as BF16 bits, when they are stored as BF16 (exact then).
    pub fn bf16_scales(&self) -> Option<Vec<bf16>> {
        (self.scale_dtype == Dtype::BF16).then(|| self.scales.iter().map(|&scale| bf16::from_f32(scale)).collect())
    }

    /// The weight in f32, row-major `[rows, columns]`: `(q − z) · s` per element.
    pub fn dequantize(&self) -> Vec<f32> {
        let groups: Vec<u32> = match &self.g_idx {
            Some(g_idx) => g_idx.clone(),
            None => (0..self.columns).map(|column| (column / self.group_size) as u32).collect(),
        };
        self.dequantize_rows(|q, scales, zeros, values| int4::dequantize_row_grouped(q, scales, zeros, &groups, values))
    }

    /// The weight in f32, row-major `[rows, columns]`, each row made by `row(codes, its scales, its zero points,
    /// out)` from its unpacked codes (−8…7).
    pub fn dequantize_rows(&self, mut row: impl FnMut(&[i8], &[f32], Option<&[i8]>, &mut [f32])) -> Vec<f32> {
        let (rows, columns) = (self.rows, self.columns);
        let (words_per_row, groups_per_row) = (pack::packed_columns(columns), columns.div_ceil(self.group_size));
        let mut out = vec![0f32; rows * columns];
        let mut q = vec![0i8; columns];
        for (index, values) in out.chunks_mut(columns.max(1)).enumerate().take(rows) {
            pack::unpack_row(&self.words[index * words_per_row..][..words_per_row], columns, &mut q);
            let scales = &self.scales[index * groups_per_row..][..groups_per_row];
            let zeros = self.zero_points.as_ref().map(|zeros| &zeros[index * groups_per_row..][..groups_per_row]);
            row(&q, scales, zeros, values);
        }
        out
    }
}

/// The values of a BF16, F16 or F32 scale tensor, exactly (empty for another dtype, which the layout check refuses).
fn scale_values(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::BF16 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        _ => Vec::new(),
    }
}

/// What [`check_int4_conventions`] read besides checking: the module's shape and its unpacked zero points and
/// `g_idx`, when it has them.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Layout {
    pub rows: usize,
    pub columns: usize,
    pub group_size: usize,
    pub zero_points: Option<Vec<i8>>,
    pub g_idx: Option<Vec<u32>>,
}

/// Checks module `module`'s tensors against each other ([`check_int4_layout`]) and their values: every scale
/// finite and positive, every zero point in the code range −8…7, `weight_g_idx` a permutation of the contiguous
/// grouping (each group index below the group count, each group holding as many columns as contiguous groups do).
pub fn check_int4_conventions(
    checkpoint: &Checkpoint,
    module: &str,
    args: Option<&Int4Args>,
) -> Result<Int4Layout, String> {
    let [rows, columns] = check_int4_layout(checkpoint, module, args)?;
    let group_size = args.map_or(columns.max(1), |args| args.group_of(columns));
    let groups = columns.div_ceil(group_size);
    let scale = checkpoint.get(&scale_name(module)).ok_or_else(|| format!("{}: missing", scale_name(module)))?;
    if let Some(position) = scale_values(scale.dtype, scale.bytes).iter().position(|v| !(v.is_finite() && *v > 0.0)) {
        return Err(format!("{module}.weight_scale: group {position} has a non-positive or non-finite scale"));
    }
    let zero_points = match checkpoint.get(&zero_point_name(module)) {
        Some(tensor) => Some(zero_points(module, &tensor, rows, groups)?),
        None => None,
    };
    let g_idx = match checkpoint.get(&g_idx_name(module)) {
        Some(tensor) => Some(g_idx(module, &tensor, columns, group_size)?),
        None => None,
    };
    Ok(Int4Layout { rows, columns, group_size, zero_points, g_idx })
}

/// `weight_zero_point` as `[rows, groups]` signed codes: packed I32 `[ceil(rows/8), groups]` (compressed-tensors'
/// `pack_to_int32(z, 4, packed_dim=0)`, what vLLM's `PackedvLLMParameter(packed_dim=0)` loads) or unpacked I8
/// `[rows, groups]`.
fn zero_points(module: &str, tensor: &TensorRef, rows: usize, groups: usize) -> Result<Vec<i8>, String> {
    let name = zero_point_name(module);
    let packed_rows = pack::packed_columns(rows);
    if tensor.dtype == Dtype::I32 && tensor.shape == [packed_rows, groups] {
        let words: Vec<u32> =
            tensor.bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        return Ok((0..rows * groups)
            .map(|i| pack::code(words[(i / groups) / 8 * groups + i % groups], (i / groups) % 8))
            .collect());
    }
    if tensor.dtype == Dtype::I8 && tensor.shape == [rows, groups] {
        let values: Vec<i8> = tensor.bytes.iter().map(|&b| b as i8).collect();
        if let Some(position) = values.iter().position(|z| !(-8..=7).contains(z)) {
            return Err(format!(
                "{name}: element {position} (row {}, group {}) is {}, outside the INT4 code range −8…7; the zero \
                 points are damaged: requantize the model",
                position / groups.max(1),
                position % groups.max(1),
                values[position]
            ));
        }
        return Ok(values);
    }
    Err(format!(
        "{name}: {} {:?}, expected I32 [{packed_rows}, {groups}] (eight 4-bit zero points per word down the rows, as \
         compressed-tensors packs them) or I8 [{rows}, {groups}]",
        tensor.dtype, tensor.shape
    ))
}

/// `weight_g_idx`: I32/I64 `[columns]`, a permutation of the contiguous grouping `j / group_size`.
fn g_idx(module: &str, tensor: &TensorRef, columns: usize, group_size: usize) -> Result<Vec<u32>, String> {
    let name = g_idx_name(module);
    let values = integers(tensor.dtype, tensor.bytes).filter(|_| tensor.shape == [columns]).ok_or_else(|| {
        format!("{name}: {} {:?}, expected I32 [{columns}] (the group of each column)", tensor.dtype, tensor.shape)
    })?;
    let groups = columns.div_ceil(group_size);
    let mut counts = vec![0usize; groups];
    for (column, &group) in values.iter().enumerate() {
        let slot = usize::try_from(group).ok().and_then(|group| counts.get_mut(group)).ok_or_else(|| {
            format!(
                "{name}: column {column} is in group {group}, but the weight has groups 0…{}",
                groups.saturating_sub(1)
            )
        })?;
        *slot += 1;
    }
    for (group, &count) in counts.iter().enumerate() {
        let expected = group_size.min(columns - group * group_size);
        if count != expected {
            return Err(format!(
                "{name}: group {group} holds {count} columns, expected {expected} (group_size {group_size}): not a \
                 permutation of the groups, so not a GPTQ activation order; the folder is damaged"
            ));
        }
    }
    Ok(values.into_iter().map(|group| group as u32).collect())
}

/// The part of [`check_int4_conventions`] that reads no weight or scale: the tensors present, their dtypes and
/// shapes agreeing with `weight_shape` (what `inspect` and `report` check on folders of any size). Without `args`
/// (no INT4 group in the config) the scale is not checked. Returns `[rows, columns]`.
pub fn check_int4_layout(checkpoint: &Checkpoint, module: &str, args: Option<&Int4Args>) -> Result<[usize; 2], String> {
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
    let Some(args) = args else { return Ok([rows, columns]) };
    if !matches!(scale.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
        return Err(format!(
            "{module}.weight_scale: dtype {} is not an INT4 scale dtype squeeze reads (BF16, F16, F32, as \
             compressed-tensors and vLLM load them); convert the scales or requantize",
            scale.dtype
        ));
    }
    let groups = columns.div_ceil(args.group_of(columns));
    if scale.shape != [rows, groups] {
        let declared = match args.group_size {
            Some(size) => format!("group_size {size}"),
            None => "strategy channel".to_string(),
        };
        return Err(format!(
            "{module}.weight_scale: {} {:?}, expected {} [{rows}, {groups}] ({declared} in config.json)",
            scale.dtype, scale.shape, scale.dtype
        ));
    }
    let zero_point = checkpoint.get(&zero_point_name(module));
    match (args.symmetric, zero_point.is_some()) {
        (false, false) => {
            return Err(format!(
                "{}: missing, but config.json declares symmetric: false (asymmetric weights need their zero points)",
                zero_point_name(module)
            ))
        }
        (true, true) => {
            return Err(format!(
                "{}: present, but config.json declares symmetric: true; set symmetric to false or drop the tensor",
                zero_point_name(module)
            ))
        }
        _ => {}
    }
    if args.g_idx && !checkpoint.contains(&g_idx_name(module)) {
        return Err(format!(
            "{}: missing, but config.json declares actorder group (the columns' groups are not in order)",
            g_idx_name(module)
        ));
    }
    Ok([rows, columns])
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
        let module = Int4Module::read(&checkpoint, "m", &Int4Args::group(group_size)).unwrap();
        assert_eq!((module.rows, module.columns), (rows, columns));
        let values = module.dequantize();
        for (index, value) in values.iter().enumerate() {
            let (row, column) = (index / columns, index % columns);
            let scale = scales[row * 2 + column / group_size].to_f32();
            assert_eq!(*value, q[index] as f32 * scale, "element {index}");
        }
        let error = Int4Module::read(&checkpoint, "m", &Int4Args::group(4)).unwrap_err();
        assert!(error.starts_with("m.weight_scale:"), "{error}");
    }

    /// A folder with one module `m` of the given tensors (name suffix, dtype, shape, bytes).
    fn module_folder(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> tempfile::TempDir {
        use crate::io::writer::PlannedTensor;
        let dir = tempfile::tempdir().unwrap();
        let planned: Vec<PlannedTensor> = tensors
            .iter()
            .map(|(suffix, dtype, shape, _)| PlannedTensor::new(format!("m.{suffix}"), *dtype, shape.clone()))
            .collect();
        let mut writer = ShardWriter::create(&dir.path().join("model.safetensors"), planned.clone()).unwrap();
        for (tensor, (_, _, _, bytes)) in planned.iter().zip(tensors) {
            writer.write_tensor(&tensor.name, bytes).unwrap();
        }
        writer.finish().unwrap();
        dir
    }

    /// Codes `q[r][j] = ((r·columns + j)·5 + 1) mod 16 − 8` packed as compressed-tensors packs them.
    fn packed_codes(rows: usize, columns: usize) -> (Vec<i8>, Vec<u8>) {
        let q: Vec<i8> = (0..rows * columns).map(|i| ((i * 5 + 1) % 16) as i8 - 8).collect();
        let words_per_row = pack::packed_columns(columns);
        let mut words = vec![0u32; rows * words_per_row];
        for (row, out) in words.chunks_mut(words_per_row).enumerate() {
            pack::pack_row(&q[row * columns..][..columns], out);
        }
        (q, words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }

    fn shape_bytes(rows: usize, columns: usize) -> Vec<u8> {
        [rows as i64, columns as i64].iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// F16 scales, an asymmetric zero point packed eight rows to a word down the columns (compressed-tensors'
    /// `pack_to_int32(z, 4, packed_dim=0)`, written here by hand: nibble `r % 8` of word `[r / 8, g]` holds
    /// `z + 8`) over 10 rows (a partial last word), and a `g_idx`: each value is `(q − z[g]) · s[g]` with `g`
    /// the column's `g_idx`.
    #[test]
    fn zero_points_f16_scales_and_g_idx_read_as_written() {
        let (rows, columns, group) = (10usize, 12usize, 4usize);
        let groups = columns / group;
        let (q, packed) = packed_codes(rows, columns);
        let scales: Vec<f16> = (0..rows * groups).map(|i| f16::from_f32(0.125 + i as f32 / 64.0)).collect();
        let zeros: Vec<i8> = (0..rows * groups).map(|i| ((i * 3) % 16) as i8 - 8).collect();
        let mut zero_words = vec![0u32; rows.div_ceil(8) * groups];
        for (i, &z) in zeros.iter().enumerate() {
            let (row, g) = (i / groups, i % groups);
            zero_words[row / 8 * groups + g] |= ((z + 8) as u32) << (4 * (row % 8));
        }
        // A permutation of the groups [0,0,0,0,1,1,1,1,2,2,2,2].
        let g_idx: Vec<i32> = vec![2, 0, 1, 0, 2, 1, 0, 1, 2, 0, 1, 2];
        let dir = module_folder(&[
            ("weight_packed", Dtype::I32, vec![rows, columns / 8 + 1], packed),
            ("weight_scale", Dtype::F16, vec![rows, groups], scales.iter().flat_map(|s| s.to_le_bytes()).collect()),
            (
                "weight_zero_point",
                Dtype::I32,
                vec![rows.div_ceil(8), groups],
                zero_words.iter().flat_map(|w| w.to_le_bytes()).collect(),
            ),
            ("weight_g_idx", Dtype::I32, vec![columns], g_idx.iter().flat_map(|g| g.to_le_bytes()).collect()),
            ("weight_shape", Dtype::I64, vec![2], shape_bytes(rows, columns)),
        ]);
        let checkpoint = Checkpoint::open(dir.path()).unwrap();
        let args = Int4Args { group_size: Some(group), symmetric: false, g_idx: true, fp8_activations: false };
        let module = Int4Module::read(&checkpoint, "m", &args).unwrap();
        assert!(!module.is_squeeze_layout());
        let values = module.dequantize();
        for (index, value) in values.iter().enumerate() {
            let (row, column) = (index / columns, index % columns);
            let g = row * groups + g_idx[column] as usize;
            let want = (q[index] as f32 - zeros[g] as f32) * scales[g].to_f32();
            assert_eq!(value.to_bits(), want.to_bits(), "row {row} column {column}");
        }
        // Declared symmetric, the zero point is refused by name; a group size the scales disagree with too.
        let symmetric = Int4Args { symmetric: true, ..args };
        let error = Int4Module::read(&checkpoint, "m", &symmetric).unwrap_err();
        assert!(error.starts_with("m.weight_zero_point: present"), "{error}");
        let error = Int4Module::read(&checkpoint, "m", &Int4Args { group_size: Some(6), ..args }).unwrap_err();
        assert!(error.starts_with("m.weight_scale: F16 [10, 3], expected F16 [10, 2]"), "{error}");
    }

    /// A `g_idx` that is not a permutation of the groups, an unpacked zero point outside −8…7 and a scale dtype
    /// squeeze does not read are refused, naming the tensor.
    #[test]
    fn bad_g_idx_zero_points_and_scale_dtypes_are_refused_by_name() {
        let (rows, columns, group) = (2usize, 8usize, 4usize);
        let (_, packed) = packed_codes(rows, columns);
        let scale = |dtype: Dtype| {
            let bytes = match dtype {
                Dtype::F32 => 0.5f32.to_le_bytes().repeat(rows * 2),
                _ => vec![0x38; rows * 2 * crate::io::dtype::element_bytes(dtype)],
            };
            ("weight_scale", dtype, vec![rows, 2], bytes)
        };
        let base = |extra: Vec<(&'static str, Dtype, Vec<usize>, Vec<u8>)>, scale_dtype: Dtype| {
            let mut tensors = vec![
                ("weight_packed", Dtype::I32, vec![rows, 1], packed.clone()),
                scale(scale_dtype),
                ("weight_shape", Dtype::I64, vec![2], shape_bytes(rows, columns)),
            ];
            tensors.extend(extra);
            module_folder(&tensors)
        };
        let g_idx = |values: [i32; 8]| {
            ("weight_g_idx", Dtype::I32, vec![columns], values.iter().flat_map(|g| g.to_le_bytes()).collect())
        };
        let ordered = Int4Args { group_size: Some(group), symmetric: true, g_idx: true, fp8_activations: false };
        let cases: Vec<(tempfile::TempDir, Int4Args, &str)> = vec![
            (
                base(vec![g_idx([0, 1, 0, 1, 0, 1, 0, 2])], Dtype::F32),
                ordered,
                "m.weight_g_idx: column 7 is in group 2",
            ),
            (
                base(vec![g_idx([0, 1, 0, 1, 0, 1, 0, 0])], Dtype::F32),
                ordered,
                "m.weight_g_idx: group 0 holds 5 columns, expected 4",
            ),
            (base(vec![], Dtype::F32), ordered, "m.weight_g_idx: missing"),
            (
                base(vec![("weight_zero_point", Dtype::I8, vec![rows, 2], vec![0, 3, 9, 0xF8])], Dtype::F32),
                Int4Args { group_size: Some(group), symmetric: false, g_idx: false, fp8_activations: false },
                "m.weight_zero_point: element 2 (row 1, group 0) is 9, outside the INT4 code range",
            ),
            (
                base(vec![], Dtype::F32),
                Int4Args { group_size: Some(group), symmetric: false, g_idx: false, fp8_activations: false },
                "m.weight_zero_point: missing",
            ),
            (
                base(vec![], Dtype::F8_E4M3),
                Int4Args::group(group),
                "m.weight_scale: dtype F8_E4M3 is not an INT4 scale dtype",
            ),
        ];
        for (dir, args, expected) in cases {
            let checkpoint = Checkpoint::open(dir.path()).unwrap();
            let error = Int4Module::read(&checkpoint, "m", &args).unwrap_err();
            assert!(error.starts_with(expected), "expected `{expected}`, got `{error}`");
        }
        // The F32 folder itself reads, each scale exactly.
        let dir = base(vec![], Dtype::F32);
        let module = Int4Module::read(&Checkpoint::open(dir.path()).unwrap(), "m", &Int4Args::group(group)).unwrap();
        assert_eq!((module.scale_dtype, module.scales.as_slice()), (Dtype::F32, [0.5f32; 4].as_slice()));
    }
}
