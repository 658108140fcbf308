//! The progress a run shows on standard error while it runs.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress on stderr: a bar on a terminal, plain lines otherwise.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar when `terminal`, else plain lines.
    pub fn new(terminal: bool) -> Self {
        let bar = terminal.then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self { bar }
    }

    pub(super) fn start(&self, len: u64, msg: String) {
        match &self.bar {
            Some(bar) => {
                bar.reset();
                bar.set_length(len);
                bar.set_position(0);
                bar.set_message(msg);
            }
            None => eprintln!("bench: {msg}"),
        }
    }

    pub(super) fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    pub(super) fn note(&self, line: String) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("bench: {line}"),
        }
    }

    pub(super) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
