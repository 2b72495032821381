//! GPU memory sizes: named presets holding the total memory `nvidia-smi` reports, or a byte size.

use crate::units::parse_bytes;

const MIB: u64 = 1 << 20;

/// Name and total memory in MiB as `nvidia-smi --query-gpu=memory.total` prints it for the SXM parts.
pub const GPU_PRESETS: [(&str, u64); 3] = [("h100-80g", 81_559), ("h200-141g", 143_771), ("b200-180g", 183_359)];

/// The memory of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuMemory {
    /// The preset name, or the size as the user wrote it.
    pub name: String,
    pub bytes: u64,
}

/// Parses `--gpu-memory`: a preset name or a byte size such as `141GiB` or `80GB`.
pub fn parse_gpu_memory(text: &str) -> Result<GpuMemory, String> {
    let wanted = text.trim().to_ascii_lowercase();
    if let Some((name, mib)) = GPU_PRESETS.iter().find(|(name, _)| *name == wanted) {
        return Ok(GpuMemory { name: name.to_string(), bytes: mib * MIB });
    }
    let presets = GPU_PRESETS.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ");
    let bytes = parse_bytes(text).map_err(|problem| format!("{problem}; or name a GPU: {presets}"))?;
    Ok(GpuMemory { name: text.trim().to_string(), bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_nvidia_smi_totals() {
        assert_eq!(parse_gpu_memory("h200-141g").unwrap().bytes, 143_771 * MIB);
        assert_eq!(parse_gpu_memory("H100-80G").unwrap().bytes, 81_559 * MIB);
        assert_eq!(parse_gpu_memory("b200-180g").unwrap().bytes, 183_359 * MIB);
    }

    #[test]
    fn sizes_and_bad_names() {
        assert_eq!(parse_gpu_memory("141GiB").unwrap().bytes, 141 << 30);
        assert_eq!(parse_gpu_memory("80GB").unwrap().bytes, 80_000_000_000);
        let error = parse_gpu_memory("a100").unwrap_err();
        assert!(error.contains("h200-141g"), "{error}");
    }
}
