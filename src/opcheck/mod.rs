//! `squeeze selftest`'s checks: every kernel on a device (the GPU or the emulated device) against the CPU path on
//! random awkward shapes, then benchmarks.

pub mod backend_ops;
pub mod quantize_kernels;

use crate::runtime::device::DeviceInfo;

/// One line of the self-test table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SelftestRow {
    pub op: String,
    pub shape: String,
    /// max |gpu − cpu| over the tensor / max |cpu| (dequantized values), 0 when bit-identical.
    pub max_rel_error: f64,
    /// Elements (dequant) or groups (quantize) that differ from the CPU.
    pub mismatches: usize,
    pub passed: bool,
    pub seconds: Option<f64>,
    pub gb_per_s: Option<f64>,
    /// Share of the measured device copy bandwidth.
    pub copy_share: Option<f64>,
    pub note: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SelftestReport {
    /// The GPU; `None` on the emulated device.
    pub device: Option<DeviceInfo>,
    pub image: String,
    pub seed: u64,
    pub copy_gb_per_s: Option<f64>,
    pub rows: Vec<SelftestRow>,
    pub passed: bool,
}
