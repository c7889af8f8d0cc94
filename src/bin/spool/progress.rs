//! Progress bars (indicatif) on stderr for long scans, drawn only when stderr is a
//! terminal: in a pipe, a script or a test they print nothing.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps (`None`: a spinner) saying `what`; hidden off a terminal.
pub fn bar(len: Option<u64>, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = match len {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner(),
    };
    pb.set_message(what.to_owned());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}
