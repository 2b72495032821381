//! A device that counts what crosses the bus: host↔device copies by kind of data (activations, weights, decisions)
//! and kernel launches. The CUDA runtime backend runs every op through one, so `eval`, `serve-test` and `selftest`
//! can say how often an op surface synchronizes with the host, on a GPU and on the emulated device alike. Each
//! activation or decision copy first waits for the device's queued work, then is timed alone, so the time spent
//! copying (a decode step's share in transfers) is told apart from the time spent waiting for kernels.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{bytes_of, bytes_of_mut, Arg, CudaError, Device, DeviceBuffer, GemmBf16, GemmF64, LaunchShape, Plain};

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DeviceCounters {
    pub transfers: Transfers,
    pub launches: u64,
    /// Seconds in activation and decision copies, each timed after the device finished its earlier work.
    pub copy_seconds: f64,
    /// Seconds the host waited, before those copies, for the device to finish its earlier work (kernels).
    pub wait_seconds: f64,
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
        self.copy_seconds += span.copy_seconds;
        self.wait_seconds += span.wait_seconds;
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
            copy_seconds: self.copy_seconds - earlier.copy_seconds,
            wait_seconds: self.wait_seconds - earlier.wait_seconds,
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
    copy_nanos: AtomicU64,
    wait_nanos: AtomicU64,
}

impl Counted {
    pub fn new(inner: Arc<dyn Device>) -> Self {
        Self {
            inner,
            activations: DirectionCounters::default(),
            weights: DirectionCounters::default(),
            decisions: DirectionCounters::default(),
            launches: AtomicU64::new(0),
            copy_nanos: AtomicU64::new(0),
            wait_nanos: AtomicU64::new(0),
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

    /// Waits for the device's earlier work, then runs `copy` (a write or a read of the inner device) timed alone.
    fn timed(&self, copy: impl FnOnce(&dyn Device) -> Result<(), CudaError>) -> Result<(), CudaError> {
        let nanos = |time: Duration| u64::try_from(time.as_nanos()).unwrap_or(u64::MAX);
        let start = Instant::now();
        self.inner.synchronize()?;
        let synchronized = Instant::now();
        copy(self.inner.as_ref())?;
        self.wait_nanos.fetch_add(nanos(synchronized - start), Ordering::Relaxed);
        self.copy_nanos.fetch_add(nanos(synchronized.elapsed()), Ordering::Relaxed);
        Ok(())
    }

    fn write_as(&self, traffic: Traffic, buffer: &DeviceBuffer, bytes: &[u8]) -> Result<(), CudaError> {
        self.timed(|inner| inner.write(buffer, bytes))?;
        self.count_h2d(traffic, bytes.len());
        Ok(())
    }

    fn read_as(&self, traffic: Traffic, buffer: &DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError> {
        self.timed(|inner| inner.read(buffer, out))?;
        self.count_d2h(traffic, out.len());
        Ok(())
    }

    /// A new buffer holding `values`, counted as `traffic`.
    pub fn upload_as<T: Plain>(&self, traffic: Traffic, values: &[T]) -> Result<DeviceBuffer, CudaError> {
        let buffer = self.inner.alloc(std::mem::size_of_val(values))?;
        self.write_as(traffic, &buffer, bytes_of(values))?;
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
        self.read_as(traffic, buffer, bytes_of_mut(&mut out))?;
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
            copy_seconds: self.copy_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            wait_seconds: self.wait_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
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
        self.write_as(Traffic::Activations, buffer, bytes)
    }

    fn read(&self, buffer: &DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError> {
        self.read_as(Traffic::Activations, buffer, out)
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.inner.synchronize()
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

    /// Counts one launch per GEMM.
    fn gemm_f64(&self, gemm: &GemmF64) -> Result<(), CudaError> {
        self.inner.gemm_f64(gemm)?;
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
        self.0.write_as(Traffic::Decisions, buffer, bytes)
    }

    fn read(&self, buffer: &DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError> {
        self.0.read_as(Traffic::Decisions, buffer, out)
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.0.synchronize()
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

    fn gemm_f64(&self, gemm: &GemmF64) -> Result<(), CudaError> {
        self.0.gemm_f64(gemm)
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

    /// A device whose copies take a millisecond per byte and whose synchronization takes 30 ms.
    struct Slow;

    impl Device for Slow {
        fn describe(&self) -> String {
            "slow".into()
        }
        fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
            Ok(DeviceBuffer::new(bytes, Box::new(())))
        }
        fn write(&self, _: &DeviceBuffer, bytes: &[u8]) -> Result<(), CudaError> {
            std::thread::sleep(Duration::from_millis(bytes.len() as u64));
            Ok(())
        }
        fn read(&self, _: &DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError> {
            std::thread::sleep(Duration::from_millis(out.len() as u64));
            Ok(())
        }
        fn synchronize(&self) -> Result<(), CudaError> {
            std::thread::sleep(Duration::from_millis(30));
            Ok(())
        }
        fn copy(&self, _: &DeviceBuffer, _: &DeviceBuffer, _: usize) -> Result<(), CudaError> {
            Ok(())
        }
        fn launch(&self, _: &str, _: LaunchShape, _: &[Arg]) -> Result<(), CudaError> {
            Ok(())
        }
    }

    #[test]
    fn activation_and_decision_copies_are_timed_apart_from_the_wait_for_kernels() {
        let device = Counted::new(Arc::new(Slow));
        let dyn_device: &dyn Device = &device;
        let activations = dyn_device.upload(&[0u8; 8]).unwrap();
        let decisions = device.upload_as(Traffic::Decisions, &[0u8; 4]).unwrap();
        dyn_device.download::<u8>(&activations, 8).unwrap();
        device.download_as::<u8>(Traffic::Decisions, &decisions, 4).unwrap();
        // A weight upload (1 s here) is not an activation or decision copy: `uploads` in eval times those.
        let _weights = dyn_device.upload_resident(&[0u8; 1000]).unwrap();
        let counters = device.counters_now();
        // Four copies of 8 + 4 + 8 + 4 ms, each after a 30 ms synchronization that is not theirs.
        assert!(counters.copy_seconds >= 0.024 && counters.copy_seconds < 0.1, "{counters:?}");
        assert!(counters.wait_seconds >= 0.120, "{counters:?}");
        let span = counters.since(&DeviceCounters::default());
        assert_eq!((span.copy_seconds, span.wait_seconds), (counters.copy_seconds, counters.wait_seconds));
    }
}
