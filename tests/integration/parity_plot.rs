//! The parity plot's layout (issue 47): no text box overlaps another or leaves the canvas, at any number of modes
//! and layers and over any range of values. Each text's box is estimated conservatively from its font size, its
//! character count (0.6 em a character, wider than a sans-serif font's average) and its anchor.

use squeeze::eval::parity::plot::{draw, Series};
use squeeze::parity::Mode;

/// A text element's box: [left, top, right, bottom].
type TextBox = [f64; 4];

fn attribute(tag: &str, name: &str) -> Option<String> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = tag[start..].find('"')? + start;
    Some(tag[start..end].to_string())
}

/// The boxes of every `<text>` of `svg`, with their text.
fn text_boxes(svg: &str) -> Vec<(String, TextBox)> {
    let default_size: f64 = attribute(svg, "font-size").unwrap().parse().unwrap();
    let mut boxes = Vec::new();
    for piece in svg.split("<text").skip(1) {
        let (tag, rest) = piece.split_once('>').unwrap();
        let text =
            rest.split_once("</text>").unwrap().0.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">");
        let number = |name: &str| attribute(tag, name).map(|v| v.parse::<f64>().unwrap());
        let (x, y) = (number("x").unwrap(), number("y").unwrap());
        let size = number("font-size").unwrap_or(default_size);
        let width = text.chars().count() as f64 * size * 0.6;
        let (left, right) = match attribute(tag, "text-anchor").as_deref() {
            Some("middle") => (x - width / 2.0, x + width / 2.0),
            Some("end") => (x - width, x),
            _ => (x, x + width),
        };
        let (top, bottom) = (y - size, y + 0.25 * size);
        let bounds = if tag.contains("rotate(-90") {
            // Turned a quarter left about (x, y): the run goes up the page, the glyphs' height across it.
            let (along_low, along_high) = (left - x, right - x);
            [x - size, y - along_high, x + 0.25 * size, y - along_low]
        } else {
            [left, top, right, bottom]
        };
        boxes.push((text, bounds));
    }
    boxes
}

fn overlap(a: &TextBox, b: &TextBox) -> bool {
    a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3]
}

fn check(svg: &str, what: &str) {
    let width: f64 = attribute(svg, "width").unwrap().parse().unwrap();
    let height: f64 = attribute(svg, "height").unwrap().parse().unwrap();
    let boxes = text_boxes(svg);
    assert!(boxes.len() > 10, "{what}: {svg}");
    for (i, (text, a)) in boxes.iter().enumerate() {
        assert!(
            a[0] >= 0.0 && a[1] >= 0.0 && a[2] <= width && a[3] <= height,
            "{what}: `{text}` {a:?} leaves the canvas"
        );
        for (other, b) in &boxes[i + 1..] {
            assert!(!overlap(a, b), "{what}: `{text}` {a:?} overlaps `{other}` {b:?}");
        }
    }
}

#[test]
fn no_text_of_the_parity_plot_overlaps_another_at_any_number_of_modes_and_layers() {
    let modes = [Mode::Kv, Mode::Weights, Mode::Split];
    for layers in [1, 2, 3, 9, 61, 62, 100, 400] {
        for count in 1..=modes.len() {
            for (low, high) in [(1e-9f64, 1e-7f64), (1e-12, 30.0), (0.5, 0.6)] {
                let kld: Vec<f64> = (0..200).map(|i| low * (high / low).powf(i as f64 / 199.0)).collect();
                let series: Vec<Series> = modes[..count]
                    .iter()
                    .map(|&mode| Series {
                        mode,
                        kld_sorted: &kld,
                        layer_errors: (0..layers)
                            .map(|layer| (layer, low * (high / low).powf(layer as f64 / layers.max(2) as f64)))
                            .collect(),
                        mean_kld: 12345.678901,
                        same_top: 100.0,
                        ppl_ratio: 98765.4321,
                    })
                    .collect();
                let title = "glm52-nvfp4-w4a4-calibrated vs GLM-5.2-FP8 — 1024 chunks × 4096 tokens";
                check(&draw(title, &series), &format!("{count} modes, {layers} layers, values {low}..{high}"));
                let long = "a-very-long-folder-name-".repeat(8);
                check(&draw(&long, &series), &format!("a long title, {count} modes, {layers} layers"));
            }
        }
    }
}
