//! The one SIMD detection: the widest vector instruction set level this CPU offers, detected once ([`level`]). Every
//! vectorized path (the FP8, INT4 and FP4 quantizers, the FP8 row reader, the CPU backend's kernels) asks it; each
//! level's code gives the same bits as the portable code, so the level decides speed only.

use std::sync::OnceLock;

/// Vector instruction set levels, narrowest first; each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// No vector path: the portable code.
    Portable,
    /// x86-64 AVX2 with FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64 AVX-512 F and BW, with AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// This CPU's level (detected on the first call).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma");
        if avx2 && has!("avx512f") && has!("avx512bw") {
            return Level::Avx512;
        }
        if avx2 {
            return Level::Avx2;
        }
    }
    Level::Portable
}
