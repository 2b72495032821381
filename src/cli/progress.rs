//! The terminal [`Reporter`]: an indicatif bar on stderr (bytes, rate, ETA), hidden when stderr is not a terminal.

use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::progress::Reporter;

pub struct Bar {
    bar: Mutex<Option<ProgressBar>>,
    bytes: bool,
}

impl Bar {
    /// A bar counting bytes (`bytes = true`) or plain units.
    pub fn new(bytes: bool) -> Self {
        Self { bar: Mutex::new(None), bytes }
    }
}

impl Reporter for Bar {
    fn begin(&self, label: &str, total: u64) {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let template = if self.bytes {
            "{msg:>10} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}"
        } else {
            "{msg:>10} [{bar:30}] {pos}/{len} ETA {eta}"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(label.to_string());
        if let Ok(mut slot) = self.bar.lock() {
            *slot = Some(bar);
        }
    }

    fn advance(&self, units: u64) {
        if let Ok(slot) = self.bar.lock() {
            if let Some(bar) = slot.as_ref() {
                bar.inc(units);
            }
        }
    }

    fn end(&self) {
        if let Ok(mut slot) = self.bar.lock() {
            if let Some(bar) = slot.take() {
                bar.finish_and_clear();
            }
        }
    }

    fn warn(&self, message: &str) {
        match self.bar.lock().ok().and_then(|slot| slot.clone()) {
            Some(bar) => bar.suspend(|| eprintln!("warning: {message}")),
            None => eprintln!("warning: {message}"),
        }
    }
}
