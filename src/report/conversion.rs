//! How long a conversion takes, before booking machines: per part, the time to read its share of the source, to
//! write its share of the output and to compute (CPU core-seconds per GB of input measured in BENCHMARKS.md, over
//! the cores given; on a GPU the kernels are taken as faster than the disk), the largest of the three since
//! `quantize` overlaps them, and how many parts the plan allows (one shard each at most).

use serde::Serialize;

/// CPU cost of the non-`mse` work (FP8 → BF16 dequant, `ct-minmax`/`absmax7` INT4, copies) per GB of input, in
/// core-seconds: (4.24 s user + 5.27 s system) / 2.57 GB on the GLM-5-shaped synthetic input (BENCHMARKS.md,
/// "Projection to GLM-5"; measured under load, so an idle core does better).
pub const MINMAX_CORE_SECONDS_PER_GB: f64 = 3.7;
/// CPU cost of `--scale-rule mse` INT4 per GB of its input, in core-seconds: (39.2 + 4.0) s / 2.57 GB (same run).
pub const MSE_CORE_SECONDS_PER_GB: f64 = 16.8;

/// Where INT4 quantization runs in the estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum QuantizeOn {
    Cpu,
    Gpu,
}

/// What the estimate assumes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Machine {
    /// Bytes per second one part reads the source at (its share of shared storage, or its own disk).
    pub read_bytes_per_second: f64,
    pub write_bytes_per_second: f64,
    /// CPU cores per part.
    pub cores: usize,
    pub quantize_on: QuantizeOn,
    /// Parts the conversion is split into (`quantize --part I/N`).
    pub parts: usize,
}

/// The estimate `report` prints.
#[derive(Debug, Clone, Serialize)]
pub struct ConversionEstimate {
    pub machine: Machine,
    /// The plan's shards: the most parts a conversion splits into.
    pub max_parts: usize,
    /// Whether more parts were asked for than the plan allows (`machine.parts` is then `max_parts`).
    pub capped: bool,
    /// Source bytes one part reads and output bytes it writes (the largest part's, by shard count).
    pub read_bytes_per_part: u64,
    pub write_bytes_per_part: u64,
    pub read_seconds: f64,
    pub write_seconds: f64,
    /// CPU compute (0 on a GPU: on an H200 the INT4 kernel quantizes 482 GB/s of FP8, far above any disk; the
    /// whole GPU quantize measured 1.28× read + write there, so reading and writing overlapped less than this
    /// estimate assumes: BENCHMARKS.md, "GPU (H200): the first runs").
    pub compute_seconds: f64,
    /// The largest of the three: reading, computing and writing overlap.
    pub seconds_per_part: f64,
    /// `read`, `write` or `compute`.
    pub bound_by: &'static str,
    /// `seconds_per_part × parts`: the machine time booked.
    pub machine_seconds: f64,
}

/// The estimate for a plan of `shards` shards reading `input_bytes` (of which `mse_bytes` go through the `mse`
/// search) and writing `output_bytes`.
pub fn estimate(
    input_bytes: u64,
    mse_bytes: u64,
    output_bytes: u64,
    shards: usize,
    machine: Machine,
) -> ConversionEstimate {
    let parts = machine.parts.clamp(1, shards.max(1));
    // The largest part holds ceil(shards / parts) shards; bytes are taken as even across shards.
    let share = shards.div_ceil(parts) as f64 / shards.max(1) as f64;
    let read = input_bytes as f64 * share;
    let write = output_bytes as f64 * share;
    let read_seconds = read / machine.read_bytes_per_second.max(1.0);
    let write_seconds = write / machine.write_bytes_per_second.max(1.0);
    let compute_seconds = match machine.quantize_on {
        QuantizeOn::Gpu => 0.0,
        QuantizeOn::Cpu => {
            let gb = |bytes: u64| bytes as f64 * share / 1e9;
            let core_seconds = gb(mse_bytes) * MSE_CORE_SECONDS_PER_GB
                + gb(input_bytes.saturating_sub(mse_bytes)) * MINMAX_CORE_SECONDS_PER_GB;
            core_seconds / machine.cores.max(1) as f64
        }
    };
    let (bound_by, seconds_per_part) = [("read", read_seconds), ("write", write_seconds), ("compute", compute_seconds)]
        .into_iter()
        .fold(("read", 0.0), |best, (name, seconds)| if seconds > best.1 { (name, seconds) } else { best });
    ConversionEstimate {
        machine: Machine { parts, ..machine },
        max_parts: shards,
        capped: machine.parts > parts,
        read_bytes_per_part: read as u64,
        write_bytes_per_part: write as u64,
        read_seconds,
        write_seconds,
        compute_seconds,
        seconds_per_part,
        bound_by,
        machine_seconds: seconds_per_part * parts as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(parts: usize, quantize_on: QuantizeOn) -> Machine {
        Machine { read_bytes_per_second: 2e9, write_bytes_per_second: 1e9, cores: 64, quantize_on, parts }
    }

    #[test]
    fn the_slowest_of_read_write_and_compute_sets_the_time() {
        // GLM-5: 757 GB in, 452 GB out, 91 shards of 5 GB.
        let one = estimate(757_000_000_000, 0, 452_000_000_000, 91, machine(1, QuantizeOn::Cpu));
        assert_eq!(one.bound_by, "write");
        assert!((one.seconds_per_part - 452.0).abs() < 1e-6, "{}", one.seconds_per_part);
        assert!((one.compute_seconds - 757.0 * MINMAX_CORE_SECONDS_PER_GB / 64.0).abs() < 1e-6);
        // All mse on 4 cores: compute-bound.
        let mse = estimate(
            757_000_000_000,
            700_000_000_000,
            452_000_000_000,
            91,
            Machine { cores: 4, ..machine(1, QuantizeOn::Cpu) },
        );
        assert_eq!(mse.bound_by, "compute");
        assert_eq!(
            estimate(757_000_000_000, 700_000_000_000, 452_000_000_000, 91, machine(1, QuantizeOn::Gpu))
                .compute_seconds,
            0.0
        );
        // Seven parts of 91 shards: 13 shards each; more parts than shards are capped.
        let seven = estimate(757_000_000_000, 0, 452_000_000_000, 91, machine(7, QuantizeOn::Cpu));
        assert!((seven.seconds_per_part * 7.0 - one.seconds_per_part).abs() < 1e-6);
        assert_eq!(estimate(1, 0, 1, 3, machine(10, QuantizeOn::Cpu)).machine.parts, 3);
    }
}
