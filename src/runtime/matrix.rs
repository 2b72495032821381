//! A loaded weight matrix in the forms it is held in: f32 values, the packed INT4 form of a compressed-tensors
//! checkpoint ([`Int4Weight`]), the codes and block scales of a block-FP8 checkpoint ([`Fp8Weight`]), and the copy a
//! device backend keeps of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::device::DeviceWeight;

/// A weight matrix `[rows, columns]` (f32, row-major), or, read from a compressed-tensors INT4 checkpoint, its
/// packed INT4 form only: the CUDA backend multiplies by that directly (W4A16), and the f32 values are made from it
/// on the first [`Matrix::values`] (the CPU backend's), so a device run holds no host f32 copy of INT4 weights.
/// A block-FP8 weight is read as its codes and block scales ([`Fp8Weight`]): a device backend uploads those (a
/// quarter of the f32 bytes) and dequantizes on the device; the first [`Matrix::values`] dequantizes on the host
/// and drops the codes, so the CPU holds the f32 values only, as before.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub rows: usize,
    pub columns: usize,
    /// The f32 values given at construction (empty for a packed-only INT4 matrix).
    data: Vec<f32>,
    /// The f32 values of a packed-only matrix, dequantized on first use.
    dequantized: std::sync::OnceLock<Vec<f32>>,
    pub int4: Option<Box<Int4Weight>>,
    /// The FP8 form of a block-FP8 weight until its f32 values are made.
    fp8: CodedFp8,
    /// Every value is a BF16 number (read from a BF16 linear weight): a device may hold it as BF16 without loss.
    pub bf16_values: bool,
    /// W4A8: the engines quantize this weight's inputs to FP8 per token before multiplying
    /// ([`crate::quant::w4a8::fake_quantize_tokens`]), which the CPU's linear emulates.
    pub fp8_token_inputs: bool,
    /// Unique per loaded matrix.
    pub id: u64,
    /// Its copy on a device, kept by the device backend ([`crate::runtime::cuda`]) that uploaded it and freed with
    /// the matrix: a dropped layer frees its device memory.
    device_copy: DeviceCopy,
}

/// A matrix's FP8 codes and scales, taken when the host dequantizes them.
#[derive(Debug, Default)]
struct CodedFp8(std::sync::Mutex<Option<std::sync::Arc<Fp8Weight>>>);

impl CodedFp8 {
    fn get(&self) -> Option<std::sync::Arc<Fp8Weight>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn take(&self) -> Option<std::sync::Arc<Fp8Weight>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }
}

impl Clone for CodedFp8 {
    fn clone(&self) -> Self {
        Self(std::sync::Mutex::new(self.get()))
    }
}

/// Block-scaled FP8 e4m3 as a checkpoint stores it: codes `[rows, columns]` and one f32 multiplier per block of
/// `grid` (`w = e4m3(code) · scale`, [`crate::quant::fp8_block::dequantize_row`]).
#[derive(Debug, Clone)]
pub struct Fp8Weight {
    pub codes: Fp8Codes,
    pub scales: Vec<f32>,
    pub grid: crate::quant::fp8_block::BlockGrid,
}

/// An FP8 weight's codes: read in place from bytes the loader keeps alive (a checkpoint's mapping: no copy, the CPU
/// decodes them block by block as it multiplies), or owned.
#[derive(Debug, Clone)]
pub enum Fp8Codes {
    Mapped(Arc<dyn SharedBytes>),
    Owned(Vec<u8>),
}

/// Bytes the runtime reads in place without owning them (the loader's mapping of a checkpoint file).
pub trait SharedBytes: std::ops::Deref<Target = [u8]> + std::fmt::Debug + Send + Sync {}

impl<T: std::ops::Deref<Target = [u8]> + std::fmt::Debug + Send + Sync> SharedBytes for T {}

impl std::ops::Deref for Fp8Codes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Mapped(bytes) => bytes.as_ref(),
            Self::Owned(bytes) => bytes,
        }
    }
}

impl Fp8Weight {
    /// The f32 values, row-major: what a checkpoint reader dequantizing row by row gives, bit for bit.
    pub fn dequantize(&self) -> Vec<f32> {
        let columns = self.grid.columns;
        let mut out = vec![0f32; self.grid.rows * columns];
        for (row, values) in out.chunks_mut(columns.max(1)).enumerate().take(self.grid.rows) {
            crate::quant::fp8_block::dequantize_row(
                &self.grid,
                row,
                &self.codes[row * columns..][..columns],
                &self.scales,
                values,
            );
        }
        out
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.codes.len() + self.scales.len() * 4
    }
}

/// A matrix's device copy: the device it lives on (by address) and the weight as the CUDA backend keeps it there.
#[derive(Default)]
struct DeviceCopy(std::sync::Mutex<Option<(usize, std::sync::Arc<DeviceWeight>)>>);

impl Clone for DeviceCopy {
    /// A clone is a new matrix: it uploads its own copy.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for DeviceCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.0.lock().map(|slot| slot.is_some()).unwrap_or(false);
        write!(f, "DeviceCopy({})", if kept { "kept" } else { "none" })
    }
}

/// compressed-tensors `pack-quantized` INT4: `weight_packed` words `[rows, ceil(columns / 8)]` (nibble `j % 8` of
/// word `j / 8` holds `q + 8`) and BF16 `weight_scale` bits `[rows, ceil(columns / group_size)]`; `w = q · scale`.
#[derive(Debug, Clone)]
pub struct Int4Weight {
    pub packed: Vec<u32>,
    pub scales: Vec<u16>,
    pub group_size: usize,
}

impl Int4Weight {
    /// `weights` `[rows, columns]` through squeeze's INT4 quantizer (ct-minmax): the packed form and the dequantized
    /// values it stands for (what the CPU multiplies by). For tests and the self-test.
    pub fn quantize(weights: &[f32], columns: usize, group_size: usize) -> (Self, Vec<f32>) {
        use crate::quant::{int4, pack, ScaleRule};
        let (mut packed, mut scales, mut values) = (Vec::new(), Vec::new(), vec![0f32; weights.len()]);
        let mut q = vec![0i8; columns];
        let mut row_scales = vec![half::bf16::ZERO; columns.div_ceil(group_size)];
        let mut words = vec![0u32; pack::packed_columns(columns)];
        for (row, out) in weights.chunks(columns).zip(values.chunks_mut(columns)) {
            int4::quantize_row(row, group_size, ScaleRule::CtMinmax, &mut q, &mut row_scales);
            int4::dequantize_row(&q, &row_scales, group_size, out);
            pack::pack_row(&q, &mut words);
            packed.extend_from_slice(&words);
            scales.extend(row_scales.iter().map(|s| s.to_bits()));
        }
        (Self { packed, scales, group_size }, values)
    }

    /// The values `q · scale` of a `[rows, columns]` matrix.
    pub fn dequantize(&self, rows: usize, columns: usize) -> Vec<f32> {
        use crate::quant::{int4, pack};
        let (words_per_row, groups_per_row) = (pack::packed_columns(columns), columns.div_ceil(self.group_size));
        let mut out = vec![0f32; rows * columns];
        let mut q = vec![0i8; columns];
        for (row, values) in out.chunks_mut(columns.max(1)).enumerate().take(rows) {
            pack::unpack_row(&self.packed[row * words_per_row..][..words_per_row], columns, &mut q);
            let scales: Vec<half::bf16> = self.scales[row * groups_per_row..][..groups_per_row]
                .iter()
                .map(|&bits| half::bf16::from_bits(bits))
                .collect();
            int4::dequantize_row(&q, &scales, self.group_size, values);
        }
        out
    }
}

static NEXT_MATRIX_ID: AtomicU64 = AtomicU64::new(1);

impl Matrix {
    /// A matrix with a fresh id.
    pub fn new(rows: usize, columns: usize, data: Vec<f32>) -> Self {
        let id = NEXT_MATRIX_ID.fetch_add(1, Ordering::Relaxed);
        Self {
            rows,
            columns,
            data,
            dequantized: std::sync::OnceLock::new(),
            int4: None,
            fp8: CodedFp8::default(),
            bf16_values: false,
            fp8_token_inputs: false,
            id,
            device_copy: DeviceCopy::default(),
        }
    }

    /// The copy the device backend keeps on device `device` (an address), if it made one.
    pub(crate) fn device_copy(&self, device: usize) -> Option<std::sync::Arc<DeviceWeight>> {
        let slot = self.device_copy.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.as_ref().filter(|(on, _)| *on == device).map(|(_, copy)| copy.clone())
    }

    /// Keeps `copy` as this matrix's copy on device `device` (replacing one on another device).
    pub(crate) fn keep_device_copy(&self, device: usize, copy: std::sync::Arc<DeviceWeight>) {
        let mut slot = self.device_copy.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = Some((device, copy));
    }

    /// A packed-only INT4 matrix: no f32 values until [`Matrix::values`] asks.
    pub fn packed(rows: usize, columns: usize, int4: Int4Weight) -> Self {
        Self::new(rows, columns, Vec::new()).with_int4(int4)
    }

    /// A block-FP8 matrix held as its codes and scales: no f32 values until [`Matrix::values`] asks.
    pub fn coded_fp8(fp8: Fp8Weight) -> Self {
        let matrix = Self::new(fp8.grid.rows, fp8.grid.columns, Vec::new());
        *matrix.fp8.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(std::sync::Arc::new(fp8));
        matrix
    }

    /// The FP8 codes and scales, while the values have not been made from them on the host.
    pub fn fp8(&self) -> Option<std::sync::Arc<Fp8Weight>> {
        self.fp8.get()
    }

    /// The f32 values `[rows · columns]`: as given, or dequantized from the INT4 form or the FP8 codes (once, then
    /// kept; the FP8 codes are dropped then).
    pub fn values(&self) -> &[f32] {
        if !self.data.is_empty() || self.rows * self.columns == 0 {
            return &self.data;
        }
        match &self.int4 {
            Some(int4) => self.dequantized.get_or_init(|| int4.dequantize(self.rows, self.columns)),
            None => self.dequantized.get_or_init(|| self.fp8.take().map(|fp8| fp8.dequantize()).unwrap_or_default()),
        }
    }

    /// The same matrix, marked as holding BF16 numbers only (or not).
    pub fn with_bf16_values(mut self, bf16_values: bool) -> Self {
        self.bf16_values = bf16_values;
        self
    }

    /// The same matrix, its inputs quantized to FP8 per token as the engines do for W4A8.
    pub fn with_fp8_token_inputs(mut self) -> Self {
        self.fp8_token_inputs = true;
        self
    }

    /// The same matrix carrying its packed INT4 form.
    pub fn with_int4(mut self, int4: Int4Weight) -> Self {
        self.int4 = Some(Box::new(int4));
        self
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let dense = self.data.len() + self.dequantized.get().map_or(0, Vec::len);
        dense * 4
            + self.int4.as_ref().map_or(0, |w| w.packed.len() * 4 + w.scales.len() * 2)
            + self.fp8.get().map_or(0, |w| w.bytes())
    }
}
