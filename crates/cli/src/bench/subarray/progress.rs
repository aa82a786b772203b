//! Progress of the sweep on stderr.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

/// Progress of the sweep: an indicatif bar on a terminal; elsewhere (a log, a CI job) one line
/// per finished step on stderr, since indicatif draws nothing there.
pub(super) struct Progress {
    bar: ProgressBar,
    what: std::cell::RefCell<String>,
    started: Instant,
}

impl Progress {
    pub(super) fn new(steps: u64) -> Self {
        let bar = ProgressBar::new(steps);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} (eta {eta}) {msg}",
            )
            .expect("valid template"),
        );
        Self {
            bar,
            what: Default::default(),
            started: Instant::now(),
        }
    }

    /// Names the step now running.
    pub(super) fn start(&self, what: String) {
        self.bar.set_message(what.clone());
        *self.what.borrow_mut() = what;
    }

    /// The step named last finished.
    pub(super) fn done(&self) {
        self.bar.inc(1);
        if self.bar.is_hidden() {
            eprintln!(
                "[{}/{} {:.0}s] {} done",
                self.bar.position(),
                self.bar.length().unwrap_or(0),
                self.started.elapsed().as_secs_f64(),
                self.what.borrow()
            );
        }
    }

    /// A line for the user, above the bar.
    pub(super) fn say(&self, line: String) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    pub(super) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
