//! TOML recipes: which tensor gets which scheme. Built-in recipes are embedded from `recipes/`.

mod builtin;
mod parse;

pub use builtin::{builtin, int4_requantizing, BUILTIN_NAMES};
pub use parse::{MtpExperts, Recipe, RecipeError, Rule, Scheme, Unselected};
