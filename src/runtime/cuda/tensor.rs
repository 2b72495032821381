//! Device-resident tensors of the CUDA backend and their data movement (kernels/tensor.cu): block copies, adds,
//! row gathers and in-order weighted row accumulation. Index lists travel as decisions ([`Traffic::Decisions`]).

use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape, Traffic};
use crate::runtime::tensor::{Block, Storage, Tensor};

use super::checks::unsupported;
use super::state::CudaBackend;

const THREADS: u32 = 256;
/// Grid-stride kernels launch at most this many blocks.
const MAX_BLOCKS: usize = 1 << 16;

/// The device buffer of a CUDA tensor.
pub(crate) fn buffer(tensor: &Tensor) -> Result<&DeviceBuffer, CudaError> {
    match &tensor.storage {
        Storage::Device(buffer) => Ok(buffer),
        Storage::Host(_) => Err(unsupported("tensor", "a host tensor was handed to the CUDA backend")),
    }
}

/// Checks the inputs of a per-sequence op: each `(name, tensor, width)` is `width` wide and holds the rows `rows`,
/// `tokens` of them.
pub(crate) fn sequence_inputs(
    op: &str,
    inputs: &[(&str, &Tensor, usize)],
    rows: &std::ops::Range<usize>,
    tokens: usize,
) -> Result<(), CudaError> {
    for &(name, tensor, width) in inputs {
        if tensor.columns() != width || tensor.rows() < rows.end || rows.len() != tokens {
            return Err(unsupported(
                op,
                format!(
                    "{name} is {}×{}, the shape needs rows {rows:?} ({tokens} tokens) of {width}",
                    tensor.rows(),
                    tensor.columns()
                ),
            ));
        }
    }
    Ok(())
}

/// A new `[rows, columns]` tensor (contents unspecified).
pub(crate) fn alloc(device: &dyn Device, rows: usize, columns: usize) -> Result<Tensor, CudaError> {
    // One element at least: an empty tensor still has a buffer to pass.
    let buffer = device.alloc_for::<f32>((rows * columns).max(1))?;
    Ok(Tensor::device(buffer, rows, columns))
}

fn blocks(count: usize) -> u32 {
    count.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32
}

fn long(value: usize) -> Arg<'static> {
    Arg::I64(value as i64)
}

/// Decision lists of 4-byte values (i32 indices, f32 weights) gathered into one upload: one host→device copy (on a
/// GPU, one wait for the stream) where each list would take its own. `push_*` return where a list starts in the
/// uploaded buffer, for [`Arg::At`].
#[derive(Default)]
pub(crate) struct DecisionPack {
    words: Vec<u32>,
}

impl DecisionPack {
    pub(crate) fn push_i32(&mut self, values: &[i32]) -> usize {
        let at = self.words.len() * 4;
        self.words.extend(values.iter().map(|&value| value as u32));
        at
    }

    pub(crate) fn push_f32(&mut self, values: &[f32]) -> usize {
        let at = self.words.len() * 4;
        self.words.extend(values.iter().map(|value| value.to_bits()));
        at
    }

    pub(crate) fn upload(&self, backend: &CudaBackend) -> Result<DeviceBuffer, CudaError> {
        backend.counted().upload_as(Traffic::Decisions, &self.words)
    }
}

/// Decision outputs of one launch brought back together: copied side by side on the device, then one download (on
/// a GPU, one wait for the stream) where each buffer would take its own. Each buffer's bytes, in order.
pub(crate) fn download_decisions<const N: usize>(
    backend: &CudaBackend,
    parts: [&DeviceBuffer; N],
) -> Result<[Vec<u8>; N], CudaError> {
    let device = backend.device();
    let joined = device.alloc(parts.iter().map(|part| part.bytes()).sum())?;
    let mut at = 0;
    for part in parts {
        device.copy(part, &joined, at)?;
        at += part.bytes();
    }
    let mut bytes = backend.counted().download_as::<u8>(Traffic::Decisions, &joined, at)?.into_iter();
    Ok(parts.map(|part| bytes.by_ref().take(part.bytes()).collect()))
}

/// Little-endian 4-byte words of a downloaded buffer.
pub(crate) fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks_exact(4).map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
}

/// Row indices as kernel `int`s.
fn indices(tensor: &str, rows: &[usize], limit: usize) -> Result<Vec<i32>, CudaError> {
    rows.iter()
        .map(|&row| {
            i32::try_from(row)
                .ok()
                .filter(|_| row < limit)
                .ok_or_else(|| unsupported(tensor, format!("row {row} is outside the {limit} rows")))
        })
        .collect()
}

/// [`crate::runtime::Backend::copy`] on the device.
pub fn copy(
    device: &dyn Device,
    into: &mut Tensor,
    to: Block,
    from: &Tensor,
    at: Block,
    shape: [usize; 3],
) -> Result<(), CudaError> {
    if to.end(shape) > into.len() || at.end(shape) > from.len() {
        return Err(unsupported(
            "copy",
            format!(
                "a {shape:?} block runs past a tensor ({} → {}, {} → {})",
                at.end(shape),
                from.len(),
                to.end(shape),
                into.len()
            ),
        ));
    }
    let count = shape.iter().product::<usize>();
    if count == 0 {
        return Ok(());
    }
    let args = [
        Arg::Buffer(buffer(into)?),
        long(to.offset),
        long(to.outer_stride),
        long(to.inner_stride),
        Arg::Buffer(buffer(from)?),
        long(at.offset),
        long(at.outer_stride),
        long(at.inner_stride),
        long(shape[0]),
        long(shape[1]),
        long(shape[2]),
    ];
    device.launch("copy_block_f32", LaunchShape::linear(blocks(count), THREADS), &args)
}

/// Rows `range` of `x` as a tensor of their own (a device copy; none when they are all of `x`'s rows).
pub fn row_range(device: &dyn Device, x: &Tensor, range: std::ops::Range<usize>) -> Result<Tensor, CudaError> {
    let columns = x.columns();
    let mut out = alloc(device, range.len(), columns)?;
    let at = Block { offset: range.start * columns, outer_stride: columns, inner_stride: 0 };
    copy(device, &mut out, Block::columns(0, columns), x, at, [range.len(), 1, columns])?;
    Ok(out)
}

/// [`crate::runtime::Backend::add`] on the device.
pub fn add(device: &dyn Device, into: &mut Tensor, from: &Tensor) -> Result<(), CudaError> {
    if into.len() != from.len() {
        return Err(unsupported("add", format!("{} values plus {}", into.len(), from.len())));
    }
    if into.is_empty() {
        return Ok(());
    }
    let args = [Arg::Buffer(buffer(into)?), Arg::Buffer(buffer(from)?), long(into.len())];
    device.launch("add_f32", LaunchShape::linear(blocks(into.len()), THREADS), &args)
}

/// [`crate::runtime::Backend::gather_rows`] on the device.
pub fn gather_rows(backend: &CudaBackend, x: &Tensor, rows: &[usize]) -> Result<Tensor, CudaError> {
    let device = backend.device();
    let out = alloc(device, rows.len(), x.columns())?;
    if rows.is_empty() || x.columns() == 0 {
        return Ok(out);
    }
    let list = backend.counted().upload_as(Traffic::Decisions, &indices("gather_rows", rows, x.rows())?)?;
    let count = rows.len() * x.columns();
    let args =
        [Arg::Buffer(buffer(&out)?), Arg::Buffer(buffer(x)?), Arg::Buffer(&list), long(rows.len()), long(x.columns())];
    device.launch("gather_rows_f32", LaunchShape::linear(blocks(count), THREADS), &args)?;
    Ok(out)
}

/// `into[target] += weight · from[source]` for each `(target, source, weight)`, each target's entries in list
/// order (kernel `accumulate_rows_f32`).
pub fn accumulate_rows(
    backend: &CudaBackend,
    into: &mut Tensor,
    from: &Tensor,
    entries: &[(usize, usize, f32)],
) -> Result<(), CudaError> {
    if into.columns() != from.columns() {
        return Err(unsupported("add_rows", format!("rows of {} added to rows of {}", from.columns(), into.columns())));
    }
    if entries.is_empty() || into.columns() == 0 {
        return Ok(());
    }
    // Per target row, its entries in order (a stable sort keeps list order within a target).
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&k| entries[k].0);
    let (mut targets, mut starts, mut sources, mut weights) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &k in &order {
        let (target, source, weight) = entries[k];
        if targets.last() != Some(&target) {
            targets.push(target);
            starts.push(sources.len());
        }
        sources.push(source);
        weights.push(weight);
    }
    starts.push(sources.len());
    let mut pack = DecisionPack::default();
    let targets_at = pack.push_i32(&indices("add_rows", &targets, into.rows())?);
    let starts_at = pack.push_i32(&indices("add_rows", &starts, usize::MAX)?);
    let sources_at = pack.push_i32(&indices("add_rows", &sources, from.rows())?);
    let weights_at = pack.push_f32(&weights);
    let lists = pack.upload(backend)?;
    let count = targets.len() * into.columns();
    let args = [
        Arg::Buffer(buffer(into)?),
        Arg::Buffer(buffer(from)?),
        Arg::At(&lists, targets_at),
        Arg::At(&lists, starts_at),
        Arg::At(&lists, sources_at),
        Arg::At(&lists, weights_at),
        long(targets.len()),
        long(into.columns()),
    ];
    backend.device().launch("accumulate_rows_f32", LaunchShape::linear(blocks(count), THREADS), &args)
}
