//! Progress on stderr for phases that take a while: drawn only when asked for and stderr is a
//! terminal (a pipe or a log file gets no control characters), cleared when the phase ends.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar for a phase of `total` steps, labelled `label`.
pub(crate) fn bar(enabled: bool, label: &'static str, total: u64) -> ProgressBar {
    if !shown(enabled) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total).with_prefix(label);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>7} [{bar:30}] {pos}/{len} {msg} ({per_sec}, {eta} left)",
    ) {
        bar.set_style(style.progress_chars("#>-"));
    }
    bar
}

/// A spinner for a phase of unknown length; it turns on its own, so it moves while the
/// phase blocks (a probe waiting on a slow endpoint).
pub(crate) fn spinner(enabled: bool, message: impl Into<String>) -> ProgressBar {
    if !shown(enabled) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner().with_message(message.into());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

fn shown(enabled: bool) -> bool {
    enabled && std::io::stderr().is_terminal()
}
