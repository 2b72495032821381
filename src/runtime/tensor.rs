//! Activations where their backend keeps them: a [`Tensor`] is `[rows, columns]` f32 in host memory (the CPU
//! backend) or in a device buffer (the CUDA backend). Model code never reads one directly: it hands tensors to the
//! backend's ops ([`crate::runtime::Backend`]) and reads values back only through [`Backend::download`] — logits,
//! taps — so a device backend keeps the residual stream on the device from the embedding to the logits.
//!
//! [`Backend::download`]: crate::runtime::Backend::download

use crate::runtime::device::DeviceBuffer;

/// Row-major `[rows, columns]` f32 activations of one backend.
#[derive(Debug)]
pub struct Tensor {
    rows: usize,
    columns: usize,
    pub(crate) storage: Storage,
}

/// Where a tensor's values are.
#[derive(Debug)]
pub(crate) enum Storage {
    Host(Vec<f32>),
    Device(DeviceBuffer),
}

impl Tensor {
    /// Host values (the CPU backend's tensors).
    pub(crate) fn host(values: Vec<f32>, columns: usize) -> Self {
        let rows = values.len().checked_div(columns).unwrap_or(0);
        debug_assert_eq!(rows * columns, values.len(), "{} values are not rows of {columns}", values.len());
        Self { rows, columns, storage: Storage::Host(values) }
    }

    /// A device buffer of at least `rows · columns` f32.
    pub(crate) fn device(buffer: DeviceBuffer, rows: usize, columns: usize) -> Self {
        Self { rows, columns, storage: Storage::Device(buffer) }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn columns(&self) -> usize {
        self.columns
    }

    /// `rows · columns`.
    pub fn len(&self) -> usize {
        self.rows * self.columns
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A strided block inside a tensor's values: element `(i, j, w)` of a `[outer, inner, width]` block is at
/// `offset + i·outer_stride + j·inner_stride + w`. One block copy covers column slices, concatenation, row ranges
/// and the per-head interleaving of attention inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub offset: usize,
    pub outer_stride: usize,
    pub inner_stride: usize,
}

impl Block {
    /// Columns `start..` of each row of a `columns`-wide tensor, as an `[rows, 1, width]` block.
    pub fn columns(start: usize, columns: usize) -> Self {
        Self { offset: start, outer_stride: columns, inner_stride: 0 }
    }

    /// The last element a `[outer, inner, width]` block touches, plus one (0 for an empty block).
    pub fn end(&self, shape: [usize; 3]) -> usize {
        let [outer, inner, width] = shape;
        if outer == 0 || inner == 0 || width == 0 {
            return 0;
        }
        self.offset + (outer - 1) * self.outer_stride + (inner - 1) * self.inner_stride + width
    }
}

/// Host block copy: the CPU backend's, and the emulation-free reference of the device kernel.
pub(crate) fn copy_block(into: &mut [f32], to: Block, from: &[f32], at: Block, shape: [usize; 3]) {
    let [outer, inner, width] = shape;
    for i in 0..outer {
        for j in 0..inner {
            let source = at.offset + i * at.outer_stride + j * at.inner_stride;
            let target = to.offset + i * to.outer_stride + j * to.inner_stride;
            into[target..target + width].copy_from_slice(&from[source..source + width]);
        }
    }
}
