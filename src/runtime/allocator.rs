//! Keeps freed heap memory in the process during layer-streamed passes (glibc): every op of a pass allocates
//! activations of a few MiB and frees them soon after, and with glibc's default thresholds that memory went back to
//! the kernel and came back as fresh zeroed pages on the next op: 75 % of a CPU eval's page faults and ~7 % of its
//! CPU time (system time) on the realistic-width Kimi layout (BENCHMARKS.md, issue 19).

/// Raises glibc's trim threshold (free memory at the top of a heap kept instead of returned) to 256 MiB and pads
/// each heap growth by 64 MiB, once per process. The streamed weights are not affected (FP8 codes are read in place
/// from the mapped checkpoint, and the layers' own memory is bounded by the stream); a process keeps at most that
/// much freed memory. A no-op elsewhere than Linux with glibc.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static DONE: std::sync::Once = std::sync::Once::new();
        DONE.call_once(|| {
            // SAFETY: mallopt only changes glibc's allocator parameters; both values are in range.
            unsafe {
                libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
                libc::mallopt(libc::M_TOP_PAD, 64 << 20);
            }
        });
    }
}
