//! The CUDA backend's ops against the CPU backend (the oracle) on random awkward shapes: on the emulated device
//! always (kernels/*.cu compiled for the host), and on a real GPU too when one is usable (skipped with a printed
//! reason otherwise). Tolerances are named with the reason for their size.

use std::sync::Arc;

use squeeze::runtime::cuda::CudaBackend;
use squeeze::runtime::device::emulated::Emulator;
use squeeze::runtime::{Backend, Cpu};

/// The backends under test: emulated always, the GPU when the probe finds one.
pub fn cuda_backends() -> Vec<CudaBackend> {
    let mut backends =
        vec![CudaBackend::new(Arc::new(Emulator::start().expect("the kernel emulator builds and starts")))];
    match squeeze::runtime::device::Gpu::open(0) {
        Ok(gpu) => backends.push(CudaBackend::new(Arc::new(gpu))),
        Err(reason) => eprintln!("real-GPU twin skipped: {reason}"),
    }
    backends
}

/// xorshift64*: fixed seeds, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn signed(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn values(&mut self, count: usize, scale: f32) -> Vec<f32> {
        (0..count).map(|_| self.signed() * scale).collect()
    }
}

/// Relative L2 error of `got` against `want`, and the largest absolute difference.
pub fn errors(got: &[f32], want: &[f32]) -> (f64, f64) {
    assert_eq!(got.len(), want.len(), "output length");
    let (mut diff, mut norm, mut max_abs) = (0f64, 0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output {g} (want {w})");
        let d = (g as f64 - w as f64).abs();
        diff += d * d;
        norm += (w as f64) * (w as f64);
        max_abs = max_abs.max(d);
    }
    ((diff / norm.max(1e-30)).sqrt(), max_abs)
}

/// Elementwise ops differ from the CPU only by the exponential's last bit.
const ELEMENTWISE_REL_L2: f64 = 1e-6;

#[test]
fn silu_mul_matches_cpu() {
    let mut rng = Rng(7);
    let count = 1000 * 3 + 17;
    let gate = rng.values(count, 6.0);
    let up = rng.values(count, 2.0);
    let want = Cpu.silu_mul(&gate, &up);
    for backend in cuda_backends() {
        let got = backend.silu_mul(&gate, &up);
        assert_eq!(backend.failure(), None);
        let (rel, max_abs) = errors(&got, &want);
        assert!(rel < ELEMENTWISE_REL_L2, "silu_mul rel L2 {rel:e} (max abs {max_abs:e})");
    }
}
