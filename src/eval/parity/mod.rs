//! The parity pass's report and gates (report.rs) and its plot (plot.rs); the pass itself is
//! [`super::parity_pass`], its per-mode statistics [`super::kld_stats`].

pub mod plot;
mod report;

pub use report::*;
