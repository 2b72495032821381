//! Timing device launches for the perf rows: best of three rounds, the device drained around each.

use std::time::Instant;

use crate::runtime::device::{CudaError, Device, DeviceBuffer};

/// Seconds per call of `launch` (best of 3 rounds of `repeats` calls), with the device drained around each round.
pub fn time_launches(
    device: &dyn Device,
    fence: &DeviceBuffer,
    repeats: usize,
    mut launch: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let mut best = f64::INFINITY;
    launch()?; // warm-up (module load, caches)
    for _ in 0..3 {
        device.download::<u8>(fence, 1)?;
        let started = Instant::now();
        for _ in 0..repeats {
            launch()?;
        }
        device.download::<u8>(fence, 1)?;
        best = best.min(started.elapsed().as_secs_f64() / repeats as f64);
    }
    Ok(best)
}
