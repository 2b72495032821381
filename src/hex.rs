//! Lower-case hex of a digest (SHA-256 in manifests, recipes, parts, calibration records).

/// `[0x0a, 0xff]` → `"0aff"`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
