//! `--plot FILE.svg`: per mode, the KLD distribution (share of scored tokens whose KLD exceeds x, log x axis) and
//! the per-layer relative error of the residual stream (log y axis) — one self-contained SVG, no dependency.

use std::fmt::Write;

use super::ParityReport;
use crate::parity::Mode;

const WIDTH: f64 = 1000.0;
const PANEL: f64 = 400.0;
const PLOT_HEIGHT: f64 = 300.0;
const LEFT: [f64; 2] = [80.0, 570.0];
const TOP: f64 = 50.0;
/// The baselines under a panel: its tick labels, then its axis title.
const TICKS_Y: f64 = TOP + PLOT_HEIGHT + 20.0;
const AXIS_TITLE_Y: f64 = TOP + PLOT_HEIGHT + 40.0;
/// The legend: one row per mode under the axis titles.
const LEGEND_Y: f64 = AXIS_TITLE_Y + 25.0;
const LEGEND_ROW: f64 = 18.0;
/// The least distance between two tick labels' anchors (the widest label, `1e-10` at 12 px, is about 36 px).
const TICK_SPACING: f64 = 45.0;

/// What the plot draws of one mode: its KLD distribution, its per-layer error and its legend's numbers.
pub struct Series<'a> {
    pub mode: Mode,
    /// Per-token KLD, ascending.
    pub kld_sorted: &'a [f64],
    /// (decoder layer, relative L2 of the hidden state).
    pub layer_errors: Vec<(usize, f64)>,
    pub mean_kld: f64,
    pub same_top: f64,
    pub ppl_ratio: f64,
}

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

/// `title` cut (with `…`) to what the canvas holds at 14 px (0.6 em a character, wider than sans-serif's average).
fn fitted(title: &str) -> String {
    let most = ((WIDTH - 20.0) / (14.0 * 0.6)) as usize;
    if title.chars().count() <= most {
        return title.to_string();
    }
    let mut cut: String = title.chars().take(most - 1).collect();
    cut.push('…');
    cut
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

pub fn render(report: &ParityReport) -> String {
    let name = |path: &str| {
        std::path::Path::new(path).file_name().map_or(path.to_string(), |n| n.to_string_lossy().into_owned())
    };
    let title = format!(
        "{} vs {} — {} chunks × {} tokens",
        name(&report.candidate),
        name(&report.reference),
        report.chunks,
        report.ctx
    );
    let series: Vec<Series> = report
        .mode_reports
        .iter()
        .filter(|(mode, _)| *mode != Mode::Reference)
        .map(|(mode, m)| Series {
            mode: *mode,
            kld_sorted: &m.kld_sorted,
            layer_errors: m.layers.iter().map(|l| (l.layer, l.hidden_rel_l2)).collect(),
            mean_kld: m.summary.mean_kld,
            same_top: m.summary.same_top,
            ppl_ratio: m.summary.ppl_ratio,
        })
        .collect();
    draw(&title, &series)
}

/// The canvas's height for `modes` legend rows.
pub fn height(modes: usize) -> f64 {
    LEGEND_Y + modes.saturating_sub(1) as f64 * LEGEND_ROW + 12.0
}

/// The SVG of `series` under `title`: two panels side by side, their tick labels and axis titles below them and
/// the legend below those, one mode per row, so that no text overlaps another at any number of modes and layers.
pub fn draw(title: &str, series: &[Series]) -> String {
    let height = height(series.len());
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        WIDTH / 2.0,
        escape(&fitted(title))
    );
    let modes: Vec<(Mode, &Series)> = series.iter().map(|s| (s.mode, s)).collect();

    // Left: share of tokens with KLD > x.
    let (low, high) = log_range(modes.iter().flat_map(|(_, m)| m.kld_sorted.iter().copied()));
    let decade_step = ((TICK_SPACING * (high - low) / PANEL).ceil() as usize).max(1);
    let x_of = |log: f64| LEFT[0] + (log - low) / (high - low) * PANEL;
    let y_share = |share: f64| TOP + (1.0 - share) * PLOT_HEIGHT;
    axes(&mut svg, 0, "KLD (nats, log)", "share of tokens with KLD > x");
    for decade in (low as i64..=high as i64).step_by(decade_step) {
        let x = x_of(decade as f64);
        let _ = writeln!(svg, r#"<text x="{x}" y="{TICKS_Y}" text-anchor="middle">1e{decade}</text>"#);
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
    let (low_e, high_e) = log_range(modes.iter().flat_map(|(_, m)| m.layer_errors.iter().map(|&(_, e)| e)));
    let layers = modes.first().map_or(0, |(_, m)| m.layer_errors.len()).max(1);
    let x_layer = |layer: usize| LEFT[1] + layer as f64 / (layers.max(2) - 1) as f64 * PANEL;
    let y_error =
        |value: f64| TOP + (1.0 - (value.log10().clamp(low_e, high_e) - low_e) / (high_e - low_e)) * PLOT_HEIGHT;
    axes(&mut svg, 1, "decoder layer", "relative L2 of the hidden state (log)");
    let decade_rows = ((16.0 * (high_e - low_e) / PLOT_HEIGHT).ceil() as usize).max(1);
    for decade in (low_e as i64..=high_e as i64).step_by(decade_rows) {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">1e{decade}</text>"#,
            LEFT[1] - 5.0,
            y_error(10f64.powi(decade as i32)) + 4.0
        );
    }
    // Every `step`-th layer, and the last when it is far enough from the one before.
    let spacing = PANEL / (layers.max(2) - 1) as f64;
    let step = ((TICK_SPACING / spacing).ceil() as usize).max(1);
    let mut ticks: Vec<usize> = (0..layers).step_by(step).collect();
    if let Some(&previous) = ticks.last() {
        if previous != layers - 1 && (layers - 1 - previous) as f64 * spacing >= TICK_SPACING {
            ticks.push(layers - 1);
        }
    }
    for layer in ticks {
        let _ = writeln!(svg, r#"<text x="{}" y="{TICKS_Y}" text-anchor="middle">{layer}</text>"#, x_layer(layer));
    }
    for (mode, report) in &modes {
        let points: Vec<String> = report
            .layer_errors
            .iter()
            .filter(|(_, error)| *error > 0.0)
            .map(|&(layer, error)| format!("{:.1},{:.1}", x_layer(layer), y_error(error)))
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

    // Legend with the headline numbers, one row per mode.
    for (row, (mode, m)) in modes.iter().enumerate() {
        let y = LEGEND_Y + row as f64 * LEGEND_ROW;
        let x = LEFT[0];
        let _ = writeln!(svg, r#"<rect x="{x}" y="{}" width="14" height="4" fill="{}"/>"#, y - 4.0, colour(*mode));
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{y}">{}: KLD {:.4}, same top {:.1} %, PPL ratio {:.4}</text>"#,
            x + 20.0,
            mode.name(),
            m.mean_kld,
            m.same_top,
            m.ppl_ratio
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
    let _ =
        writeln!(svg, r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#, left + PANEL / 2.0, AXIS_TITLE_Y);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{y_label}</text>"#,
        left - 55.0,
        TOP + PLOT_HEIGHT / 2.0,
        left - 55.0,
        TOP + PLOT_HEIGHT / 2.0
    );
}
