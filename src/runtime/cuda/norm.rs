//! RMSNorm and LayerNorm on the device: kernels/norm.cu.

use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

use crate::runtime::matrix::Matrix;
use crate::runtime::tensor::Tensor;

use super::checks::unsupported;
use super::state::CudaBackend;
use super::tensor::buffer;
use crate::runtime::device::DeviceWeight;

/// Threads per block: one block per row.
const THREADS: u32 = 256;

/// Rows of `values` values of `width`, checked against the parameter vectors' lengths.
fn rows_of(tensor: &str, values: usize, width: usize, parameters: &[(&str, usize)]) -> Result<usize, CudaError> {
    if width == 0 || !values.is_multiple_of(width) {
        return Err(unsupported(tensor, format!("{values} values are not whole rows of width {width}")));
    }
    for &(name, length) in parameters {
        if length < width {
            return Err(unsupported(tensor, format!("{name} has {length} values, the rows have {width}")));
        }
    }
    Ok(values / width)
}

/// The launch of a row kernel over `rows` rows.
fn launch_rows(
    kernel: &str,
    device: &dyn Device,
    data: &DeviceBuffer,
    rows: usize,
    width: usize,
    parameters: &[&DeviceBuffer],
    eps: f32,
) -> Result<(), CudaError> {
    if data.bytes() < rows * width * 4 || parameters.iter().any(|p| p.bytes() < width * 4) {
        return Err(unsupported(kernel, format!("a buffer is smaller than {rows} rows × {width} values")));
    }
    if rows == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(rows).map_err(|_| unsupported(kernel, format!("{rows} rows exceed the grid")))?;
    let width = i32::try_from(width).map_err(|_| unsupported(kernel, format!("width {width} exceeds 32 bits")))?;
    let mut args = vec![Arg::Buffer(data)];
    args.extend(parameters.iter().map(|p| Arg::Buffer(p)));
    args.extend([Arg::I32(width), Arg::F32(eps)]);
    device.launch(kernel, LaunchShape::linear(blocks, THREADS), &args)
}

/// Device-level RMSNorm in place on `data[rows, width]` with f32 `weight[width]`.
pub fn rms_norm_f32(
    device: &dyn Device,
    data: &DeviceBuffer,
    rows: usize,
    width: usize,
    weight: &DeviceBuffer,
    eps: f32,
) -> Result<(), CudaError> {
    launch_rows("rms_norm_f32", device, data, rows, width, &[weight], eps)
}

/// Device-level LayerNorm in place on `data[rows, width]` with f32 `weight[width]` and `bias[width]`.
pub fn layer_norm_f32(
    device: &dyn Device,
    data: &DeviceBuffer,
    rows: usize,
    width: usize,
    weight: &DeviceBuffer,
    bias: &DeviceBuffer,
    eps: f32,
) -> Result<(), CudaError> {
    launch_rows("layer_norm_f32", device, data, rows, width, &[weight, bias], eps)
}

/// The resident f32 copy of a norm parameter vector.
fn parameter(backend: &CudaBackend, vector: &Matrix) -> Result<std::sync::Arc<DeviceWeight>, CudaError> {
    let weight = backend.weight(vector)?;
    match weight.as_ref() {
        DeviceWeight::Dense(_) => Ok(weight),
        DeviceWeight::Int4 { .. } | DeviceWeight::Bf16(_) | DeviceWeight::Bf16Pair(_) => {
            Err(unsupported("norm", "a norm parameter is not held as f32"))
        }
    }
}

fn dense(weight: &DeviceWeight) -> &DeviceBuffer {
    match weight {
        DeviceWeight::Dense(buffer) => buffer,
        // `parameter` refuses the other forms.
        DeviceWeight::Int4 { packed, .. } => packed,
        DeviceWeight::Bf16(buffer) | DeviceWeight::Bf16Pair(buffer) => buffer,
    }
}

/// RMSNorm of every `width`-wide slice of `x`, in place.
pub fn rms_norm(
    backend: &CudaBackend,
    x: &mut Tensor,
    width: usize,
    weight: &Matrix,
    eps: f32,
) -> Result<(), CudaError> {
    let rows = rows_of("rms_norm", x.len(), width, &[("weight", weight.values().len())])?;
    if rows == 0 {
        return Ok(());
    }
    let weight = parameter(backend, weight)?;
    rms_norm_f32(backend.device(), buffer(x)?, rows, width, dense(&weight), eps)
}

/// LayerNorm of every `width`-wide slice of `x`, in place.
pub fn layer_norm(
    backend: &CudaBackend,
    x: &mut Tensor,
    width: usize,
    weight: &Matrix,
    bias: &Matrix,
    eps: f32,
) -> Result<(), CudaError> {
    let rows =
        rows_of("layer_norm", x.len(), width, &[("weight", weight.values().len()), ("bias", bias.values().len())])?;
    if rows == 0 {
        return Ok(());
    }
    let (weight, bias) = (parameter(backend, weight)?, parameter(backend, bias)?);
    layer_norm_f32(backend.device(), buffer(x)?, rows, width, dense(&weight), dense(&bias), eps)
}
