//! Keeps freed heap memory in the process during layer-streamed passes (glibc): every op of a pass allocates
//! activations of a few MiB and frees them soon after, and with glibc's default thresholds that memory went back to
//! the kernel and came back as fresh zeroed pages on the next op: 75 % of a CPU eval's page faults and ~7 % of its
//! CPU time (system time) on the realistic-width Kimi layout (BENCHMARKS.md, issue 19). The calibration passes
//! (GPTQ's Hessians, factors and gathered inputs of a few MiB per expert) hit the same: 20 % of a GPTQ run's CPU
//! time was system time (BENCHMARKS.md, issue 34).

/// Once per process: raises glibc's trim threshold (free memory at the top of a heap kept instead of returned) to
/// 256 MiB and pads each heap growth by 64 MiB; serves allocations below 32 MiB (glibc's largest mmap threshold)
/// from the heaps instead of fresh mappings (setting the trim threshold turns glibc's adaptive mmap threshold off,
/// leaving it at 128 KiB); and keeps one heap (arena) for all threads: the passes allocate a few large buffers per
/// op, not many small ones, so threads seldom wait for it, while every further heap keeps its own freed memory
/// (with one per worker, peak RSS of the same GPTQ run varied by 23 % from run to run: BENCHMARKS.md, issue 34).
/// Takes full effect only when called before other threads allocate (`cli` calls it first for the commands that
/// run passes). The streamed weights are not affected (FP8 codes are read in place from the mapped checkpoint,
/// and the layers' own memory is bounded by the stream). A no-op elsewhere than Linux with glibc.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static DONE: std::sync::Once = std::sync::Once::new();
        DONE.call_once(|| {
            // SAFETY: mallopt only changes glibc's allocator parameters; every value is in range (32 MiB is
            // glibc's HEAP_MAX_SIZE / 2 on 64-bit, the largest mmap threshold it accepts).
            unsafe {
                libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
                libc::mallopt(libc::M_TOP_PAD, 64 << 20);
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_ARENA_MAX, 1);
            }
        });
    }
}
