//! What parsing a `config.json` fails with: the key that is missing or whose value squeeze does not support.

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("missing key `{0}` (needed for this architecture); add it or use a complete config")]
    Missing(String),
    #[error("key `{key}` has an unsupported value {value}: {hint}")]
    Unsupported { key: String, value: String, hint: String },
}
