//! Progress on the terminal: a bar with the phase, the workload and the time left, and a line
//! per finished measurement. Without a terminal (CI logs), only the lines.

use crate::orchestrate::{left_text, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

pub struct BarProgress {
    bar: Option<ProgressBar>,
}

impl BarProgress {
    pub fn new() -> BarProgress {
        if !std::io::stderr().is_terminal() {
            return BarProgress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{bar:30}] {percent:>3}% {msg}")
                .expect("template")
                .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        BarProgress { bar: Some(bar) }
    }
}

impl Default for BarProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress for BarProgress {
    fn status(&mut self, phase: &str, what: &str, left_secs: f64, done_frac: f64) {
        if let Some(b) = &self.bar {
            b.set_position((done_frac * 1000.0) as u64);
            b.set_message(format!("{phase}: {what}  {}", left_text(left_secs)));
        }
    }

    fn line(&mut self, text: &str) {
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }

    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
