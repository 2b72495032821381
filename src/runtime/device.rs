//! `--device` for the runtime commands (eval, calibrate-kv, serve-test): the CPU backend, the CUDA backend on the
//! GPU, or the CUDA backend on the emulated device.

use std::sync::Arc;

use crate::cuda::emulated::Emulator;
use crate::cuda::{select, CudaError, DeviceChoice, Selection};

use super::backend::Backend;
use super::cpu::Cpu;
use super::cuda::CudaBackend;

/// The backend `choice` names; `auto` falls back to the CPU with a one-line notice (returned, for stderr).
pub fn open_backend(choice: DeviceChoice) -> Result<(Box<dyn Backend>, Option<String>), CudaError> {
    if choice == DeviceChoice::Emulated {
        return Ok((Box::new(CudaBackend::new(Arc::new(Emulator::start()?))), None));
    }
    Ok(match select(choice)? {
        Selection::Cpu => (Box::new(Cpu), None),
        Selection::Gpu(gpu) => (Box::new(CudaBackend::new(Arc::new(*gpu))), None),
        Selection::CpuFallback(reason) => {
            (Box::new(Cpu), Some(format!("no usable GPU ({reason}); running on the CPU")))
        }
    })
}
