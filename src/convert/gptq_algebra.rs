//! Where the `gptq` method's algebra runs: on the host ([`crate::quant::gptq`] on faer) or, when the calibration
//! pass's backend runs on a device (`--device cuda`, or `emulated`), on that device ([`DeviceGptq`]: the Hessian
//! sums, the damped inverse's factor and the column loop with its block updates, in f64). Both give the same codes
//! but where a working value lands within rounding of a code boundary (tests/integration/gptq_device.rs bounds it).

use crate::quant::gptq::{self, Hessian, InverseFactor, Quantized};
use crate::quant::ScaleRule;
use crate::runtime::backend::Backend;
use crate::runtime::cuda::gptq::{DeviceFactor, DeviceGptq};

/// The host, or one device.
pub enum Algebra<'a> {
    Host,
    Device(DeviceGptq<'a>),
}

/// The damped inverse Hessian's factor where the algebra keeps it.
pub enum Factor {
    Host(InverseFactor),
    Device(DeviceFactor),
}

impl<'a> Algebra<'a> {
    /// The backend's device where it has one and every group size fits the device's column loop; the host otherwise.
    pub fn for_backend(backend: &'a dyn Backend, mut groups: impl Iterator<Item = usize>) -> Self {
        match backend.device() {
            Some(device) if groups.all(DeviceGptq::supports_group) => Algebra::Device(DeviceGptq::new(device)),
            _ => Algebra::Host,
        }
    }

    /// "host" or "device", for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Algebra::Host => "host",
            Algebra::Device(_) => "device",
        }
    }

    /// The factor of the damped inverse Hessian of `inputs` (row-major `[n, width]`).
    pub fn factor(&self, inputs: &[f32], width: usize, damping: f64) -> Result<Factor, String> {
        match self {
            Algebra::Host => {
                let mut hessian = Hessian::new(width);
                hessian.add(inputs);
                InverseFactor::new(&hessian, damping).map(Factor::Host).map_err(|e| e.to_string())
            }
            Algebra::Device(gptq) => {
                let mut hessian = gptq.hessian(width).map_err(|e| e.to_string())?;
                gptq.add(&mut hessian, inputs).map_err(|e| e.to_string())?;
                gptq.factor(&hessian, damping).map(Factor::Device).map_err(|e| e.to_string())
            }
        }
    }

    /// GPTQ of `weights` (row-major `[rows, columns]`) against `factor`, groups of `group` columns with scales
    /// chosen by `rule`, feedback in blocks of `block` columns.
    pub fn quantize(
        &self,
        weights: &[f32],
        (rows, columns): (usize, usize),
        factor: &Factor,
        (group, rule): (usize, ScaleRule),
        block: usize,
    ) -> Result<Quantized, String> {
        match (self, factor) {
            (Algebra::Host, Factor::Host(factor)) => {
                gptq::quantize_factored(weights, rows, columns, factor, group, rule, block).map_err(|e| e.to_string())
            }
            (Algebra::Device(gptq), Factor::Device(factor)) => {
                gptq.quantize(weights, (rows, columns), factor, (group, rule), block).map_err(|e| e.to_string())
            }
            _ => Err("a factor from another place than the algebra that quantizes".into()),
        }
    }
}
