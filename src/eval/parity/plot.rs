//! `--plot FILE.svg`: per mode, the KLD distribution (share of scored tokens whose KLD exceeds x, log x axis) and
//! the per-layer relative error of the residual stream (log y axis) — one self-contained SVG, no dependency.

use std::fmt::Write;

use super::ParityReport;
use crate::parity::Mode;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 420.0;
const PANEL: f64 = 400.0;
const PLOT_HEIGHT: f64 = 300.0;
const LEFT: [f64; 2] = [70.0, 560.0];
const TOP: f64 = 60.0;

fn colour(mode: Mode) -> &'static str {
    match mode {
        Mode::Reference => "#888888",
        Mode::Kv => "#1f77b4",
        Mode::Weights => "#2ca02c",
        Mode::Split => "#d62728",
    }
}

/// log10 range covering the positive values, at least one decade.
fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let logs: Vec<f64> = values.filter(|v| *v > 0.0 && v.is_finite()).map(f64::log10).collect();
    if logs.is_empty() {
        return (-6.0, 0.0);
    }
    let low = logs.iter().copied().fold(f64::INFINITY, f64::min).floor();
    let high = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max).ceil();
    (low, if high > low { high } else { low + 1.0 })
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

pub fn render(report: &ParityReport) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{} vs {} — {} chunks × {} tokens</text>"#,
        WIDTH / 2.0,
        escape(&report.candidate),
        escape(&report.reference),
        report.chunks,
        report.ctx
    );
    let modes: Vec<_> = report.mode_reports.iter().filter(|(mode, _)| *mode != Mode::Reference).collect();

    // Left: share of tokens with KLD > x.
    let (low, high) = log_range(modes.iter().flat_map(|(_, m)| m.kld_sorted.iter().copied()));
    let x_of = |log: f64| LEFT[0] + (log - low) / (high - low) * PANEL;
    let y_share = |share: f64| TOP + (1.0 - share) * PLOT_HEIGHT;
    axes(&mut svg, 0, "KLD (nats, log)", "share of tokens with KLD > x");
    for decade in low as i64..=high as i64 {
        let x = x_of(decade as f64);
        let _ =
            writeln!(svg, r#"<text x="{x}" y="{}" text-anchor="middle">1e{decade}</text>"#, TOP + PLOT_HEIGHT + 15.0);
    }
    for tick in [0.0, 0.5, 1.0] {
        let _ =
            writeln!(svg, r#"<text x="{}" y="{}" text-anchor="end">{tick}</text>"#, LEFT[0] - 5.0, y_share(tick) + 4.0);
    }
    for (mode, report) in &modes {
        let n = report.kld_sorted.len().max(1) as f64;
        let points: Vec<String> = report
            .kld_sorted
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0.0)
            .map(|(i, v)| format!("{:.1},{:.1}", x_of(v.log10().clamp(low, high)), y_share(1.0 - (i + 1) as f64 / n)))
            .collect();
        if !points.is_empty() {
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
                colour(*mode),
                points.join(" ")
            );
        }
    }

    // Right: per-layer relative L2 of the residual stream.
    let (low_e, high_e) = log_range(modes.iter().flat_map(|(_, m)| m.layers.iter().map(|l| l.hidden_rel_l2)));
    let layers = modes.first().map_or(0, |(_, m)| m.layers.len()).max(1);
    let x_layer = |layer: usize| LEFT[1] + layer as f64 / (layers.max(2) - 1) as f64 * PANEL;
    let y_error =
        |value: f64| TOP + (1.0 - (value.log10().clamp(low_e, high_e) - low_e) / (high_e - low_e)) * PLOT_HEIGHT;
    axes(&mut svg, 1, "decoder layer", "relative L2 of the hidden state (log)");
    for decade in low_e as i64..=high_e as i64 {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">1e{decade}</text>"#,
            LEFT[1] - 5.0,
            y_error(10f64.powi(decade as i32)) + 4.0
        );
    }
    let step = (layers / 8).max(1);
    for layer in (0..layers).step_by(step) {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{layer}</text>"#,
            x_layer(layer),
            TOP + PLOT_HEIGHT + 15.0
        );
    }
    for (mode, report) in &modes {
        let points: Vec<String> = report
            .layers
            .iter()
            .filter(|l| l.hidden_rel_l2 > 0.0)
            .map(|l| format!("{:.1},{:.1}", x_layer(l.layer), y_error(l.hidden_rel_l2)))
            .collect();
        if !points.is_empty() {
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
                colour(*mode),
                points.join(" ")
            );
        }
    }

    // Legend with the headline numbers.
    for (row, (mode, m)) in modes.iter().enumerate() {
        let y = HEIGHT - 30.0 + 0.0 * row as f64;
        let x = 70.0 + row as f64 * 290.0;
        let _ = writeln!(svg, r#"<rect x="{x}" y="{}" width="14" height="4" fill="{}"/>"#, y - 4.0, colour(*mode));
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{y}">{}: KLD {:.4}, same top {:.1} %, PPL ratio {:.4}</text>"#,
            x + 20.0,
            mode.name(),
            m.summary.mean_kld,
            m.summary.same_top,
            m.summary.ppl_ratio
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn axes(svg: &mut String, panel: usize, x_label: &str, y_label: &str) {
    let left = LEFT[panel];
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{TOP}" width="{PANEL}" height="{PLOT_HEIGHT}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#,
        left + PANEL / 2.0,
        TOP + PLOT_HEIGHT + 32.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{y_label}</text>"#,
        left - 45.0,
        TOP + PLOT_HEIGHT / 2.0,
        left - 45.0,
        TOP + PLOT_HEIGHT / 2.0
    );
}
