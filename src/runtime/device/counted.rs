//! A device that counts what crosses the bus: host↔device copies by kind of data (activations, weights, decisions)
//! and kernel launches. The CUDA runtime backend runs every op through one, so `eval`, `serve-test` and `selftest`
//! can say how often an op surface synchronizes with the host, on a GPU and on the emulated device alike.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use super::{bytes_of, bytes_of_mut, Arg, CudaError, Device, DeviceBuffer, GemmBf16, LaunchShape, Plain};

/// What a copy carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// Hidden states and their intermediates: what a device-resident op surface keeps on the device.
    Activations,
    /// Weights (and tables used like weights: RoPE tables, norm vectors), uploaded once per loaded matrix.
    Weights,
    /// Decisions the host takes or hands over: routing choices, DSA key masks, expert token lists, page tables.
    Decisions,
}

#[derive(Default)]
struct DirectionCounters {
    h2d_count: AtomicU64,
    h2d_bytes: AtomicU64,
    d2h_count: AtomicU64,
    d2h_bytes: AtomicU64,
}

impl DirectionCounters {
    fn snapshot(&self) -> Direction {
        Direction {
            h2d_count: self.h2d_count.load(Ordering::Relaxed),
            h2d_bytes: self.h2d_bytes.load(Ordering::Relaxed),
            d2h_count: self.d2h_count.load(Ordering::Relaxed),
            d2h_bytes: self.d2h_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Copies of one kind of data, each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Direction {
    pub h2d_count: u64,
    pub h2d_bytes: u64,
    pub d2h_count: u64,
    pub d2h_bytes: u64,
}

impl Direction {
    /// Copies either way.
    pub fn count(&self) -> u64 {
        self.h2d_count + self.d2h_count
    }

    fn minus(&self, earlier: &Direction) -> Direction {
        Direction {
            h2d_count: self.h2d_count - earlier.h2d_count,
            h2d_bytes: self.h2d_bytes - earlier.h2d_bytes,
            d2h_count: self.d2h_count - earlier.d2h_count,
            d2h_bytes: self.d2h_bytes - earlier.d2h_bytes,
        }
    }
}

/// Host↔device copies by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Transfers {
    pub activations: Direction,
    pub weights: Direction,
    pub decisions: Direction,
}

/// What a device backend did so far: `device` in `eval --json`, `serve-test --json` and `selftest --json`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceCounters {
    pub transfers: Transfers,
    pub launches: u64,
}

impl DeviceCounters {
    /// Adds what happened between `earlier` and `later` (e.g. the decode steps of a run).
    pub fn add_span(&mut self, earlier: &DeviceCounters, later: &DeviceCounters) {
        let span = later.since(earlier);
        let add = |total: &mut Direction, part: &Direction| {
            total.h2d_count += part.h2d_count;
            total.h2d_bytes += part.h2d_bytes;
            total.d2h_count += part.d2h_count;
            total.d2h_bytes += part.d2h_bytes;
        };
        add(&mut self.transfers.activations, &span.transfers.activations);
        add(&mut self.transfers.weights, &span.transfers.weights);
        add(&mut self.transfers.decisions, &span.transfers.decisions);
        self.launches += span.launches;
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            transfers: Transfers {
                activations: self.transfers.activations.minus(&earlier.transfers.activations),
                weights: self.transfers.weights.minus(&earlier.transfers.weights),
                decisions: self.transfers.decisions.minus(&earlier.transfers.decisions),
            },
            launches: self.launches - earlier.launches,
        }
    }
}

/// A [`Device`] that counts. Plain writes and reads count as activations, resident uploads as weights; decisions go
/// through [`Counted::upload_as`] / [`Counted::download_as`].
pub struct Counted {
    inner: Arc<dyn Device>,
    activations: DirectionCounters,
    weights: DirectionCounters,
    decisions: DirectionCounters,
    launches: AtomicU64,
}

impl Counted {
    pub fn new(inner: Arc<dyn Device>) -> Self {
        Self {
            inner,
            activations: DirectionCounters::default(),
            weights: DirectionCounters::default(),
            decisions: DirectionCounters::default(),
            launches: AtomicU64::new(0),
        }
    }

    fn counters(&self, traffic: Traffic) -> &DirectionCounters {
        match traffic {
            Traffic::Activations => &self.activations,
            Traffic::Weights => &self.weights,
            Traffic::Decisions => &self.decisions,
        }
    }

    fn count_h2d(&self, traffic: Traffic, bytes: usize) {
        let counters = self.counters(traffic);
        counters.h2d_count.fetch_add(1, Ordering::Relaxed);
        counters.h2d_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn count_d2h(&self, traffic: Traffic, bytes: usize) {
        let counters = self.counters(traffic);
        counters.d2h_count.fetch_add(1, Ordering::Relaxed);
        counters.d2h_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A new buffer holding `values`, counted as `traffic`.
    pub fn upload_as<T: Plain>(&self, traffic: Traffic, values: &[T]) -> Result<DeviceBuffer, CudaError> {
        let buffer = self.inner.alloc(std::mem::size_of_val(values))?;
        self.inner.write(&buffer, bytes_of(values))?;
        self.count_h2d(traffic, std::mem::size_of_val(values));
        Ok(buffer)
    }

    /// The first `count` elements of `buffer`, counted as `traffic`.
    pub fn download_as<T: Plain>(
        &self,
        traffic: Traffic,
        buffer: &DeviceBuffer,
        count: usize,
    ) -> Result<Vec<T>, CudaError> {
        let mut out = vec![T::default(); count];
        self.inner.read(buffer, bytes_of_mut(&mut out))?;
        self.count_d2h(traffic, std::mem::size_of_val(out.as_slice()));
        Ok(out)
    }

    /// This device with every plain copy counted as a decision (page tables, block tables, masks, slot lists, fault
    /// flags); weight uploads and launches count as usual.
    pub fn decisions(&self) -> Decisions<'_> {
        Decisions(self)
    }

    /// The counts so far.
    pub fn counters_now(&self) -> DeviceCounters {
        DeviceCounters {
            transfers: Transfers {
                activations: self.activations.snapshot(),
                weights: self.weights.snapshot(),
                decisions: self.decisions.snapshot(),
            },
            launches: self.launches.load(Ordering::Relaxed),
        }
    }
}

impl Device for Counted {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        self.inner.alloc(bytes)
    }

    fn write(&self, buffer: &DeviceBuffer, bytes: &[u8]) -> Result<(), CudaError> {
        self.inner.write(buffer, bytes)?;
        self.count_h2d(Traffic::Activations, bytes.len());
        Ok(())
    }

    fn read(&self, buffer: &DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError> {
        self.inner.read(buffer, out)?;
        self.count_d2h(Traffic::Activations, out.len());
        Ok(())
    }

    fn upload_bytes_resident(&self, bytes: &[u8]) -> Result<DeviceBuffer, CudaError> {
        let buffer = self.inner.upload_bytes_resident(bytes)?;
        self.count_h2d(Traffic::Weights, bytes.len());
        Ok(buffer)
    }

    fn copy(&self, source: &DeviceBuffer, target: &DeviceBuffer, offset: usize) -> Result<(), CudaError> {
        self.inner.copy(source, target, offset)
    }

    fn launch(&self, kernel: &str, shape: LaunchShape, args: &[Arg]) -> Result<(), CudaError> {
        self.inner.launch(kernel, shape, args)?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Counts one launch per GEMM (cuBLAS may run more than one kernel for it).
    fn gemm_bf16(&self, gemm: &GemmBf16) -> Result<(), CudaError> {
        self.inner.gemm_bf16(gemm)?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// [`Counted::decisions`].
pub struct Decisions<'a>(&'a Counted);

impl Device for Decisions<'_> {
    fn describe(&self) -> String {
        self.0.describe()
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        self.0.alloc(bytes)
    }

    fn write(&self, buffer: &DeviceBuffer, bytes: &[u8]) -> Result<(), CudaError> {
        self.0.inner.write(buffer, bytes)?;
        self.0.count_h2d(Traffic::Decisions, bytes.len());
        Ok(())
    }

    fn read(&self, buffer: &DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError> {
        self.0.inner.read(buffer, out)?;
        self.0.count_d2h(Traffic::Decisions, out.len());
        Ok(())
    }

    fn upload_bytes_resident(&self, bytes: &[u8]) -> Result<DeviceBuffer, CudaError> {
        self.0.upload_bytes_resident(bytes)
    }

    fn copy(&self, source: &DeviceBuffer, target: &DeviceBuffer, offset: usize) -> Result<(), CudaError> {
        self.0.copy(source, target, offset)
    }

    fn launch(&self, kernel: &str, shape: LaunchShape, args: &[Arg]) -> Result<(), CudaError> {
        self.0.launch(kernel, shape, args)
    }

    fn gemm_bf16(&self, gemm: &GemmBf16) -> Result<(), CudaError> {
        self.0.gemm_bf16(gemm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::device::emulated::Emulator;

    #[test]
    fn each_kind_of_copy_is_counted_in_its_own_column() {
        let device = Counted::new(Arc::new(Emulator::start().unwrap()));
        let dyn_device: &dyn Device = &device;
        let activations = dyn_device.upload(&[1f32, 2.0, 3.0]).unwrap();
        let _weights = dyn_device.upload_resident(&[7u16; 5]).unwrap();
        let decisions = device.upload_as(Traffic::Decisions, &[4u32, 5]).unwrap();
        let view = device.decisions();
        let viewed = (&view as &dyn Device).upload(&[6u32]).unwrap();
        assert_eq!((&view as &dyn Device).download::<u32>(&viewed, 1).unwrap(), [6]);
        assert_eq!(dyn_device.download::<f32>(&activations, 3).unwrap(), [1.0, 2.0, 3.0]);
        assert_eq!(device.download_as::<u32>(Traffic::Decisions, &decisions, 2).unwrap(), [4, 5]);
        let counters = device.counters_now();
        let expected =
            |h2d_count, h2d_bytes, d2h_count, d2h_bytes| Direction { h2d_count, h2d_bytes, d2h_count, d2h_bytes };
        assert_eq!(counters.transfers.activations, expected(1, 12, 1, 12));
        assert_eq!(counters.transfers.weights, expected(1, 10, 0, 0));
        assert_eq!(counters.transfers.decisions, expected(2, 12, 2, 12));
        assert_eq!(counters.launches, 0);
        assert_eq!(counters.since(&counters), DeviceCounters::default());
    }
}
