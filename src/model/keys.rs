//! Reading `config.json` keys: numbers, flags and pairs, each error naming its key (the readers that build parts of
//! a `ModelConfig` are in [`super::part_keys`]).

use serde_json::Value;

use super::config_error::ConfigError;

/// A `[rows, columns]` pair under `key` of `object`.
pub(super) fn pair_of(object: Option<&Value>, key: &str) -> Option<[usize; 2]> {
    match object?.get(key)?.as_array()?.as_slice() {
        [rows, columns] => Some([rows.as_u64()? as usize, columns.as_u64()? as usize]),
        _ => None,
    }
}

pub(super) struct Keys<'a>(pub(super) &'a Value);

impl Keys<'_> {
    pub(super) fn optional_usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value.as_u64().map(|v| Some(v as usize)).ok_or_else(|| ConfigError::Unsupported {
                key: key.into(),
                value: value.to_string(),
                hint: "expected a non-negative integer".into(),
            }),
        }
    }

    pub(super) fn usize(&self, key: &str) -> Result<usize, ConfigError> {
        self.optional_usize(key)?.ok_or_else(|| ConfigError::Missing(key.into()))
    }

    pub(super) fn bool_or(&self, key: &str, default: bool) -> bool {
        self.0.get(key).and_then(Value::as_bool).unwrap_or(default)
    }

    /// `partial_rotary_factor` at top level or inside `rope_parameters` (transformers v5 style).
    pub(super) fn partial_rotary_factor(&self) -> Option<f64> {
        self.0
            .get("partial_rotary_factor")
            .or_else(|| self.0.get("rope_parameters").and_then(|r| r.get("partial_rotary_factor")))
            .and_then(Value::as_f64)
    }

    pub(super) fn f64_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(value) => value.as_f64().ok_or_else(|| ConfigError::Unsupported {
                key: key.into(),
                value: value.to_string(),
                hint: "expected a number".into(),
            }),
        }
    }
}
