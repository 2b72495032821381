//! INT4 scale rules: how a group's scale is chosen from its values (the scale is always stored as BF16).

use std::fmt;
use std::str::FromStr;

/// How the scale of one INT4 group is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleRule {
    /// compressed-tensors' default: `absmax / 7.5`, q clamped to [-8, 7].
    CtMinmax,
    /// `absmax / 7`, q in [-7, 7]: 15 symmetric levels (what Kimi's QAT weights use).
    Absmax7,
    /// Error-minimising clip search over shrink factors (llm-compressor's `mse` observer).
    Mse,
}

/// Parameters of the `mse` rule, as llm-compressor's mse observer defaults them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MseSearch {
    /// Number of grid steps between shrink 0 and 1.
    pub grid: u32,
    /// Largest shrink tried: candidates are `1 - i/grid` for `i < maxshrink·grid`.
    pub max_shrink: f32,
    /// Exponent of the per-group error `Σ|w - ŵ|^norm`.
    pub norm: f32,
}

impl Default for MseSearch {
    fn default() -> Self {
        Self { grid: 100, max_shrink: 0.2, norm: 2.4 }
    }
}

impl ScaleRule {
    pub const ALL: [ScaleRule; 3] = [ScaleRule::CtMinmax, ScaleRule::Absmax7, ScaleRule::Mse];

    pub fn name(self) -> &'static str {
        match self {
            ScaleRule::CtMinmax => "ct-minmax",
            ScaleRule::Absmax7 => "absmax7",
            ScaleRule::Mse => "mse",
        }
    }

    /// The `observer` value written into compressed-tensors' config for this rule.
    pub fn observer_name(self) -> &'static str {
        match self {
            ScaleRule::CtMinmax | ScaleRule::Absmax7 => "minmax",
            ScaleRule::Mse => "mse",
        }
    }
}

impl fmt::Display for ScaleRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScaleRule {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ScaleRule::ALL
            .into_iter()
            .find(|rule| rule.name() == text)
            .ok_or_else(|| format!("unknown scale rule `{text}`; known: ct-minmax, absmax7, mse"))
    }
}
