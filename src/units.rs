//! Byte sizes as users write them (`64MB`, `5GB`, `2GiB`, plain bytes) and as reports print them.

/// Parses a byte size: a number with an optional unit (B, KB, MB, GB, TB decimal; KiB, MiB, GiB, TiB binary).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.starts_with('-') {
        return Err(format!("must be a size of at least one byte, got {trimmed}"));
    }
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("`{text}` is not a size; write e.g. 5GB, 64MB, 2GiB or 1000000"))?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        other => return Err(format!("`{text}`: unknown unit `{other}`; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")),
    };
    let bytes = value * multiplier;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(format!("`{text}` must be at least one byte"));
    }
    Ok(bytes.round() as u64)
}

/// `12.34 GB (11.49 GiB)`.
pub fn both_units(bytes: u64) -> String {
    format!("{:.2} GB ({:.2} GiB)", bytes as f64 / 1e9, bytes as f64 / (1u64 << 30) as f64)
}

/// A compact human size in decimal units.
pub fn human(bytes: u64) -> String {
    let value = bytes as f64;
    if value >= 1e9 {
        format!("{:.2} GB", value / 1e9)
    } else if value >= 1e6 {
        format!("{:.2} MB", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1} kB", value / 1e3)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("5GB").unwrap(), 5_000_000_000);
        assert_eq!(parse_bytes("64MB").unwrap(), 64_000_000);
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("1234").unwrap(), 1234);
        assert_eq!(parse_bytes("141GiB").unwrap(), 141 << 30);
        assert!(parse_bytes("5XB").is_err());
        assert!(parse_bytes("abc").is_err());
        assert!(parse_bytes("0").is_err());
    }
}
